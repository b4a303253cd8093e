package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncehq/once"
)

// Cases found by reviewing Claim and Attempt as an attacker and as a
// careless user would use them: each one failed before its fix.

func reviewTests() []namedTest {
	return []namedTest{
		{name: "ReviewTakeoverAttemptRebuilds", fn: testReviewTakeoverRebuilds},
		{name: "ReviewRebuildOfReviewedSuccessSaysSo", fn: testReviewRebuildOfReviewedSuccess},
		{name: "ReviewDoAttemptNotSettledByRebuild", fn: testReviewDoAttemptNotSettledByRebuild},
		{name: "ReviewRebuiltUnknownKeepsRowRecovery", fn: testReviewRebuiltUnknownKeepsRowRecovery},
		{name: "ReviewConflictNamesWhereTheRowWent", fn: testReviewConflictNamesWhereTheRowWent},
		{name: "ReviewReleasedVerifiableRunWithoutItsVerifier", fn: testReviewReleasedVerifiableRunWithoutItsVerifier},
		{name: "ReviewReclaimKeepsRowRecovery", fn: testReviewReclaimKeepsRowRecovery},
		{name: "FaultReviewLateOutcomeAfterTakeoverRefused", fn: testFaultReviewLateOutcomeAfterTakeover, needs: needFaults | needLostReplies},
		{name: "FaultReviewDoLateOutcomeAfterTakeoverRefused", fn: testFaultReviewDoLateOutcomeAfterTakeover, needs: needFaults | needLostReplies},
		{name: "FaultReviewRetriedSettleReachesHooks", fn: testFaultReviewRetriedSettleReachesHooks, needs: needFaults | needLostReplies},
	}
}

// pausePast claims in with c and waits until its stored lease has run out,
// as a holder paused past it would.
func pausePast(t *testing.T, c *once.Client, in once.Intent, lease time.Duration) *once.Attempt {
	t.Helper()
	a := claim(t, c, in)
	time.Sleep(lease * 3 / 2)
	return a
}

// A Claim that takes a lapsed action over holds the new attempt: its
// token is the one the row carries, so the attempt can be rebuilt in the
// process that settles it, as a first claim can. It is not the token of
// the attempt it took over, which that attempt's holder knows.
func testReviewTakeoverRebuilds(t *testing.T, h Harness) {
	cfg := once.Config{Default: once.KindPolicy{Lease: time.Second, Recovery: once.RetryWithProviderKey}}
	s, c, _ := setup(t, h, cfg)
	other := client(t, s, cfg)
	in := intent(1)
	first := pausePast(t, c, in, cfg.Default.Lease)
	next := claim(t, other, in)
	if next.Number != 2 {
		t.Fatalf("claim after the lease lapsed = attempt %d; want the takeover, attempt 2", next.Number)
	}
	row := mustGet(t, s, next.Key)
	if next.Token == first.Token || next.Token != row.Token {
		t.Errorf("takeover's token %q; the row's is %q and attempt 1's %q: want the row's, not attempt 1's", next.Token, row.Token, first.Token)
	}
	r, err := c.Attempt(ctx(t), next.Key, next.Number, next.Token)
	if err != nil {
		t.Fatalf("rebuilding the takeover from its own token: %v; want it rebuilt", err)
	}
	if err := r.Succeed(ctx(t), "second"); err != nil {
		t.Fatalf("Succeed of the rebuilt takeover: %v", err)
	}
}

// A success whose value could not be stored put the action up for
// review. An attempt rebuilt from its token, settling it again, must not
// report the success recorded: the row holds no result.
func testReviewRebuildOfReviewedSuccess(t *testing.T, h Harness) {
	cfg := once.Config{MaxResultBytes: 64}
	s, c, _ := setup(t, h, cfg)
	other := client(t, s, cfg)
	a := claim(t, c, intent(1))
	early, err := other.Attempt(ctx(t), a.Key, a.Number, a.Token)
	if err != nil {
		t.Fatalf("Attempt: %v", err)
	}
	big := strings.Repeat("x", 200)
	if err := a.Succeed(ctx(t), big); !errors.Is(err, once.ErrResultTooLarge) {
		t.Fatalf("Succeed with a result over the cap = %v; want ErrResultTooLarge", err)
	}
	if st := mustGet(t, s, a.Key); st.Status != once.StatusReview {
		t.Fatalf("row = %s; want review", st.Status)
	}
	late, err := other.Attempt(ctx(t), a.Key, a.Number, a.Token)
	if err != nil {
		t.Fatalf("Attempt after it settled: %v", err)
	}
	if err := late.Succeed(ctx(t), big); err == nil {
		t.Error("Succeed on an attempt rebuilt after its success went to review = nil; want the same answer, the result not stored")
	}
	if err := early.Succeed(ctx(t), "small"); err == nil {
		t.Error("Succeed on an attempt rebuilt before its success went to review = nil; want it told the result was not stored")
	}
	if st := mustGet(t, s, a.Key); st.Status != once.StatusReview {
		t.Fatalf("row = %s; want still review", st.Status)
	}
}

// Do settles its attempt from what the effect returns. An effect that
// hands its attempt's token on (to a remote worker that heartbeats, say)
// must not let a rebuild settle the claim behind Do's back: the row
// would say the effect failed while Do reports the value it returned.
func testReviewDoAttemptNotSettledByRebuild(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{})
	other := client(t, s, once.Config{})
	var settledElsewhere error
	res, doErr := once.Do(ctx(t), c, intent(1), func(ctx context.Context, a once.Attempt) (string, error) {
		if a.Token == "" {
			settledElsewhere = errors.New("no token to rebuild from")
			return "sent", nil
		}
		r, err := other.Attempt(ctx, a.Key, a.Number, a.Token)
		if err != nil {
			settledElsewhere = err
			return "sent", nil
		}
		settledElsewhere = r.Fail(ctx, errors.New("remote says declined"))
		return "sent", nil
	})
	row := mustGet(t, s, res.Key)
	if settledElsewhere == nil {
		t.Errorf("a rebuild of Do's attempt settled it (row %s); want it refused, as the settling methods are inside Do", row.Status)
	}
	if doErr != nil || row.Status != once.StatusSucceeded || string(row.Result) != `"sent"` {
		t.Errorf("Do = %+v, %v, row %s %s; want the effect's value recorded", res, doErr, row.Status, row.Result)
	}
}

// The row records the recovery its kind had when it was claimed, and
// every process applies that one. A server whose own default retries
// rebuilds an AskPerson attempt and says its outcome is unknown: the
// action goes to a person, not back to the queue to run again.
func testReviewRebuiltUnknownKeepsRowRecovery(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{})
	server := client(t, s, once.Config{Default: once.KindPolicy{Recovery: once.RetryWithProviderKey}})
	in := intent(1)
	a := claim(t, c, in)
	if got := mustGet(t, s, a.Key).Recovery; got != once.AskPerson {
		t.Fatalf("row recovery %v; want ask_person", got)
	}
	r, err := server.Attempt(ctx(t), a.Key, a.Number, a.Token)
	if err != nil {
		t.Fatalf("Attempt: %v", err)
	}
	_ = r.Unknown(ctx(t), errors.New("timeout reading the reply"))
	if st := mustGet(t, s, a.Key); st.Status != once.StatusReview {
		t.Errorf("row after the rebuilt attempt's Unknown = %s; want review, as its recorded recovery says", st.Status)
	}
	var effects counter
	_, _ = once.Do(ctx(t), c, in, effects.fn("again"))
	if effects.n.Load() != 0 {
		t.Errorf("the effect ran again after an unknown outcome of an AskPerson action")
	}
}

// A settle refused because the attempt settled otherwise names where
// the row went (review, for an unknown outcome under AskPerson), not
// what the first settle asked for, which is no status the row has.
func testReviewConflictNamesWhereTheRowWent(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{})
	a := claim(t, c, intent(1))
	if err := a.Unknown(ctx(t), errors.New("timeout")); err != nil {
		t.Fatalf("Unknown: %v", err)
	}
	row := mustGet(t, s, a.Key)
	err := a.Succeed(ctx(t), "x")
	var ce *once.ConflictError
	if !errors.As(err, &ce) {
		t.Fatalf("Succeed after Unknown = %v; want a *ConflictError", err)
	}
	if ce.Current.Status != row.Status {
		t.Errorf("ConflictError says the action is now %s; the row is %s: %v", ce.Current.Status, row.Status, err)
	}
}

// The holder of attempt 1 is cut off past its lease; another worker
// takes the action over and records attempt 2's result. Attempt 1's
// outcome then comes, and its first try's reply is lost: the try after
// it is refused, and the read-back must not take attempt 2's row for
// attempt 1's write. The outcome is refused, and the trail says so.
func testFaultReviewLateOutcomeAfterTakeover(t *testing.T, h Harness) {
	cfg := once.Config{Default: once.KindPolicy{Lease: time.Second, Recovery: once.RetryWithProviderKey}}
	cut, direct, s, f := faultClients(t, h, cfg)
	in := intent(1)
	first := pausePast(t, cut, in, cfg.Default.Lease)
	res, err := once.Do(ctx(t), direct, in, func(context.Context, once.Attempt) (string, error) { return "second", nil })
	if err != nil || res.Attempt != 2 {
		t.Fatalf("takeover Do = %+v, %v; want attempt 2", res, err)
	}
	lost := f.LoseReply(h.Markers.Transition, false)
	err = first.Succeed(ctx(t), "first")
	select {
	case <-lost:
	default:
		t.Fatal("the late outcome's reply was never lost")
	}
	if !errors.Is(err, once.ErrFenced) {
		t.Errorf("late Succeed of attempt 1 after the takeover recorded = %v; want ErrFenced", err)
	}
	row := mustGet(t, s, first.Key)
	if row.Attempt != 2 || string(row.Result) != `"second"` {
		t.Fatalf("row = attempt %d result %s; want attempt 2's", row.Attempt, row.Result)
	}
	if tr := trail(t, s, first.Key); !strings.Contains(tr, "refused") {
		t.Errorf("trail %s; want attempt 1's late outcome refused in it", tr)
	}
}

// The same through Do, as on main: a worker cut off past its lease,
// whose effect ignores its context and returns after a takeover
// succeeded, is told its outcome was refused, also when the first try's
// reply is lost.
func testFaultReviewDoLateOutcomeAfterTakeover(t *testing.T, h Harness) {
	cfg := once.Config{Default: once.KindPolicy{Lease: time.Second, Recovery: once.RetryWithProviderKey}}
	cut, direct, s, f := faultClients(t, h, cfg)
	in := intent(1)
	var lost <-chan struct{}
	res, err := once.Do(ctx(t), cut, in, func(ctx context.Context, a once.Attempt) (string, error) {
		f.Hang(true)
		<-ctx.Done() // the heartbeat's timer: no heartbeat got through
		time.Sleep(cfg.Default.Lease)
		taken, err := once.Do(context.Background(), direct, in, func(context.Context, once.Attempt) (string, error) { return "second", nil })
		if err != nil || taken.Attempt != 2 {
			t.Errorf("takeover Do = %+v, %v; want attempt 2", taken, err)
		}
		f.Hang(false)
		lost = f.LoseReply(h.Markers.Transition, false)
		return "first", nil
	})
	select {
	case <-lost:
	default:
		t.Fatal("the late outcome's reply was never lost")
	}
	if !errors.Is(err, once.ErrFenced) {
		t.Errorf("Do of attempt 1, outcome after the takeover = %+v, %v; want ErrFenced", res, err)
	}
	if tr := trail(t, s, keyOf(t, in)); !strings.Contains(tr, "refused") {
		t.Errorf("trail %s; want attempt 1's late outcome refused in it", tr)
	}
}

// Succeed's write commits and its reply never comes back within
// RecordTimeout: the holder is told it was not recorded, and settles
// again, which finds its own write. The hooks must see that outcome
// once: metrics and traces count it, and a retried settle is the only
// call that learns it applied.
func testFaultReviewRetriedSettleReachesHooks(t *testing.T, h Harness) {
	var mu sync.Mutex
	seen := 0
	cfg := once.Config{RecordTimeout: time.Second, Hooks: once.Hooks{OnEvent: func(_ context.Context, o once.Observation) {
		if o.Type == once.EventSucceeded {
			mu.Lock()
			seen++
			mu.Unlock()
		}
	}}}
	cut, _, s, f := faultClients(t, h, cfg)
	a := claim(t, cut, intent(1))
	lost := f.LoseReply(h.Markers.Transition, true)
	err := a.Succeed(ctx(t), "250 queued")
	<-lost
	if !errors.Is(err, once.ErrNotRecorded) {
		t.Fatalf("Succeed whose reply hung past RecordTimeout = %v; want ErrNotRecorded", err)
	}
	if st := mustGet(t, s, a.Key); st.Status != once.StatusSucceeded {
		t.Fatalf("row = %s; want the hung write committed", st.Status)
	}
	if err := a.Succeed(ctx(t), "250 queued"); err != nil {
		t.Fatalf("Succeed again: %v; want it found recorded", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if seen != 1 {
		t.Errorf("hooks saw the success %d times; want once", seen)
	}
}

// A released action whose row recorded VerifyThenDecide is claimed again
// only by a process that takes its kind's verifier: one that does not
// configure the kind (its Default asks a person, with no verifier) would
// run the effect without the verifier being asked whether an earlier
// attempt landed, and write its own recovery over the row's. It is told
// to retry later, and the row keeps its recovery for the process that
// can verify it.
func testReviewReleasedVerifiableRunWithoutItsVerifier(t *testing.T, h Harness) {
	var asked atomic.Int64
	verifier := func(context.Context, once.Action) (bool, json.RawMessage, error) {
		asked.Add(1)
		return false, nil, nil
	}
	in := intent(1)
	cfg := once.Config{Kinds: map[string]once.KindPolicy{in.Kind: {Recovery: once.VerifyThenDecide, Verifier: verifier}}}
	s, knows, _ := setup(t, h, cfg)
	stranger := client(t, s, once.Config{})
	var runs counter
	if _, err := once.Do(ctx(t), knows, in, func(context.Context, once.Attempt) (string, error) {
		runs.n.Add(1)
		return "", once.RetryLater(errors.New("provider busy"))
	}); !errors.Is(err, once.ErrRetryLater) {
		t.Fatalf("first Do = %v; want ErrRetryLater", err)
	}
	if a := mustGet(t, s, keyOf(t, in)); a.Status != once.StatusReleased || a.Recovery != once.VerifyThenDecide {
		t.Fatalf("after RetryLater the row is %s recording %v; want released recording verify_then_decide", a.Status, a.Recovery)
	}
	_, err := once.Do(ctx(t), stranger, in, runs.fn("stranger"))
	if !errors.Is(err, once.ErrRetryLater) || !strings.Contains(err.Error(), "verif") {
		t.Errorf("Do by a process without the kind's verifier = %v; want ErrRetryLater saying the verifier's process claims it", err)
	}
	if runs.n.Load() != 1 {
		t.Fatalf("effect ran %d times; the process without the verifier must not run it", runs.n.Load())
	}
	a := mustGet(t, s, keyOf(t, in))
	if a.Status != once.StatusReleased || a.Attempt != 1 || a.Recovery != once.VerifyThenDecide {
		t.Fatalf("row after the refused claim: %s attempt %d recording %v; want released attempt 1 recording verify_then_decide", a.Status, a.Attempt, a.Recovery)
	}
	res, err := once.Do(ctx(t), knows, in, runs.fn("knows"))
	if err != nil || res.Value != "knows" {
		t.Fatalf("Do by the process with the verifier = %+v, %v; want it run", res, err)
	}
	if asked.Load() != 1 || runs.n.Load() != 2 {
		t.Errorf("verifier asked %d times, effect run %d times; want the verifier asked before the second run", asked.Load(), runs.n.Load())
	}
}

// A process that does not configure a kind claims a released action of
// it again keeping the recovery its row recorded: its Default's recovery
// (here RetryWithProviderKey, which re-executes) must not replace the
// AskPerson the kind's own process chose.
func testReviewReclaimKeepsRowRecovery(t *testing.T, h Harness) {
	in := intent(1)
	cfg := once.Config{Kinds: map[string]once.KindPolicy{in.Kind: {Recovery: once.AskPerson}}}
	s, knows, _ := setup(t, h, cfg)
	stranger := client(t, s, once.Config{Default: once.KindPolicy{Recovery: once.RetryWithProviderKey}})
	if _, err := once.Do(ctx(t), knows, in, func(context.Context, once.Attempt) (string, error) {
		return "", once.RetryLater(errors.New("provider busy"))
	}); !errors.Is(err, once.ErrRetryLater) {
		t.Fatalf("first Do = %v; want ErrRetryLater", err)
	}
	a, err := stranger.Claim(ctx(t), in)
	if err != nil {
		t.Fatalf("Claim by the stranger: %v", err)
	}
	if row := mustGet(t, s, a.Key); row.Attempt != 2 || row.Recovery != once.AskPerson {
		t.Errorf("row after the stranger's claim: attempt %d recording %v; want attempt 2 still recording ask_person", row.Attempt, row.Recovery)
	}
}
