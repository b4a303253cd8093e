package storetest

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncehq/once"
)

// A named claim (ClaimID): the same claim made again, as a server does
// for a remote caller whose reply was lost, is answered with the
// attempt it won.

func claimIDTests() []namedTest {
	return []namedTest{
		{name: "ClaimIDAnswersTheSameClaimAgain", fn: testClaimIDAgain},
		{name: "ClaimIDAwaitingApprovalAnnouncedOnce", fn: testClaimIDAwaiting},
		{name: "ClaimIDRefusedWhereItCannotHold", fn: testClaimIDRefused},
		{name: "ClaimIDTakeoverAnsweredAgain", fn: testClaimIDTakeover},
		{name: "ClaimIDCarriedOutWhenItsCallerLeft", fn: testClaimIDCallerLeft},
		{name: "FaultClaimIDReplyLostThenAskedAgain", fn: testFaultClaimIDReplyLost, needs: needFaults | needLostReplies},
	}
}

const (
	claimIDA = "client-made-write-token-0001"
	claimIDB = "client-made-write-token-0002"
)

// The first claim's answer never reaches its caller, who asks again
// with the same name, late in the lease: the answer is the same
// attempt and token, with the lease renewed from the second asking,
// not the first. Another name meets the claim in flight; the attempt
// settles once; a claim after that gets the stored result.
func testClaimIDAgain(t *testing.T, h Harness) {
	cfg := once.Config{Default: once.KindPolicy{Lease: 3 * time.Second}}
	s, c, _ := setup(t, h, cfg)
	in := intent(1)
	first, err := c.Claim(ctx(t), in, once.ClaimID(claimIDA))
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	lease := mustGet(t, s, first.Key).LeaseUntil
	time.Sleep(2 * time.Second) // past the third of the lease at which a claim is renewed
	again, err := c.Claim(ctx(t), in, once.ClaimID(claimIDA))
	if err != nil {
		t.Fatalf("the same claim made again = %v; want the attempt it won", err)
	}
	if again.Number != first.Number || again.Token != first.Token || again.Key != first.Key {
		t.Fatalf("the same claim made again = attempt %d token %q; want attempt %d token %q", again.Number, again.Token, first.Number, first.Token)
	}
	if renewed := mustGet(t, s, first.Key).LeaseUntil; !renewed.After(lease) {
		t.Fatalf("lease until %v after the claim made again; want it renewed past %v", renewed, lease)
	}
	if d := time.Until(again.Deadline()); d < time.Second {
		t.Fatalf("the claim made again has %v left; want its lease counted from its own asking", d)
	}
	if _, err := c.Claim(ctx(t), in, once.ClaimID(claimIDB)); !errors.Is(err, once.ErrInFlight) {
		t.Fatalf("a claim of another name = %v; want ErrInFlight", err)
	}
	if err := again.Succeed(ctx(t), "250 queued"); err != nil {
		t.Fatalf("Succeed: %v", err)
	}
	if err := first.Succeed(ctx(t), "250 queued"); err != nil {
		t.Fatalf("Succeed through the first answer: %v; want the same answer", err)
	}
	var rep *once.ReplayedError
	if _, err := c.Claim(ctx(t), in, once.ClaimID(claimIDA)); !errors.As(err, &rep) {
		t.Fatalf("the claim made again after it settled = %v; want the stored result", err)
	}
	if tr := trail(t, s, first.Key); tr != "claimed,succeeded" {
		t.Fatalf("trail %s; want one claim, one outcome", tr)
	}
}

// A named claim that took a lapsed attempt over, made again (its first
// answer lost), is answered with the attempt the takeover made, not
// refused as another's claim in flight: that would leave attempt 2,
// which never ran, to lapse and be recovered as if it might have.
func testClaimIDTakeover(t *testing.T, h Harness) {
	cfg := once.Config{Default: once.KindPolicy{Lease: time.Second, Recovery: once.RetryWithProviderKey}}
	s, c, _ := setup(t, h, cfg)
	in := intent(1)
	dead, err := c.Claim(ctx(t), in)
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	time.Sleep(1500 * time.Millisecond) // its worker died: the lease lapses
	took, err := c.Claim(ctx(t), in, once.ClaimID(claimIDA))
	if err != nil {
		t.Fatalf("the named claim of a lapsed attempt = %v; want a takeover", err)
	}
	if took.Number != dead.Number+1 {
		t.Fatalf("the takeover is attempt %d; want %d", took.Number, dead.Number+1)
	}
	again, err := c.Claim(ctx(t), in, once.ClaimID(claimIDA))
	if err != nil {
		t.Fatalf("the takeover's claim made again = %v; want the attempt it won", err)
	}
	if again.Number != took.Number || again.Token != took.Token {
		t.Fatalf("the takeover's claim made again = attempt %d token %q; want attempt %d token %q", again.Number, again.Token, took.Number, took.Token)
	}
	if _, err := c.Claim(ctx(t), in, once.ClaimID(claimIDB)); !errors.Is(err, once.ErrInFlight) {
		t.Fatalf("a claim of another name = %v; want ErrInFlight", err)
	}
	if err := again.Succeed(ctx(t), "250 queued"); err != nil {
		t.Fatalf("Succeed: %v", err)
	}
	if err := dead.Succeed(ctx(t), "late"); !errors.Is(err, once.ErrFenced) {
		t.Fatalf("the dead attempt's late outcome = %v; want fenced", err)
	}
	if got := mustGet(t, s, took.Key); got.Status != once.StatusSucceeded || got.Attempt != took.Number {
		t.Fatalf("row %s at attempt %d; want succeeded at %d", got.Status, got.Attempt, took.Number)
	}
}

// A named claim whose caller has gone (its context ended) is carried
// out and kept, not given back: the claim made again, which may be
// answering it already, gets the attempt. A wait ends with the caller.
func testClaimIDCallerLeft(t *testing.T, h Harness) {
	cfg := once.Config{Default: once.KindPolicy{Lease: 5 * time.Second}}
	s, c, _ := setup(t, h, cfg)
	gone, cancel := context.WithCancel(ctx(t))
	cancel()
	in := intent(1)
	first, err := c.Claim(gone, in, once.ClaimID(claimIDA))
	if err != nil {
		t.Fatalf("a named claim whose caller left = %v; want it carried out", err)
	}
	again, err := c.Claim(ctx(t), in, once.ClaimID(claimIDA))
	if err != nil || again.Number != first.Number || again.Token != first.Token {
		t.Fatalf("the claim made again = %v, %v; want attempt %d", again, err, first.Number)
	}
	if got := mustGet(t, s, first.Key); got.Status != once.StatusInFlight || got.Attempt != 1 {
		t.Fatalf("row %s at attempt %d; want in flight at 1, kept", got.Status, got.Attempt)
	}
	// Another named claim that would wait, its caller gone, answers at
	// once and claims nothing.
	if _, err := c.Claim(gone, in, once.ClaimID(claimIDB), once.WaitFor(10*time.Second)); !errors.Is(err, once.ErrInFlight) {
		t.Fatalf("a waiting named claim whose caller left = %v; want ErrInFlight", err)
	}
	if err := again.Succeed(ctx(t), "250 queued"); err != nil {
		t.Fatal(err)
	}
	if tr := trail(t, s, first.Key); tr != "claimed,succeeded" {
		t.Fatalf("trail %s; want one claim, one outcome", tr)
	}
}

// A gated claim made again answers that the action awaits approval,
// and the wait is announced once.
func testClaimIDAwaiting(t *testing.T, h Harness) {
	var announced atomic.Int64
	cfg := gated(0)
	cfg.Hooks.OnAwaitingApproval = func(context.Context, once.Action) { announced.Add(1) }
	s, c, _ := setup(t, h, cfg)
	in := intent(1)
	for i := range 2 {
		if _, err := c.Claim(ctx(t), in, once.ClaimID(claimIDA)); !errors.Is(err, once.ErrAwaitingApproval) {
			t.Fatalf("gated claim #%d = %v; want ErrAwaitingApproval", i+1, err)
		}
	}
	if announced.Load() != 1 {
		t.Fatalf("announced %d times; want once", announced.Load())
	}
	if a := mustGet(t, s, keyOf(t, in)); a.Status != once.StatusAwaitingApproval || a.Attempt != 1 {
		t.Fatalf("row %s attempt %d", a.Status, a.Attempt)
	}
}

// A name is refused where it cannot hold: too short to be hard to
// guess, and in Do and DoTx, which have their claim's answer; nothing
// is claimed.
func testClaimIDRefused(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{})
	in := intent(1)
	if _, err := c.Claim(ctx(t), in, once.ClaimID("short")); !errors.Is(err, once.ErrInvalidIntent) {
		t.Fatalf("ClaimID(short) = %v; want ErrInvalidIntent", err)
	}
	var runs counter
	if _, err := once.Do(ctx(t), c, in, runs.fn("sent"), once.ClaimID(claimIDA)); !errors.Is(err, once.ErrInvalidIntent) || runs.n.Load() != 0 {
		t.Fatalf("Do with ClaimID = %v (ran %d); want ErrInvalidIntent", err, runs.n.Load())
	}
	if _, err := s.Get(ctx(t), keyOf(t, in)); !errors.Is(err, once.ErrNotFound) {
		t.Fatalf("a refused claim wrote a row: %v", err)
	}
}

// The named claim commits and its reply is lost: Claim reads it back as
// its own; asked again under the name, it is the same attempt.
func testFaultClaimIDReplyLost(t *testing.T, h Harness) {
	c, direct, s, f := faultClients(t, h, once.Config{})
	in := intent(1)
	lost := f.LoseReply(h.Markers.Claim, false)
	a, err := c.Claim(ctx(t), in, once.ClaimID(claimIDA))
	if err != nil {
		t.Fatalf("Claim with its reply lost: %v; want it read back as this claim's", err)
	}
	select {
	case <-lost:
	default:
		t.Fatal("the claim's reply was never lost")
	}
	again, err := direct.Claim(ctx(t), in, once.ClaimID(claimIDA))
	if err != nil || again.Number != a.Number || again.Token != a.Token {
		t.Fatalf("the same claim made again in another process = %+v, %v; want attempt %d", again, err, a.Number)
	}
	if err := again.Succeed(ctx(t), "ok"); err != nil {
		t.Fatalf("Succeed: %v", err)
	}
	if tr := trail(t, s, a.Key); tr != "claimed,succeeded" {
		t.Fatalf("trail %s", tr)
	}
}
