package storetest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncehq/once"
)

// Approval gates (KindPolicy.Approval): an action that waits for a
// person before it runs, exactly once after.

func approvalTests() []namedTest {
	return []namedTest{
		{name: "ApprovalWaitsThenRunsOnce", fn: testApprovalWaitsThenRunsOnce},
		{name: "ApprovalDuplicatesAnnounceNothing", fn: testApprovalDuplicatesAnnounceNothing},
		{name: "ApprovalWhenDecidesPerIntent", fn: testApprovalWhen},
		{name: "ApprovalRacingDeliveriesRunOnce", fn: testApprovalRacingDeliveries},
		{name: "ApprovalRacingDecisionsOneApplies", fn: testApprovalRacingDecisions},
		{name: "ApprovalAfterExpiryRefused", fn: testApprovalAfterExpiry, serial: true},
		{name: "ApprovalExpiryToReview", fn: testApprovalExpiryToReview, serial: true},
		{name: "ApprovalRejectionReplayed", fn: testApprovalRejectionReplayed},
		{name: "ApprovalChangedPayloadRefused", fn: testApprovalChangedPayload},
		{name: "ApprovalStalePageRefused", fn: testApprovalStalePage},
		{name: "ApprovalDroppedJobRedriven", fn: testApprovalDroppedJobRedriven, serial: true},
		{name: "ApprovalWaitForAcrossApproval", fn: testApprovalWaitFor},
		{name: "ApprovalTrailSaysWhoAndHow", fn: testApprovalTrail},
		{name: "ApprovalInvalidDecisionsRefusedBeforeIO", fn: testApprovalInvalid},
		{name: "ApprovalRaceProcesses", fn: testApprovalRaceProcesses, needs: needProcesses},
		{name: "ApprovalDecisionRaceProcesses", fn: testApprovalDecisionRaceProcesses, needs: needProcesses},
		{name: "FaultApprovalReplyLost", fn: testFaultApprovalReplyLost, needs: needFaults | needLostReplies},
		{name: "FaultApprovalClaimReplyLost", fn: testFaultApprovalClaimReplyLost, needs: needFaults | needLostReplies},
		{name: "FaultApprovalHungThenExpired", fn: testFaultApprovalHung, needs: needFaults | needPartition, serial: true},
		{name: "FaultRejectionReplyLost", fn: testFaultRejectionReplyLost, needs: needFaults | needLostReplies},
		{name: "FaultExpiryReplyLost", fn: testFaultExpiryReplyLost, needs: needFaults | needLostReplies, serial: true},
		{name: "FaultApprovedClaimReplyLost", fn: testFaultApprovedClaimReplyLost, needs: needFaults | needLostReplies},
		{name: "FaultApprovalClaimHung", fn: testFaultApprovalClaimHung, needs: needFaults | needPartition, serial: true},
		{name: "ApprovedClaimPausedPastLeaseIsFenced", fn: testApprovedClaimPausedPastLease, serial: true},
	}
}

// reaper is a reaper over c, with the defaults.
func reaper(t *testing.T, c *once.Client) *once.Reaper {
	t.Helper()
	r, err := once.NewReaper(c, once.ReaperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// gated is a config whose send_email kind always asks for approval, with
// the given expiry (zero: the default).
func gated(expiry time.Duration) once.Config {
	return once.Config{Kinds: map[string]once.KindPolicy{"send_email": {Approval: once.ApprovalPolicy{Always: true, Expiry: expiry}}}}
}

// awaiting claims in through c and fails unless it now awaits approval.
func awaiting(t *testing.T, c *once.Client, in once.Intent, runs *counter) *once.AwaitingApprovalError {
	t.Helper()
	_, err := once.Do(ctx(t), c, in, runs.fn("sent"))
	var w *once.AwaitingApprovalError
	if !errors.As(err, &w) || !errors.Is(err, once.ErrAwaitingApproval) {
		t.Fatalf("Do of a kind that asks for approval = %v; want *AwaitingApprovalError", err)
	}
	if runs.n.Load() != 0 {
		t.Fatalf("the effect ran %d times before anyone approved it", runs.n.Load())
	}
	return w
}

func testApprovalWaitsThenRunsOnce(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, gated(time.Hour))
	in := intent(1)
	var runs counter
	w := awaiting(t, c, in, &runs)
	a := mustGet(t, s, keyOf(t, in))
	if a.Status != once.StatusAwaitingApproval || a.Attempt != 1 || a.OnExpiry != once.StatusFailed {
		t.Fatalf("row %s attempt %d on expiry %q; want awaiting_approval, attempt 1, failing on expiry", a.Status, a.Attempt, a.OnExpiry)
	}
	if d := a.LeaseUntil.Sub(a.CreatedAt); d < 59*time.Minute || d > 61*time.Minute || !w.Expires.Equal(a.LeaseUntil) || w.Kind != in.Kind {
		t.Fatalf("the wait expires %v after its claim (error says %v, kind %q); want an hour, as the kind asks", d, w.Expires, w.Kind)
	}
	if d := once.Dispose(w); d.Action != once.JobRetry || d.After <= 0 {
		t.Errorf("Dispose(awaiting) = %+v; want a retry after a while, since the kind has no Redrive hook", d)
	}
	got, err := c.Approve(ctx(t), a.Key, once.Approval{By: "ada", Note: "checked the amount", Attempt: 1, Fingerprint: a.Fingerprint, Via: "console"})
	if err != nil || got.Status != once.StatusApproved || got.ResolvedBy != "ada" {
		t.Fatalf("Approve = %s by %q, %v; want approved by ada", got.Status, got.ResolvedBy, err)
	}
	res, err := once.Do(ctx(t), c, in, runs.fn("sent"))
	if err != nil || res.Value != "sent" || res.Replayed || res.Attempt != 2 || runs.n.Load() != 1 {
		t.Fatalf("Do after approval = %+v, %v (ran %d); want it run once, as attempt 2", res, err, runs.n.Load())
	}
	res, err = once.Do(ctx(t), c, in, runs.fn("again"))
	if err != nil || !res.Replayed || res.Value != "sent" || runs.n.Load() != 1 {
		t.Fatalf("a duplicate after the run = %+v, %v (ran %d); want the result replayed", res, err, runs.n.Load())
	}
}

// The claim that writes the wait announces it, once: a duplicate, in
// this process or another, is told the same and tells nobody.
func testApprovalDuplicatesAnnounceNothing(t *testing.T, h Harness) {
	var announced, observed atomic.Int64
	cfg := gated(0)
	cfg.Hooks = once.Hooks{
		OnAwaitingApproval: func(_ context.Context, a once.Action) {
			if a.Status == once.StatusAwaitingApproval && len(a.Payload) > 0 {
				announced.Add(1)
			}
		},
		OnEvent: func(_ context.Context, o once.Observation) {
			if o.Type == once.EventAwaitingApproval {
				observed.Add(1)
			}
		},
	}
	s, c, _ := setup(t, h, cfg)
	other := client(t, s, cfg)
	in := intent(1)
	var runs counter
	awaiting(t, c, in, &runs)
	for range 3 {
		awaiting(t, c, in, &runs)
		awaiting(t, other, in, &runs)
	}
	if announced.Load() != 1 || observed.Load() != 1 {
		t.Fatalf("the wait was announced %d times (observed %d) over 7 deliveries; want once, by the claim that wrote it", announced.Load(), observed.Load())
	}
	if a := mustGet(t, s, keyOf(t, in)); a.Attempt != 1 {
		t.Fatalf("duplicates moved the row to attempt %d", a.Attempt)
	}
}

// ApprovalPolicy.When asks only for the intents it names; a When that
// panics fails the call, with nothing claimed.
func testApprovalWhen(t *testing.T, h Harness) {
	cfg := once.Config{Kinds: map[string]once.KindPolicy{"charge": {Approval: once.ApprovalPolicy{When: func(in once.Intent) bool {
		p, _ := in.Payload.(map[string]int)
		if p["cents"] < 0 {
			panic("negative amount")
		}
		return p["cents"] > 100_000
	}}}}}
	s, c, _ := setup(t, h, cfg)
	small := once.Intent{Run: "r", Step: 1, Kind: "charge", Target: "cus_1", Payload: map[string]int{"cents": 500}}
	large := once.Intent{Run: "r", Step: 2, Kind: "charge", Target: "cus_1", Payload: map[string]int{"cents": 500_000}}
	bad := once.Intent{Run: "r", Step: 3, Kind: "charge", Target: "cus_1", Payload: map[string]int{"cents": -1}}
	var runs counter
	if res, err := once.Do(ctx(t), c, small, runs.fn("charged")); err != nil || res.Value != "charged" {
		t.Fatalf("a charge under the limit = %+v, %v; want it run at once", res, err)
	}
	if _, err := once.Do(ctx(t), c, large, runs.fn("charged")); !errors.Is(err, once.ErrAwaitingApproval) {
		t.Fatalf("a charge over the limit = %v; want it waiting for approval", err)
	}
	if _, err := once.Do(ctx(t), c, bad, runs.fn("charged")); err == nil || !strings.Contains(err.Error(), "panicked") {
		t.Fatalf("a charge whose When panics = %v; want the call failed, saying so", err)
	}
	if _, err := s.Get(ctx(t), keyOf(t, bad)); !isNotFound(err) {
		t.Fatalf("Get of the intent whose When panicked = %v; want nothing claimed", err)
	}
	if runs.n.Load() != 1 {
		t.Fatalf("ran %d charges; want the one under the limit", runs.n.Load())
	}
}

// Deliveries racing after one approval, on clients of their own: the
// effect runs once, and every other gets the result or the claim.
func testApprovalRacingDeliveries(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, gated(0))
	in := intent(1)
	var runs counter
	awaiting(t, c, in, &runs)
	if _, err := c.Approve(ctx(t), keyOf(t, in), once.Approval{By: "ada"}); err != nil {
		t.Fatal(err)
	}
	const n = 8
	var wg sync.WaitGroup
	var ran, other atomic.Int64
	for range n {
		wc := client(t, s, gated(0))
		wg.Go(func() {
			res, err := once.Do(ctx(t), wc, in, func(context.Context, once.Attempt) (string, error) {
				runs.n.Add(1)
				time.Sleep(20 * time.Millisecond)
				return "sent", nil
			})
			switch {
			case err == nil && !res.Replayed:
				ran.Add(1)
			case err == nil || errors.Is(err, once.ErrInFlight):
				other.Add(1)
			default:
				t.Errorf("a racing delivery = %v", err)
			}
		})
	}
	wg.Wait()
	if runs.n.Load() != 1 || ran.Load() != 1 || other.Load() != n-1 {
		t.Fatalf("%d deliveries after one approval: the effect ran %d times (%d said they ran it, %d replayed or met the claim); want once", n, runs.n.Load(), ran.Load(), other.Load())
	}
}

// Two approvals and a rejection race: one decision applies; each other
// is refused, told who decided.
func testApprovalRacingDecisions(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, gated(0))
	in := intent(1)
	var runs counter
	awaiting(t, c, in, &runs)
	k := keyOf(t, in)
	people := []string{"ada", "grace", "linus", "barbara"}
	errs := make([]error, len(people))
	var wg sync.WaitGroup
	for i, who := range people {
		dc := client(t, s, gated(0))
		wg.Go(func() {
			d := once.Approval{By: who, Note: "looked at it", Attempt: 1}
			if i%2 == 1 {
				_, errs[i] = dc.Reject(ctx(t), k, d)
			} else {
				_, errs[i] = dc.Approve(ctx(t), k, d)
			}
		})
	}
	wg.Wait()
	a := mustGet(t, s, k)
	winner, applied := "", 0
	for i, err := range errs {
		if err == nil {
			winner, applied = people[i], applied+1
		}
	}
	if applied != 1 || a.ResolvedBy != winner {
		t.Fatalf("%d of %d racing decisions applied (row decided by %q, %s); want exactly one, %v", applied, len(people), a.ResolvedBy, a.Status, errs)
	}
	for i, err := range errs {
		if err != nil && (!errors.Is(err, once.ErrConflict) || !strings.Contains(err.Error(), winner)) {
			t.Errorf("%s's refused decision: %v; want a conflict naming %s, who decided", people[i], err, winner)
		}
	}
}

func testApprovalAfterExpiry(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, gated(time.Second))
	in := intent(1)
	var runs counter
	awaiting(t, c, in, &runs)
	k := keyOf(t, in)
	time.Sleep(1500 * time.Millisecond)
	_, err := c.Approve(ctx(t), k, once.Approval{By: "ada", Attempt: 1})
	if !errors.Is(err, once.ErrConflict) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("Approve after the wait expired = %v; want refused, saying it expired", err)
	}
	if a := mustGet(t, s, k); a.Status != once.StatusAwaitingApproval {
		t.Fatalf("the refused approval left the row %s", a.Status)
	}
	_, err = once.Do(ctx(t), c, in, runs.fn("sent"))
	var w *once.AwaitingApprovalError
	if !errors.As(err, &w) || !w.Expired || once.Dispose(err).Action != once.JobDrop {
		t.Fatalf("a delivery after expiry, before the reaper = %v; want the expired wait, dropped", err)
	}
	r := reaper(t, c)
	rep, err := r.RunOnce(ctx(t))
	if err != nil || rep.Expired != 1 {
		t.Fatalf("reaper pass = %+v, %v; want one expired wait", rep, err)
	}
	if a := mustGet(t, s, k); a.Status != once.StatusFailed || !strings.Contains(a.Error, "expired") {
		t.Fatalf("after the reaper the row is %s (%q); want failed, saying the wait expired", a.Status, a.Error)
	}
	if _, err := once.Do(ctx(t), c, in, runs.fn("sent")); !errors.Is(err, once.ErrFailed) || runs.n.Load() != 0 {
		t.Fatalf("a delivery after expiry = %v (ran %d); want the stored failure", err, runs.n.Load())
	}
	if rep, _ := r.RunOnce(ctx(t)); rep.Expired != 0 {
		t.Fatalf("a second pass expired %d more", rep.Expired)
	}
}

func testApprovalExpiryToReview(t *testing.T, h Harness) {
	cfg := once.Config{Default: once.KindPolicy{Approval: once.ApprovalPolicy{Always: true, Expiry: time.Second, OnExpiry: once.StatusReview}}}
	s, c, _ := setup(t, h, cfg)
	in := intent(1)
	var runs counter
	awaiting(t, c, in, &runs)
	time.Sleep(1500 * time.Millisecond)
	// Expired by a process that knows nothing of the kind (once serve's
	// reaper): the row says what expiry means.
	stranger := client(t, s, once.Config{})
	r := reaper(t, stranger)
	if rep, err := r.RunOnce(ctx(t)); err != nil || rep.Expired != 1 {
		t.Fatalf("reaper pass = %+v, %v", rep, err)
	}
	if a := mustGet(t, s, keyOf(t, in)); a.Status != once.StatusReview {
		t.Fatalf("row after expiry %s; want review, as the kind asked", a.Status)
	}
	_, err := once.Do(ctx(t), c, in, runs.fn("sent"))
	var re *once.ReviewError
	if !errors.As(err, &re) || !re.ApprovalExpired || runs.n.Load() != 0 {
		t.Fatalf("a delivery after the expiry = %v (ran %d); want review, saying the approval expired and nothing ran", err, runs.n.Load())
	}
}

func testApprovalRejectionReplayed(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, gated(0))
	in := intent(1)
	var runs counter
	awaiting(t, c, in, &runs)
	k := keyOf(t, in)
	if _, err := c.Reject(ctx(t), k, once.Approval{By: "grace", Note: "wrong customer"}); err != nil {
		t.Fatal(err)
	}
	other := client(t, s, gated(0))
	_, err := once.Do(ctx(t), other, in, runs.fn("sent"))
	var f *once.FailedError
	if !errors.As(err, &f) || !f.Replayed || !strings.Contains(f.Message, "rejected by grace") || !strings.Contains(f.Message, "wrong customer") ||
		f.RejectedBy != "grace" || f.Reason != "wrong customer" {
		t.Fatalf("a duplicate after the rejection = %v; want the rejection replayed, who and why", err)
	}
	if runs.n.Load() != 0 || once.Dispose(err).Action != once.JobAck {
		t.Fatalf("ran %d times; disposition %v", runs.n.Load(), once.Dispose(err))
	}
	if _, err := c.Approve(ctx(t), k, once.Approval{By: "ada"}); !errors.Is(err, once.ErrConflict) || !strings.Contains(err.Error(), "rejected by grace") {
		t.Fatalf("Approve after the rejection = %v; want refused, naming who rejected it", err)
	}
}

// A delivery whose payload differs from the approved one is refused: the
// approved payload is the only one that runs.
func testApprovalChangedPayload(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, gated(0))
	in := intent(1)
	var runs counter
	awaiting(t, c, in, &runs)
	k := keyOf(t, in)
	if _, err := c.Approve(ctx(t), k, once.Approval{By: "ada"}); err != nil {
		t.Fatal(err)
	}
	changed := in
	changed.Payload = map[string]any{"subject": "hello", "n": 1, "amount": 1_000_000}
	if k2 := keyOf(t, changed); k2 != k {
		t.Fatalf("a changed payload changed the key")
	}
	if _, err := once.Do(ctx(t), c, changed, runs.fn("sent")); !errors.Is(err, once.ErrFingerprintMismatch) || runs.n.Load() != 0 {
		t.Fatalf("a changed payload after approval = %v (ran %d); want refused, nothing run", err, runs.n.Load())
	}
	if a := mustGet(t, s, k); a.Status != once.StatusApproved || a.Attempt != 1 {
		t.Fatalf("row %s attempt %d after the refused payload; want still approved at attempt 1", a.Status, a.Attempt)
	}
}

// A decision made on a page that showed another payload or attempt is
// refused.
func testApprovalStalePage(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, gated(0))
	in := intent(1)
	var runs counter
	awaiting(t, c, in, &runs)
	k := keyOf(t, in)
	if _, err := c.Approve(ctx(t), k, once.Approval{By: "ada", Fingerprint: "sha256:00"}); !errors.Is(err, once.ErrConflict) || !strings.Contains(err.Error(), "payload") {
		t.Fatalf("Approve of a payload the row does not hold = %v; want refused", err)
	}
	if _, err := c.Approve(ctx(t), k, once.Approval{By: "ada", Attempt: 2}); !errors.Is(err, once.ErrConflict) || !strings.Contains(err.Error(), "attempt 2") {
		t.Fatalf("Approve of an attempt the row is not at = %v; want refused", err)
	}
	if a := mustGet(t, s, k); a.Status != once.StatusAwaitingApproval {
		t.Fatalf("row %s after refused approvals", a.Status)
	}
	if tr := trail(t, s, k); tr != "claimed,refused" {
		t.Fatalf("trail %s; want the first refusal written, and the second, of the same attempt, not", tr)
	}
}

// An approval given after the job left the queue: the reaper hands the
// approved action to the kind's Redrive hook, which runs it, once.
func testApprovalDroppedJobRedriven(t *testing.T, h Harness) {
	var runs counter
	var c *once.Client
	var redriven atomic.Int64
	pol := once.KindPolicy{Approval: once.ApprovalPolicy{Always: true}, RedriveAfter: 500 * time.Millisecond,
		Redrive: func(ctx context.Context, a once.Action) error {
			redriven.Add(1)
			_, err := once.Do(ctx, c, intent(1), runs.fn("sent"))
			return err
		}}
	s, c, _ := setup(t, h, once.Config{Kinds: map[string]once.KindPolicy{"send_email": pol}})
	in := intent(1)
	_, err := once.Do(ctx(t), c, in, runs.fn("sent"))
	if !errors.Is(err, once.ErrAwaitingApproval) || once.Dispose(err).Action != once.JobDrop {
		t.Fatalf("Do = %v, disposition %v; want the job dropped, since the kind re-drives", err, once.Dispose(err))
	}
	if _, err := c.Approve(ctx(t), keyOf(t, in), once.Approval{By: "ada"}); err != nil {
		t.Fatal(err)
	}
	r := reaper(t, c)
	if rep, _ := r.RunOnce(ctx(t)); rep.Redriven != 0 {
		t.Fatalf("re-driven %d at once; want it to wait RedriveAfter for a delivery", rep.Redriven)
	}
	time.Sleep(700 * time.Millisecond)
	if rep, err := r.RunOnce(ctx(t)); err != nil || rep.Redriven != 1 {
		t.Fatalf("reaper pass = %+v, %v; want the approved action re-driven", rep, err)
	}
	time.Sleep(700 * time.Millisecond)
	if rep, _ := r.RunOnce(ctx(t)); rep.Redriven != 0 {
		t.Fatalf("re-driven again after it ran")
	}
	if a := mustGet(t, s, keyOf(t, in)); a.Status != once.StatusSucceeded || runs.n.Load() != 1 || redriven.Load() != 1 {
		t.Fatalf("row %s, ran %d, re-driven %d; want it run once by the hook", a.Status, runs.n.Load(), redriven.Load())
	}
}

// A caller that waits (WaitFor) blocks across the approval and runs the
// effect itself once approved.
func testApprovalWaitFor(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, gated(0))
	in := intent(1)
	var runs counter
	done := make(chan error, 1)
	var res once.Result[string]
	go func() {
		var err error
		res, err = once.Do(ctx(t), c, in, runs.fn("sent"), once.WaitFor(30*time.Second))
		done <- err
	}()
	k := keyOf(t, in)
	for {
		if a, err := s.Get(ctx(t), k); err == nil && a.Status == once.StatusAwaitingApproval {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	if runs.n.Load() != 0 {
		t.Fatal("ran before the approval")
	}
	if _, err := client(t, s, once.Config{}).Approve(ctx(t), k, once.Approval{By: "ada"}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil || res.Value != "sent" || runs.n.Load() != 1 {
			t.Fatalf("the waiting Do = %+v, %v (ran %d); want it to run the effect once approved", res, err, runs.n.Load())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the waiting Do did not come back after the approval")
	}
}

// The trail names who decided, when, why and through which surface.
func testApprovalTrail(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, gated(0))
	in := intent(1)
	var runs counter
	awaiting(t, c, in, &runs)
	k := keyOf(t, in)
	if _, err := c.Approve(ctx(t), k, once.Approval{By: "ada", Note: "amount checked", Via: "cli"}); err != nil {
		t.Fatal(err)
	}
	if _, err := once.Do(ctx(t), c, in, runs.fn("sent")); err != nil {
		t.Fatal(err)
	}
	evs, err := s.Events(ctx(t), k)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range evs {
		got = append(got, fmt.Sprintf("%s:%s>%s:%s", e.Type, e.From, e.To, e.Actor))
	}
	want := "claimed:>awaiting_approval:worker approved:awaiting_approval>approved:ada claimed:approved>in_flight:worker succeeded:in_flight>succeeded:worker"
	if strings.Join(got, " ") != want {
		t.Fatalf("trail\n %s\nwant\n %s", strings.Join(got, " "), want)
	}
	if n := evs[1].Note; !strings.Contains(n, "via cli") || !strings.Contains(n, "amount checked") {
		t.Errorf("the approval's note %q; want the surface and the reason", n)
	}
}

func testApprovalInvalid(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, gated(0))
	in := intent(1)
	var runs counter
	awaiting(t, c, in, &runs)
	k := keyOf(t, in)
	for _, tc := range []struct {
		name   string
		reject bool
		d      once.Approval
		field  string
	}{
		{"nobody", false, once.Approval{}, "By"},
		{"reject without why", true, once.Approval{By: "ada"}, "Note"},
		{"huge note", false, once.Approval{By: "ada", Note: strings.Repeat("x", 5000)}, "Note"},
		{"NUL", false, once.Approval{By: "a\x00da"}, "By"},
		{"negative attempt", false, once.Approval{By: "ada", Attempt: -1}, "Attempt"},
		{"junk fingerprint", false, once.Approval{By: "ada", Fingerprint: "a b"}, "Fingerprint"},
	} {
		var err error
		if tc.reject {
			_, err = c.Reject(ctx(t), k, tc.d)
		} else {
			_, err = c.Approve(ctx(t), k, tc.d)
		}
		var re *once.ResolutionError
		if !errors.As(err, &re) || re.Field != tc.field {
			t.Errorf("%s: %v; want a refusal naming %s", tc.name, err, tc.field)
		}
	}
	if tr := trail(t, s, k); tr != "claimed" {
		t.Fatalf("trail %s; invalid decisions must write nothing", tr)
	}
	if _, err := c.Approve(ctx(t), "0000", once.Approval{By: "ada"}); !isNotFound(err) {
		t.Fatalf("Approve of a key nobody claimed = %v; want ErrNotFound", err)
	}
}

// Four worker processes race for an approved action: one runs it.
func testApprovalRaceProcesses(t *testing.T, h Harness) {
	s, c, spec := setup(t, h, once.Config{Default: once.KindPolicy{Approval: once.ApprovalPolicy{Always: true}}})
	if _, err := once.Do(ctx(t), c, processIntent, (&counter{}).fn("")); !errors.Is(err, once.ErrAwaitingApproval) {
		t.Fatalf("Do = %v", err)
	}
	if _, err := c.Approve(ctx(t), keyOf(t, processIntent), once.Approval{By: "ada"}); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "effects")
	const n = 4
	counts := raceChildren(t, "race", spec, file, n)
	if got := effectLines(t, file); got != 1 {
		t.Fatalf("effect ran %d times across %d processes after one approval, want 1 (outcomes %v)", got, n, counts)
	}
	if counts["executed"] != 1 {
		t.Fatalf("outcomes %v; want exactly one executed", counts)
	}
	if a := mustGet(t, s, keyOf(t, processIntent)); a.Status != once.StatusSucceeded || a.Attempt != 2 {
		t.Fatalf("row %s attempt %d", a.Status, a.Attempt)
	}
}

// Four processes approve at once: one applies, three are refused naming
// it.
func testApprovalDecisionRaceProcesses(t *testing.T, h Harness) {
	s, c, spec := setup(t, h, once.Config{Default: once.KindPolicy{Approval: once.ApprovalPolicy{Always: true}}})
	if _, err := once.Do(ctx(t), c, processIntent, (&counter{}).fn("")); !errors.Is(err, once.ErrAwaitingApproval) {
		t.Fatalf("Do = %v", err)
	}
	counts := raceChildren(t, "approve", spec, "", 4)
	a := mustGet(t, s, keyOf(t, processIntent))
	if counts["approved"] != 1 || counts["refused by "+a.ResolvedBy] != 3 || a.Status != once.StatusApproved {
		t.Fatalf("outcomes %v, row %s by %s; want one approved and three refused naming its approver", counts, a.Status, a.ResolvedBy)
	}
}

// approveChild approves processIntent's action as itself, and prints
// "approved", or "refused by" whoever the refusal names.
func approveChild(ctx context.Context, s once.Store) error {
	c, err := once.New(once.Config{Store: s})
	if err != nil {
		return err
	}
	me := fmt.Sprintf("pid-%d", os.Getpid())
	k, _, _ := once.KeyOf(processIntent)
	_, err = c.Approve(ctx, k, once.Approval{By: me, Attempt: 1, Via: "api"})
	if err == nil {
		fmt.Println("approved")
		return nil
	}
	if !errors.Is(err, once.ErrConflict) {
		return err
	}
	cur, gerr := s.Get(ctx, k)
	if gerr != nil {
		return gerr
	}
	if !strings.Contains(err.Error(), cur.ResolvedBy) {
		return fmt.Errorf("refusal %q does not name %s", err, cur.ResolvedBy)
	}
	fmt.Println("refused by " + cur.ResolvedBy)
	return nil
}

// The approval commits and its reply is lost: Approve reads its own
// write back and reports it applied, and the trail holds no refusal.
func testFaultApprovalReplyLost(t *testing.T, h Harness) {
	cut, direct, s, f := faultClients(t, h, gated(0))
	in := intent(1)
	var runs counter
	awaiting(t, direct, in, &runs)
	k := keyOf(t, in)
	lost := f.LoseReply(h.Markers.Transition, false)
	a, err := cut.Approve(ctx(t), k, once.Approval{By: "ada", Attempt: 1})
	select {
	case <-lost:
	default:
		t.Fatal("the approval's reply was never lost")
	}
	if err != nil || a.Status != once.StatusApproved {
		t.Fatalf("Approve after a lost reply = %s, %v; want it reported applied", a.Status, err)
	}
	if tr := trail(t, s, k); tr != "claimed,approved" {
		t.Fatalf("trail %s", tr)
	}
	if _, err := once.Do(ctx(t), direct, in, runs.fn("sent")); err != nil || runs.n.Load() != 1 {
		t.Fatalf("Do after the approval = %v (ran %d)", err, runs.n.Load())
	}
}

// The claim that writes the wait commits and its reply is lost: the
// read-back finds the row this call's own, and the wait is announced
// once, not lost and not twice.
func testFaultApprovalClaimReplyLost(t *testing.T, h Harness) {
	var announced atomic.Int64
	cfg := gated(0)
	cfg.Hooks.OnAwaitingApproval = func(context.Context, once.Action) { announced.Add(1) }
	cut, direct, s, f := faultClients(t, h, cfg)
	in := once.Intent{Run: "lost-gated-claim", Kind: "send_email", Target: "ada@example.com"}
	lost := f.LoseReply(h.Markers.Claim, false)
	var runs counter
	awaiting(t, cut, in, &runs)
	select {
	case <-lost:
	default:
		t.Fatal("the claim's reply was never lost")
	}
	awaiting(t, direct, in, &runs)
	if announced.Load() != 1 {
		t.Fatalf("announced %d times; want once, by the call whose claim's reply was lost", announced.Load())
	}
	if a := mustGet(t, s, keyOf(t, in)); a.Status != once.StatusAwaitingApproval || a.Attempt != 1 {
		t.Fatalf("row %s attempt %d", a.Status, a.Attempt)
	}
}

// A decision whose connection hangs past the wait's expiry fails and
// applies nothing (the partition's end closes the connection); the same
// decision sent again is refused by the database's clock, and the
// reaper's expiry stands.
func testFaultApprovalHung(t *testing.T, h Harness) {
	cfg := gated(time.Second)
	cut, direct, s, f := faultClients(t, h, cfg)
	in := intent(1)
	var runs counter
	awaiting(t, direct, in, &runs)
	k := keyOf(t, in)
	f.Hang(true)
	done := make(chan error, 1)
	go func() {
		_, err := cut.Approve(context.Background(), k, once.Approval{By: "ada"})
		done <- err
	}()
	time.Sleep(1500 * time.Millisecond)
	f.Hang(false)
	if err := <-done; err == nil {
		t.Fatal("an approval whose connection hung past the expiry reported applied")
	}
	if a := mustGet(t, s, k); a.Status != once.StatusAwaitingApproval {
		t.Fatalf("row %s after the hung approval", a.Status)
	}
	if _, err := cut.Approve(ctx(t), k, once.Approval{By: "ada"}); !errors.Is(err, once.ErrConflict) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("the approval sent again after the expiry = %v; want it refused by the database's clock, saying the wait expired", err)
	}
	r := reaper(t, direct)
	if rep, err := r.RunOnce(ctx(t)); err != nil || rep.Expired != 1 {
		t.Fatalf("reaper = %+v, %v", rep, err)
	}
	if _, err := once.Do(ctx(t), direct, in, runs.fn("sent")); !errors.Is(err, once.ErrFailed) || runs.n.Load() != 0 {
		t.Fatalf("Do after expiry = %v (ran %d)", err, runs.n.Load())
	}
}

// The rejection commits and its reply is lost: Reject reports it
// applied, and a duplicate gets the rejection.
func testFaultRejectionReplyLost(t *testing.T, h Harness) {
	cut, direct, s, f := faultClients(t, h, gated(0))
	in := intent(1)
	var runs counter
	awaiting(t, direct, in, &runs)
	k := keyOf(t, in)
	lost := f.LoseReply(h.Markers.Transition, false)
	a, err := cut.Reject(ctx(t), k, once.Approval{By: "grace", Note: "wrong customer"})
	select {
	case <-lost:
	default:
		t.Fatal("the rejection's reply was never lost")
	}
	if err != nil || a.Status != once.StatusFailed {
		t.Fatalf("Reject after a lost reply = %s, %v; want it reported applied", a.Status, err)
	}
	if tr := trail(t, s, k); tr != "claimed,rejected" {
		t.Fatalf("trail %s", tr)
	}
	if _, err := once.Do(ctx(t), direct, in, runs.fn("sent")); !errors.Is(err, once.ErrFailed) || runs.n.Load() != 0 {
		t.Fatalf("Do after the rejection = %v (ran %d)", err, runs.n.Load())
	}
}

// The reaper's expiry commits and its reply is lost: the pass reads it
// back, counts it once, and the trail holds one expiry.
func testFaultExpiryReplyLost(t *testing.T, h Harness) {
	cut, direct, s, f := faultClients(t, h, gated(time.Second))
	in := intent(1)
	var runs counter
	awaiting(t, direct, in, &runs)
	k := keyOf(t, in)
	time.Sleep(1200 * time.Millisecond)
	r := reaper(t, cut)
	lost := f.LoseReply(h.Markers.Transition, false)
	rep, err := r.RunOnce(ctx(t))
	select {
	case <-lost:
	default:
		t.Fatal("the expiry's reply was never lost")
	}
	if err != nil || rep.Expired != 1 {
		t.Fatalf("reaper pass after a lost reply = %+v, %v; want the expiry read back and counted", rep, err)
	}
	if tr := trail(t, s, k); tr != "claimed,expired" {
		t.Fatalf("trail %s", tr)
	}
	if rep, err := r.RunOnce(ctx(t)); err != nil || rep.Expired != 0 {
		t.Fatalf("second pass = %+v, %v", rep, err)
	}
}

// The claim of an approved action commits and its reply is lost: the
// read-back finds it this call's own, and the effect runs once.
func testFaultApprovedClaimReplyLost(t *testing.T, h Harness) {
	cut, direct, s, f := faultClients(t, h, gated(0))
	in := intent(1)
	var runs counter
	awaiting(t, direct, in, &runs)
	k := keyOf(t, in)
	if _, err := direct.Approve(ctx(t), k, once.Approval{By: "ada"}); err != nil {
		t.Fatal(err)
	}
	lost := f.LoseReply(h.Markers.Reclaim, false)
	res, err := once.Do(ctx(t), cut, in, runs.fn("sent"))
	select {
	case <-lost:
	default:
		t.Fatal("the claim's reply was never lost")
	}
	if err != nil || res.Value != "sent" || runs.n.Load() != 1 {
		t.Fatalf("Do after a lost claim reply = %+v, %v (ran %d); want it run once", res, err, runs.n.Load())
	}
	if _, err := once.Do(ctx(t), direct, in, runs.fn("again")); err != nil || runs.n.Load() != 1 {
		t.Fatalf("a duplicate = %v (ran %d)", err, runs.n.Load())
	}
	if a := mustGet(t, s, k); a.Status != once.StatusSucceeded || a.Attempt != 2 {
		t.Fatalf("row %s attempt %d", a.Status, a.Attempt)
	}
}

// The claim that would write the wait meets a partition: it answers
// that the store is unreachable, announces nothing and runs nothing;
// once the network is back, the next delivery writes the wait and
// announces it, once.
func testFaultApprovalClaimHung(t *testing.T, h Harness) {
	var announced atomic.Int64
	cfg := gated(0)
	cfg.ClaimTimeout = 500 * time.Millisecond
	cfg.Hooks.OnAwaitingApproval = func(context.Context, once.Action) { announced.Add(1) }
	cut, _, s, f := faultClients(t, h, cfg)
	in := intent(1)
	var runs counter
	f.Hang(true)
	_, err := once.Do(ctx(t), cut, in, runs.fn("sent"))
	f.Hang(false)
	if !errors.Is(err, once.ErrUnavailable) || announced.Load() != 0 || runs.n.Load() != 0 {
		t.Fatalf("a gated claim over a partition = %v (announced %d, ran %d); want ErrUnavailable, nobody told, nothing run", err, announced.Load(), runs.n.Load())
	}
	awaiting(t, cut, in, &runs)
	awaiting(t, cut, in, &runs)
	if announced.Load() != 1 {
		t.Fatalf("announced %d times after the partition; want once", announced.Load())
	}
	if a := mustGet(t, s, keyOf(t, in)); a.Status != once.StatusAwaitingApproval || a.Attempt != 1 {
		t.Fatalf("row %s attempt %d", a.Status, a.Attempt)
	}
}

// The approved action's claim (attempt 2) is held by a process that
// pauses past its lease: recovery takes it over as any claim, and the
// paused attempt's late outcome is fenced, so the approved effect is not
// recorded twice; under RetryWithProviderKey the takeover runs it with
// the same provider key.
func testApprovedClaimPausedPastLease(t *testing.T, h Harness) {
	cfg := once.Config{Kinds: map[string]once.KindPolicy{"send_email": {Lease: time.Second, Recovery: once.RetryWithProviderKey,
		Approval: once.ApprovalPolicy{Always: true}}}}
	s, c, _ := setup(t, h, cfg)
	other := client(t, s, cfg)
	in := intent(1)
	var runs counter
	awaiting(t, c, in, &runs)
	k := keyOf(t, in)
	if _, err := c.Approve(ctx(t), k, once.Approval{By: "ada"}); err != nil {
		t.Fatal(err)
	}
	paused := pausePast(t, c, in, cfg.Kinds["send_email"].Lease)
	if paused.Number != 2 {
		t.Fatalf("the approved action's claim is attempt %d; want 2", paused.Number)
	}
	res, err := once.Do(ctx(t), other, in, runs.fn("sent"))
	if err != nil || res.Attempt != 3 || runs.n.Load() != 1 {
		t.Fatalf("a delivery after the paused claim's lease = %+v, %v (ran %d); want the takeover, attempt 3, run once", res, err, runs.n.Load())
	}
	if err := paused.Succeed(ctx(t), "late"); !errors.Is(err, once.ErrFenced) && !errors.Is(err, once.ErrConflict) {
		t.Fatalf("the paused attempt's late success = %v; want it refused", err)
	}
	if a := mustGet(t, s, k); a.Status != once.StatusSucceeded || a.Attempt != 3 || string(a.Result) != `"sent"` {
		t.Fatalf("row %s attempt %d result %s; want the takeover's success", a.Status, a.Attempt, a.Result)
	}
}
