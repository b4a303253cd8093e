package storetest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/oncehq/once"
)

// An attempt held by hand: Client.Claim, the settling methods, and an
// attempt rebuilt in a process that did not claim it.

func attemptTests() []namedTest {
	return []namedTest{
		{name: "AttemptClaimHeartbeatSucceed", fn: testAttemptByHand},
		{name: "AttemptSettleTwiceSameAnswer", fn: testAttemptSettleTwice},
		{name: "AttemptFailReleaseUnknown", fn: testAttemptOutcomes},
		{name: "AttemptRebuiltSettles", fn: testAttemptRebuilt},
		{name: "AttemptLapsedIsFenced", fn: testAttemptLapsed},
		{name: "AttemptInDoIsDos", fn: testAttemptInDo},
		{name: "FaultAttemptSucceedReplyLost", fn: testFaultAttemptReplyLost, needs: needFaults | needLostReplies},
		{name: "FaultAttemptHeartbeatHangs", fn: testFaultAttemptHeartbeatHangs, needs: needFaults},
		{name: "FaultAttemptSucceedHangs", fn: testFaultAttemptSucceedHangs, needs: needFaults},
	}
}

func claim(t *testing.T, c *once.Client, in once.Intent) *once.Attempt {
	t.Helper()
	a, err := c.Claim(ctx(t), in)
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	return a
}

// client is a second client over s: a process that did not claim.
func client(t *testing.T, s once.Store, cfg once.Config) *once.Client {
	t.Helper()
	cfg.Store = s
	c, err := once.New(cfg)
	if err != nil {
		t.Fatalf("once.New: %v", err)
	}
	return c
}

func testAttemptByHand(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{})
	in := intent(1)
	a := claim(t, c, in)
	if a.Number != 1 || a.Key != keyOf(t, in) || a.ProviderKey == "" || a.Token == "" {
		t.Fatalf("claimed attempt = %+v", a)
	}
	if d := time.Until(a.Deadline()); d <= 0 || d > once.DefaultLease {
		t.Fatalf("Deadline in %v; want within the lease", d)
	}
	if st := mustGet(t, s, a.Key); st.Status != once.StatusInFlight || st.Attempt != 1 {
		t.Fatalf("row after Claim = %s attempt %d; want in flight, attempt 1", st.Status, st.Attempt)
	}
	// A duplicate meets the claim and runs nothing.
	var effects counter
	if _, err := once.Do(ctx(t), c, in, effects.fn("dup")); !errors.Is(err, once.ErrInFlight) || effects.n.Load() != 0 {
		t.Fatalf("duplicate Do while held = %v (ran %d); want ErrInFlight", err, effects.n.Load())
	}
	before := a.Deadline()
	time.Sleep(5 * time.Millisecond)
	if err := a.Heartbeat(ctx(t)); err != nil {
		t.Fatalf("Heartbeat: %v", err)
	}
	if !a.Deadline().After(before) {
		t.Fatalf("Deadline %v did not move on from %v after a heartbeat", a.Deadline(), before)
	}
	if err := a.Succeed(ctx(t), receipt{ID: "msg-1", Amount: 42}); err != nil {
		t.Fatalf("Succeed: %v", err)
	}
	res, err := once.Do(ctx(t), c, in, func(context.Context, once.Attempt) (receipt, error) {
		effects.n.Add(1)
		return receipt{}, nil
	})
	if err != nil || !res.Replayed || res.Value.ID != "msg-1" || res.Value.Amount != 42 || effects.n.Load() != 0 {
		t.Fatalf("Do after Succeed = %+v, %v; want the stored result replayed", res, err)
	}
	_, err = c.Claim(ctx(t), in)
	var rep *once.ReplayedError
	if !errors.As(err, &rep) || rep.Attempt != 1 {
		t.Fatalf("Claim after Succeed = %v; want a *ReplayedError", err)
	}
	var got receipt
	if err := rep.Decode(&got); err != nil || got.ID != "msg-1" {
		t.Fatalf("Decode = %+v, %v", got, err)
	}
	if err := a.Heartbeat(ctx(t)); !errors.Is(err, once.ErrFenced) {
		t.Fatalf("Heartbeat after Succeed = %v; want ErrFenced: the attempt is over", err)
	}
	if tr := trail(t, s, a.Key); tr != "claimed,succeeded" {
		t.Fatalf("trail %s", tr)
	}
}

func testAttemptSettleTwice(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{})
	a := claim(t, c, intent(1))
	for i := range 2 {
		if err := a.Succeed(ctx(t), "v"); err != nil {
			t.Fatalf("Succeed #%d: %v; want the same answer", i+1, err)
		}
	}
	if err := a.Fail(ctx(t), errors.New("no")); !errors.Is(err, once.ErrConflict) {
		t.Fatalf("Fail after Succeed = %v; want ErrConflict", err)
	}
	// A copy of the attempt shares its claim.
	cp := *a
	if err := cp.Succeed(ctx(t), "v"); err != nil {
		t.Fatalf("Succeed on a copy: %v", err)
	}
	if tr := trail(t, s, a.Key); tr != "claimed,succeeded" {
		t.Fatalf("trail %s; want one outcome", tr)
	}
}

func testAttemptOutcomes(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{})

	failed := claim(t, c, intent(1))
	if err := failed.Fail(ctx(t), errors.New("card declined")); err != nil {
		t.Fatalf("Fail: %v", err)
	}
	var fe *once.FailedError
	if _, err := c.Claim(ctx(t), intent(1)); !errors.As(err, &fe) || !fe.Replayed || fe.Message != "card declined" {
		t.Fatalf("Claim after Fail = %v; want the stored failure", err)
	}

	released := claim(t, c, intent(2))
	if err := released.Release(ctx(t), errors.New("provider 503")); err != nil {
		t.Fatalf("Release: %v", err)
	}
	next := claim(t, c, intent(2))
	if next.Number != 2 || next.ProviderKey != released.ProviderKey || next.Token == released.Token {
		t.Fatalf("claim after Release = %+v; want attempt 2 with the same provider key", next)
	}
	if err := released.Succeed(ctx(t), "late"); !errors.Is(err, once.ErrConflict) {
		t.Fatalf("Succeed on the released attempt = %v; want ErrConflict", err)
	}
	if err := next.Succeed(ctx(t), "ok"); err != nil {
		t.Fatalf("Succeed attempt 2: %v", err)
	}

	unknown := claim(t, c, intent(3))
	if err := unknown.Note(ctx(t), "sent request req-7"); err != nil {
		t.Fatalf("Note: %v", err)
	}
	if err := unknown.Unknown(ctx(t), once.Permanent(errors.New("timeout reading the reply"))); err != nil {
		t.Fatalf("Unknown: %v", err)
	}
	// AskPerson by default: review, whatever the error wraps, with the
	// note for the person.
	row := mustGet(t, s, unknown.Key)
	if row.Status != once.StatusReview || !strings.Contains(row.Error, "timeout reading the reply") || !strings.Contains(row.Error, "req-7") {
		t.Fatalf("row after Unknown = %s %q; want review with the error and the note", row.Status, row.Error)
	}
}

func testAttemptRebuilt(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{})
	other := client(t, s, once.Config{})
	in := intent(1)
	a := claim(t, c, in)

	for _, bad := range []struct {
		name   string
		number int
		token  string
	}{
		{"wrong token", a.Number, otherToken(a.Token)},
		{"wrong number", a.Number + 1, a.Token},
	} {
		_, err := other.Attempt(ctx(t), a.Key, bad.number, bad.token)
		if !errors.Is(err, once.ErrFenced) || !strings.Contains(err.Error(), "cannot be rebuilt") {
			t.Fatalf("Attempt with %s = %v; want ErrFenced, saying it cannot be rebuilt", bad.name, err)
		}
	}
	for _, bad := range []struct {
		key    once.Key
		number int
		token  string
	}{{"", 1, a.Token}, {a.Key, 0, a.Token}, {a.Key, 1, ""}, {"k\n", 1, a.Token},
		{a.Key, 1, strings.Repeat("A", 65)}, {once.Key(strings.Repeat("a", 1<<20)), 1, a.Token}} {
		if _, err := other.Attempt(ctx(t), bad.key, bad.number, bad.token); !errors.Is(err, once.ErrInvalidIntent) {
			t.Fatalf("Attempt(%.40q, %d, %.40q) = %v; want ErrInvalidIntent", bad.key, bad.number, bad.token, err)
		}
	}
	if _, err := other.Attempt(ctx(t), keyOf(t, intent(9)), 1, a.Token); !errors.Is(err, once.ErrNotFound) {
		t.Fatalf("Attempt of no action = %v; want ErrNotFound", err)
	}

	r, err := other.Attempt(ctx(t), a.Key, a.Number, a.Token)
	if err != nil {
		t.Fatalf("Attempt: %v", err)
	}
	if r.Key != a.Key || r.Number != 1 || r.ProviderKey != a.ProviderKey || r.Intent.Kind != in.Kind {
		t.Fatalf("rebuilt = %+v", r)
	}
	if err := r.Heartbeat(ctx(t)); err != nil {
		t.Fatalf("Heartbeat of the rebuilt attempt: %v", err)
	}
	if err := r.Succeed(ctx(t), "from elsewhere"); err != nil {
		t.Fatalf("Succeed of the rebuilt attempt: %v", err)
	}
	// The claimer, and a second rebuild, get the same answer.
	if err := a.Succeed(ctx(t), "from elsewhere"); err != nil {
		t.Fatalf("Succeed by the claimer after the rebuilt one: %v", err)
	}
	again, err := other.Attempt(ctx(t), a.Key, a.Number, a.Token)
	if err != nil {
		t.Fatalf("Attempt after it settled: %v", err)
	}
	if err := again.Succeed(ctx(t), "from elsewhere"); err != nil {
		t.Fatalf("Succeed again on a new rebuild: %v", err)
	}
	if err := again.Release(ctx(t), errors.New("no")); !errors.Is(err, once.ErrConflict) {
		t.Fatalf("Release after Succeed on a rebuild = %v; want ErrConflict", err)
	}
	res, err := once.Do(ctx(t), c, in, func(context.Context, once.Attempt) (string, error) { return "ran", nil })
	if err != nil || !res.Replayed || res.Value != "from elsewhere" {
		t.Fatalf("Do = %+v, %v; want the rebuilt attempt's result", res, err)
	}
	if tr := trail(t, s, a.Key); tr != "claimed,succeeded" {
		t.Fatalf("trail %s; want one outcome", tr)
	}
}

// The holder pauses past its lease, recovery takes the action over, and
// the holder carries on: its heartbeat and outcome are refused.
func testAttemptLapsed(t *testing.T, h Harness) {
	cfg := once.Config{Default: once.KindPolicy{Lease: time.Second, Recovery: once.RetryWithProviderKey}}
	s, c, _ := setup(t, h, cfg)
	other := client(t, s, cfg)
	in := intent(1)
	a := claim(t, c, in)
	// Paused past the stored lease (the lease and its margin).
	time.Sleep(cfg.Default.Lease * 3 / 2)
	res, err := once.Do(ctx(t), other, in, func(_ context.Context, b once.Attempt) (string, error) {
		if b.Number != 2 || b.ProviderKey != a.ProviderKey {
			t.Errorf("takeover attempt = %+v", b)
		}
		return "second", nil
	})
	if err != nil || res.Value != "second" || res.Attempt != 2 {
		t.Fatalf("takeover Do = %+v, %v", res, err)
	}
	if err := a.Heartbeat(ctx(t)); !errors.Is(err, once.ErrFenced) {
		t.Fatalf("Heartbeat after the takeover = %v; want ErrFenced", err)
	}
	if err := a.Succeed(ctx(t), "first"); !errors.Is(err, once.ErrFenced) {
		t.Fatalf("Succeed after the takeover = %v; want ErrFenced", err)
	}
	row := mustGet(t, s, a.Key)
	if row.Attempt != 2 || string(row.Result) != `"second"` {
		t.Fatalf("row = attempt %d result %s; want the takeover's", row.Attempt, row.Result)
	}
	if tr := trail(t, s, a.Key); !strings.Contains(tr, "refused") {
		t.Fatalf("trail %s; want the late outcome refused in it", tr)
	}
}

// In Do, the effect's outcome is what it returns: the settling methods
// refuse, and the outcome is recorded once.
func testAttemptInDo(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{})
	res, err := once.Do(ctx(t), c, intent(1), func(ctx context.Context, a once.Attempt) (string, error) {
		if err := a.Fail(ctx, errors.New("no")); err == nil {
			t.Error("Fail inside Do succeeded; want it refused")
		}
		if err := a.Heartbeat(ctx); err != nil {
			t.Errorf("Heartbeat inside Do: %v", err)
		}
		return "done", nil
	})
	if err != nil || res.Value != "done" {
		t.Fatalf("Do = %+v, %v", res, err)
	}
	if tr := trail(t, s, res.Key); tr != "claimed,succeeded" {
		t.Fatalf("trail %s", tr)
	}
	if err := (once.Attempt{Key: res.Key, Number: 1}).Succeed(ctx(t), "x"); err == nil {
		t.Fatal("Succeed on an attempt made by hand succeeded; want it refused")
	}
}

// otherToken is tok with its first character changed.
func otherToken(tok string) string {
	if tok[0] == 'A' {
		return "B" + tok[1:]
	}
	return "A" + tok[1:]
}

// Succeed commits and its reply is lost: the holder reads the row back
// by the outcome's token and reports it recorded; settling again gives
// the same answer, and the trail holds one outcome.
func testFaultAttemptReplyLost(t *testing.T, h Harness) {
	c, direct, s, f := faultClients(t, h, once.Config{})
	in := intent(1)
	a := claim(t, c, in)
	lost := f.LoseReply(h.Markers.Transition, false)
	if err := a.Succeed(ctx(t), "250 queued"); err != nil {
		t.Fatalf("Succeed with its reply lost: %v; want it read back as recorded", err)
	}
	select {
	case <-lost:
	default:
		t.Fatal("the outcome's reply was never lost")
	}
	r, err := direct.Attempt(ctx(t), a.Key, a.Number, a.Token)
	if err != nil {
		t.Fatalf("Attempt: %v", err)
	}
	if err := r.Succeed(ctx(t), "250 queued"); err != nil {
		t.Fatalf("Succeed again on a rebuild: %v", err)
	}
	if tr := trail(t, s, a.Key); tr != "claimed,succeeded" {
		t.Fatalf("trail %s; want the outcome recorded once", tr)
	}
}

// The holder's connection hangs instead of failing: Heartbeat gives up
// once its tries outlast the attempt's deadline, saying the lease
// lapsed, rather than hang with it (or until the test's context ends); once the partition heals, nothing else took the action, and
// a heartbeat renews the claim.
func testFaultAttemptHeartbeatHangs(t *testing.T, h Harness) {
	cfg := once.Config{Default: once.KindPolicy{Lease: 2 * time.Second}}
	c, _, s, f := faultClients(t, h, cfg)
	a := claim(t, c, intent(1))
	f.Hang(true)
	err := a.Heartbeat(ctx(t))
	f.Hang(false)
	var fe *once.FencedError
	if !errors.As(err, &fe) || !fe.Lapsed {
		t.Fatalf("Heartbeat over a hung connection = %v; want a *FencedError saying the lease lapsed", err)
	}
	if err := a.Heartbeat(ctx(t)); err != nil {
		t.Fatalf("Heartbeat after the partition healed: %v", err)
	}
	if st := mustGet(t, s, a.Key); st.Status != once.StatusInFlight || st.Attempt != 1 {
		t.Fatalf("row = %s attempt %d; want the claim still held", st.Status, st.Attempt)
	}
}

// The holder's connection hangs as it settles: Succeed gives up after
// RecordTimeout with a *RecordError (the claim stays in flight), not
// hang with the connection; once the partition heals, settling again
// records the outcome once.
func testFaultAttemptSucceedHangs(t *testing.T, h Harness) {
	cfg := once.Config{RecordTimeout: 2 * time.Second}
	c, _, s, f := faultClients(t, h, cfg)
	a := claim(t, c, intent(1))
	f.Hang(true)
	err := a.Succeed(ctx(t), "250 queued")
	f.Hang(false)
	if !errors.Is(err, once.ErrNotRecorded) {
		t.Fatalf("Succeed over a hung connection = %v; want ErrNotRecorded", err)
	}
	if err := a.Succeed(ctx(t), "250 queued"); err != nil {
		t.Fatalf("Succeed after the partition healed: %v", err)
	}
	if st := mustGet(t, s, a.Key); st.Status != once.StatusSucceeded || string(st.Result) != `"250 queued"` {
		t.Fatalf("row = %s %s; want the success recorded", st.Status, st.Result)
	}
	if tr := trail(t, s, a.Key); tr != "claimed,succeeded" {
		t.Fatalf("trail %s; want the outcome recorded once", tr)
	}
}
