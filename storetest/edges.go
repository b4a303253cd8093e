package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/oncehq/once"
)

// edgeTests are the partial-failure edges: late outcomes, lost replies,
// hung connections.
func edgeTests() []namedTest {
	return []namedTest{
		{name: "LateSuccessAfterRelease", fn: testLateSuccessAfterRelease, needs: needProcesses},
		{name: "LateSuccessAfterPersonRetry", fn: testLateSuccessAfterPersonRetry, needs: needProcesses},
		{name: "LateSuccessAfterAbandon", fn: testLateSuccessAfterAbandon, needs: needProcesses},
		{name: "SlowVerifierOneReaperPerAction", fn: testSlowVerifierOneReaperPerAction},
		{name: "ReleasedActionIsRedriven", fn: testReleasedActionIsRedriven},
		{name: "RedriveHookRunsDo", fn: testRedriveHookRunsDo},
		{name: "ReaperHoldsForTheKind", fn: testReaperHoldsForTheKind},
		{name: "UnstorableErrorText", fn: testUnstorableErrorText},
		{name: "DeeplyNestedResult", fn: testDeeplyNestedResult},
		{name: "UnstorableVerifierError", fn: testUnstorableVerifierError},
		{name: "OperatorReaperAppliesRowRecovery", fn: testOperatorReaperAppliesRowRecovery, needs: needProcesses},
		{name: "OnlyAVerifierDecides", fn: testOnlyAVerifierDecides},
		{name: "PurgeByRowDeadline", fn: testPurgeByRowDeadline},
		{name: "EventsNameTheirOrigin", fn: testEventsNameTheirOrigin},
		{name: "ResolvedFailureKeepsItsOutcome", fn: testResolvedFailureKeepsItsOutcome},
		{name: "UndecodableResultSettles", fn: testUndecodableResultSettles},
	}
}

// lateSuccess checks what every late-success case must end with: the
// worker's outcome recorded for attempt 1, its result replayed to the
// next delivery without running the effect, and the trail showing both
// the decision and the late outcome.
func lateSuccess(t *testing.T, s once.Store, c *once.Client, resume func() string, wantTrail string) {
	t.Helper()
	if out := resume(); out != "executed" {
		t.Fatalf("the slow worker said %q, want its completion recorded", out)
	}
	a := mustGet(t, s, processKey())
	if a.Status != once.StatusSucceeded || a.Attempt != 1 {
		t.Fatalf("stored %s attempt %d; the outcome became known and must be recorded", a.Status, a.Attempt)
	}
	res, err := once.Do(ctx(t), c, processIntent, func(context.Context, once.Attempt) (int, error) {
		t.Error("the next delivery ran the effect again")
		return 0, nil
	})
	if err != nil || !res.Replayed || res.Attempt != 1 {
		t.Fatalf("next delivery = %+v, %v; want attempt 1 replayed", res, err)
	}
	if got := trail(t, s, a.Key); got != wantTrail {
		t.Fatalf("trail %s, want %s", got, wantTrail)
	}
}

// Recovery released the claim (its worker looked dead); the worker then
// reports success before anyone claimed again.
func testLateSuccessAfterRelease(t *testing.T, h Harness) {
	s, c, spec := setup(t, h, policyConfig(once.KindPolicy{Recovery: once.RetryWithProviderKey}))
	_, resume := zombie(t, s, spec)
	r, err := once.NewReaper(c, once.ReaperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := r.RunOnce(ctx(t)); err != nil || rep.Released != 1 {
		t.Fatalf("reaper = %+v, %v; want the dead claim released", rep, err)
	}
	lateSuccess(t, s, c, resume, "claimed,released,succeeded")
}

// A person chose Retry on the review item; the worker then reports.
func testLateSuccessAfterPersonRetry(t *testing.T, h Harness) {
	s, c, spec := setup(t, h, policyConfig(once.KindPolicy{Recovery: once.AskPerson}))
	_, resume := zombie(t, s, spec)
	if _, err := once.Do(ctx(t), c, processIntent, func(context.Context, once.Attempt) (int, error) { return 0, nil }); !errors.Is(err, once.ErrReview) {
		t.Fatalf("redelivery = %v, want review", err)
	}
	if _, err := c.Resolve(ctx(t), processKey(), once.Resolution{Decision: once.DecisionRetry, By: "ada", Note: "no trace in the mail log"}); err != nil {
		t.Fatal(err)
	}
	lateSuccess(t, s, c, resume, "claimed,review,resolved,succeeded")
}

// A person abandoned the action; the worker then reports that it did
// happen after all.
func testLateSuccessAfterAbandon(t *testing.T, h Harness) {
	s, c, spec := setup(t, h, policyConfig(once.KindPolicy{Recovery: once.AskPerson}))
	_, resume := zombie(t, s, spec)
	if _, err := once.Do(ctx(t), c, processIntent, func(context.Context, once.Attempt) (int, error) { return 0, nil }); !errors.Is(err, once.ErrReview) {
		t.Fatalf("redelivery = %v, want review", err)
	}
	if _, err := c.Resolve(ctx(t), processKey(), once.Resolution{Decision: once.DecisionAbandon, By: "ada", Note: "customer cancelled"}); err != nil {
		t.Fatal(err)
	}
	lateSuccess(t, s, c, resume, "claimed,review,resolved,succeeded")
}

// A reaper whose verifier is slow must not hold its whole batch while it
// asks about each action in turn: the tail's hold would run out, and a
// second reaper would ask about the same actions again. Each action is
// held when it is decided, so every verifier is asked exactly once.
func testSlowVerifierOneReaperPerAction(t *testing.T, h Harness) {
	const n = 6
	var mu sync.Mutex
	asked := map[once.Key]int{}
	pol := once.KindPolicy{Recovery: once.VerifyThenDecide, Lease: 40 * time.Millisecond, MaxExecution: 120 * time.Millisecond,
		Verifier: func(ctx context.Context, a once.Action) (bool, json.RawMessage, error) {
			mu.Lock()
			asked[a.Key]++
			mu.Unlock()
			time.Sleep(100 * time.Millisecond) // slow, but within MaxExecution
			return true, json.RawMessage(`"found"`), nil
		}}
	s, c1, spec := setup(t, h, once.Config{Default: pol})
	other, err := h.Open(ctx(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeStore(other) })
	c2, err := once.New(once.Config{Store: other, Default: pol})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		in := once.Intent{Run: "slow", Step: int64(i), Kind: "post_message"}
		if _, err := s.Claim(ctx(t), claimReq(t, in, time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(20 * time.Millisecond)
	var wg sync.WaitGroup
	for i, c := range []*once.Client{c1, c2} {
		wg.Go(func() {
			// The second reaper starts once the first one's hold on a
			// whole batch would have run out.
			time.Sleep(time.Duration(i) * 250 * time.Millisecond)
			r, _ := once.NewReaper(c, once.ReaperConfig{})
			if _, err := r.RunOnce(ctx(t)); err != nil {
				t.Errorf("reaper %d: %v", i+1, err)
			}
		})
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != n {
		t.Fatalf("the verifier was asked about %d actions, want %d", len(asked), n)
	}
	for k, times := range asked {
		if times != 1 {
			t.Errorf("action %s: the verifier was asked %d times; two reapers handled it", k, times)
		}
	}
	for i := range n {
		if a := mustGet(t, s, keyOf(t, once.Intent{Run: "slow", Step: int64(i), Kind: "post_message"})); a.Status != once.StatusSucceeded {
			t.Errorf("step %d is %s, want succeeded", i, a.Status)
		}
	}
}

// A person chose Retry on a review item whose job was dropped long ago:
// nobody will deliver it again, so the reaper hands it to the kind's
// Redrive hook (once per RedriveAfter), and the re-driven job runs it. A
// kind with no hook is counted as waiting.
func testReleasedActionIsRedriven(t *testing.T, h Harness) {
	var mu sync.Mutex
	var redriven []once.Action
	const after = time.Second
	pol := once.KindPolicy{RedriveAfter: after, Redrive: func(_ context.Context, a once.Action) error {
		mu.Lock()
		defer mu.Unlock()
		redriven = append(redriven, a)
		return nil
	}}
	s, c, _ := setup(t, h, once.Config{Kinds: map[string]once.KindPolicy{"send_email": pol, "no_hook": {RedriveAfter: after}}})
	review := func(in once.Intent) once.Key {
		if _, err := once.Do(ctx(t), c, in, func(context.Context, once.Attempt) (int, error) { return 0, errors.New("timeout after DATA") }); !errors.Is(err, once.ErrReview) {
			t.Fatalf("Do = %v, want review", err)
		}
		k := keyOf(t, in)
		if _, err := c.Resolve(ctx(t), k, once.Resolution{Decision: once.DecisionRetry, By: "ada", Note: "bounced; send again"}); err != nil {
			t.Fatal(err)
		}
		return k
	}
	in := intent(1)
	k := review(in)
	review(once.Intent{Run: "r", Kind: "no_hook"})
	r, err := once.NewReaper(c, once.ReaperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := r.RunOnce(ctx(t)); err != nil || rep.Redriven != 0 || rep.Waiting != 0 {
		t.Fatalf("a pass before RedriveAfter = %+v, %v; want nothing re-driven yet", rep, err)
	}
	time.Sleep(after + 100*time.Millisecond)
	rep, err := r.RunOnce(ctx(t))
	if err != nil || rep.Redriven != 1 || rep.Waiting != 1 {
		t.Fatalf("pass = %+v, %v; want one re-driven and one waiting with no hook", rep, err)
	}
	if rep, _ := r.RunOnce(ctx(t)); rep.Redriven != 0 {
		t.Fatalf("re-driven again at once: %+v", rep)
	}
	mu.Lock()
	got := append([]once.Action(nil), redriven...)
	mu.Unlock()
	if len(got) != 1 || got[0].Key != k || got[0].Run != in.Run || got[0].Status != once.StatusReleased {
		t.Fatalf("Redrive got %+v", got)
	}
	if tr := trail(t, s, k); tr != "claimed,review,resolved,redriven" {
		t.Fatalf("trail %s", tr)
	}
	// The re-driven job is delivered: it runs as attempt 2.
	res, err := once.Do(ctx(t), c, in, func(context.Context, once.Attempt) (string, error) { return "sent", nil })
	if err != nil || res.Attempt != 2 || res.Value != "sent" {
		t.Fatalf("re-driven delivery = %+v, %v", res, err)
	}
}

// badText is an error message no database column should be handed as is:
// invalid UTF-8 and a NUL byte (PostgreSQL refuses both in text).
const badText = "550 mailbox \xff\xfe unavailable\x00 (no such user)"

func storable(t *testing.T, what, s string) {
	t.Helper()
	if !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
		t.Errorf("%s stored as %q: not valid UTF-8 text", what, s)
	}
}

// An effect's error text (or a panic's) with invalid UTF-8 and a NUL
// byte is still recorded: a permanent decline must be stored as failed,
// not retried until RecordTimeout and left in flight, to be executed on
// every delivery.
func testUnstorableErrorText(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{Default: once.KindPolicy{Recovery: once.RetryWithProviderKey}, RecordTimeout: 2 * time.Second})
	_, err := once.Do(ctx(t), c, intent(1), func(context.Context, once.Attempt) (int, error) {
		return 0, once.Permanent(errors.New(badText))
	})
	if !errors.Is(err, once.ErrFailed) {
		t.Fatalf("Do = %v; want the permanent failure recorded", err)
	}
	a := mustGet(t, s, keyOf(t, intent(1)))
	if a.Status != once.StatusFailed {
		t.Fatalf("stored %s, want failed", a.Status)
	}
	storable(t, "the error", a.Error)
	if !strings.Contains(a.Error, "mailbox") || !strings.Contains(a.Error, "(no such user)") {
		t.Errorf("stored error %q lost the readable part", a.Error)
	}
	func() {
		defer func() { recover() }()
		once.Do(ctx(t), c, intent(2), func(context.Context, once.Attempt) (int, error) { panic(badText) })
	}()
	a = mustGet(t, s, keyOf(t, intent(2)))
	if a.Status != once.StatusReleased {
		t.Fatalf("a panic with unstorable text left the action %s, want released", a.Status)
	}
	storable(t, "the panic", a.Error)
	for _, k := range []once.Key{keyOf(t, intent(1)), keyOf(t, intent(2))} {
		evs, err := s.Events(ctx(t), k)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			storable(t, "an event note", e.Note)
		}
	}
	// A very long message is cut, and says so.
	long := strings.Repeat("x", 100<<10)
	once.Do(ctx(t), c, intent(3), func(context.Context, once.Attempt) (int, error) { return 0, once.Permanent(errors.New(long)) })
	if a := mustGet(t, s, keyOf(t, intent(3))); len(a.Error) >= len(long) || !strings.Contains(a.Error, "truncated") {
		t.Errorf("a %d-byte error was stored as %d bytes without saying it was truncated", len(long), len(a.Error))
	}
}

// nested returns a value nested n arrays deep.
func nested(n int) any {
	var v any = 1
	for range n {
		v = []any{v}
	}
	return v
}

// A result nested deeper than a database's JSON parser goes is refused
// before it is stored (the effect happened: the action goes to review),
// not retried until RecordTimeout and left in flight.
func testDeeplyNestedResult(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{RecordTimeout: 2 * time.Second})
	res, err := once.Do(ctx(t), c, intent(1), func(context.Context, once.Attempt) (any, error) { return nested(1200), nil })
	if !errors.Is(err, once.ErrResultNotJSON) || res.Value == nil {
		t.Fatalf("Do = %v; want the value back with ErrResultNotJSON", err)
	}
	if a := mustGet(t, s, keyOf(t, intent(1))); a.Status != once.StatusReview {
		t.Fatalf("stored %s, want review", a.Status)
	}
	if _, err := once.Do(ctx(t), c, intent(2), func(context.Context, once.Attempt) (any, error) { return nested(100), nil }); err != nil {
		t.Fatalf("a result nested 100 deep: %v", err)
	}
}

// A verifier's error text is stored in the trail too: with a NUL byte in
// it, recovery must still record the deferral, not fail on every pass.
func testUnstorableVerifierError(t *testing.T, h Harness) {
	pol := once.KindPolicy{Recovery: once.VerifyThenDecide, VerifyBackoff: time.Hour,
		Verifier: func(context.Context, once.Action) (bool, json.RawMessage, error) {
			return false, nil, errors.New(badText)
		}}
	s, c, _ := setup(t, h, once.Config{Default: pol, RecordTimeout: 2 * time.Second})
	once.Do(ctx(t), c, intent(1), func(context.Context, once.Attempt) (int, error) { return 0, errors.New("timeout") })
	time.Sleep(5 * time.Millisecond)
	r, _ := once.NewReaper(c, once.ReaperConfig{})
	rep, err := r.RunOnce(ctx(t))
	if err != nil || rep.Deferred != 1 {
		t.Fatalf("reaper = %+v, %v; want the verifier failure recorded as a deferral", rep, err)
	}
	evs, _ := s.Events(ctx(t), keyOf(t, intent(1)))
	for _, e := range evs {
		storable(t, "an event note", e.Note)
	}
}

// A store tells the data it refuses from an outage: the first matches
// ErrRejected, so the engine stops sending it again.
func testRejectedIsNotAnOutage(t *testing.T, h Harness) {
	s, _, _ := setup(t, h, once.Config{})
	req := claimReq(t, intent(1), time.Hour)
	if _, err := s.Claim(ctx(t), req); err != nil {
		t.Fatal(err)
	}
	_, err := s.Transition(ctx(t), once.Transition{Key: req.Key, Attempt: 1, From: []once.Status{once.StatusInFlight}, To: "no_such_status"})
	if !errors.Is(err, once.ErrRejected) {
		t.Fatalf("a status the schema refuses = %v; want it to match ErrRejected", err)
	}
	if _, err := s.Get(ctx(t), "0000"); errors.Is(err, once.ErrRejected) {
		t.Fatalf("not found matches ErrRejected: %v", err)
	}
}

// operator is a client over the same store that knows none of the
// application's kinds, as the command's reaper and purge are.
func operator(t *testing.T, s once.Store) *once.Client {
	t.Helper()
	c, err := once.New(once.Config{Store: s})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The policy travels with the data: a reaper that was told nothing about
// the kind (the command's) releases a dead RetryWithProviderKey claim,
// as the application would, instead of asking a person.
func testOperatorReaperAppliesRowRecovery(t *testing.T, h Harness) {
	s, _, spec := setup(t, h, policyConfig(once.KindPolicy{Recovery: once.RetryWithProviderKey}))
	deadWorker(t, s, spec)
	r, err := once.NewReaper(operator(t, s), once.ReaperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := r.RunOnce(ctx(t)); err != nil || rep.Released != 1 || rep.Review != 0 {
		t.Fatalf("operator's reaper = %+v, %v; want the dead claim released, as its kind says", rep, err)
	}
	if a := mustGet(t, s, processKey()); a.Status != once.StatusReleased || a.Recovery != once.RetryWithProviderKey {
		t.Fatalf("stored %s (recovery %v), want released under retry_with_provider_key", a.Status, a.Recovery)
	}
}

// A VerifyThenDecide action is decided only where its verifier is: a
// reaper without it leaves the action alone (not to review unasked), and
// the application's reaper asks the verifier.
func testOnlyAVerifierDecides(t *testing.T, h Harness) {
	asked := 0
	pol := once.KindPolicy{Recovery: once.VerifyThenDecide, Verifier: func(context.Context, once.Action) (bool, json.RawMessage, error) {
		asked++
		return true, json.RawMessage(`"found"`), nil
	}}
	s, c, _ := setup(t, h, once.Config{Default: pol})
	once.Do(ctx(t), c, intent(1), func(context.Context, once.Attempt) (int, error) { return 0, errors.New("timeout") })
	time.Sleep(5 * time.Millisecond)
	blind, err := once.NewReaper(operator(t, s), once.ReaperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := blind.RunOnce(ctx(t)); err != nil || rep.Examined != 0 {
		t.Fatalf("a reaper without the verifier = %+v, %v; want the action left alone", rep, err)
	}
	if a := mustGet(t, s, keyOf(t, intent(1))); a.Status != once.StatusUnknown {
		t.Fatalf("stored %s, want still unknown", a.Status)
	}
	// Nor does a worker without the verifier decide it inline.
	if _, err := once.Do(ctx(t), operator(t, s), intent(1), func(context.Context, once.Attempt) (int, error) {
		t.Error("ran the effect of an action awaiting its verifier")
		return 0, nil
	}); !errors.Is(err, once.ErrOutcomeUnknown) {
		t.Fatalf("Do without the verifier = %v; want the outcome unknown", err)
	}
	r, _ := once.NewReaper(c, once.ReaperConfig{})
	if rep, err := r.RunOnce(ctx(t)); err != nil || rep.Verified != 1 || asked != 1 {
		t.Fatalf("the application's reaper = %+v, %v (asked %d); want it verified", rep, err, asked)
	}
}

// Purge deletes by each action's own deadline, set from the retention
// its kind had: a purge that knows no kinds (the command's) keeps an
// action whose kind keeps it longer than the default, and deletes one
// whose kind keeps it shorter.
func testPurgeByRowDeadline(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{Kinds: map[string]once.KindPolicy{
		"long":  {Retention: 90 * 24 * time.Hour},
		"short": {Retention: time.Millisecond},
	}})
	ok := func(context.Context, once.Attempt) (int, error) { return 1, nil }
	long, short := once.Intent{Run: "p", Kind: "long"}, once.Intent{Run: "p", Kind: "short"}
	once.Do(ctx(t), c, long, ok)
	once.Do(ctx(t), c, short, ok)
	a := mustGet(t, s, keyOf(t, long))
	if a.Retention != 90*24*time.Hour || a.RetainUntil.Before(a.CompletedAt.Add(89*24*time.Hour)) {
		t.Fatalf("stored retention %v until %v; want the kind's 90 days", a.Retention, a.RetainUntil)
	}
	time.Sleep(10 * time.Millisecond)
	n, err := operator(t, s).Purge(ctx(t), once.PurgeOptions{})
	if err != nil || n != 1 {
		t.Fatalf("operator's purge = %d, %v; want the short-lived action only", n, err)
	}
	if _, err := s.Get(ctx(t), keyOf(t, long)); err != nil {
		t.Fatalf("the 90-day action was purged: %v", err)
	}
	if _, err := s.Get(ctx(t), keyOf(t, short)); !errors.Is(err, once.ErrNotFound) {
		t.Fatalf("the short-lived action survived: %v", err)
	}
	// An explicit age overrides the deadlines.
	if n, err := operator(t, s).Purge(ctx(t), once.PurgeOptions{OlderThan: time.Millisecond}); err != nil || n != 1 {
		t.Fatalf("purge older than 1ms = %d, %v; want the 90-day action too", n, err)
	}
}

// Every event names the process that wrote it (Config.Origin, by default
// host and process id), so an operator can tell which machine claimed,
// which recovered and from where a person decided.
func testEventsNameTheirOrigin(t *testing.T, h Harness) {
	s, worker, spec := setup(t, h, once.Config{Origin: "worker-host:101"})
	other, err := h.Open(ctx(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeStore(other) })
	console, err := once.New(once.Config{Store: other, Origin: "console-host:202"})
	if err != nil {
		t.Fatal(err)
	}
	once.Do(ctx(t), worker, intent(1), func(context.Context, once.Attempt) (int, error) { return 0, errors.New("reset after DATA") })
	k := keyOf(t, intent(1))
	if _, err := console.Resolve(ctx(t), k, once.Resolution{Decision: once.DecisionDone, By: "ada", Note: "in the log"}); err != nil {
		t.Fatal(err)
	}
	evs, err := s.Events(ctx(t), k)
	if err != nil {
		t.Fatal(err)
	}
	want := map[once.EventType]string{once.EventClaimed: "worker-host:101", once.EventReview: "worker-host:101", once.EventResolved: "console-host:202"}
	if len(evs) != len(want) {
		t.Fatalf("trail %+v", evs)
	}
	for _, e := range evs {
		if e.Origin != want[e.Type] {
			t.Errorf("%s event from %q, want %q", e.Type, e.Origin, want[e.Type])
		}
	}
	// The default names this host and process.
	c, err := once.New(once.Config{Store: s})
	if err != nil {
		t.Fatal(err)
	}
	if o := c.Origin(); !strings.Contains(o, ":") || strings.HasPrefix(o, ":") {
		t.Errorf("default origin %q; want host:pid", o)
	}
}

// A person's decision on a failed action does not take the worker's
// failure out of the trail: whatever the person decides, the trail still
// shows the attempt that failed, then the decision. (A store may leave a
// first attempt's outcome unwritten while the row describes it; the
// decision changes the row.)
func testResolvedFailureKeepsItsOutcome(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{})
	for i, d := range []once.Decision{once.DecisionDone, once.DecisionRetry, once.DecisionAbandon} {
		in := intent(int64(700 + i))
		_, err := once.Do(ctx(t), c, in, func(context.Context, once.Attempt) (int, error) {
			return 0, once.Permanent(errors.New("mailbox does not exist"))
		})
		if err == nil {
			t.Fatalf("%s: the failing effect returned no error", d)
		}
		k := keyOf(t, in)
		if a := mustGet(t, s, k); a.Status != once.StatusFailed || a.Attempt != 1 {
			t.Fatalf("%s: stored %s attempt %d, want failed attempt 1", d, a.Status, a.Attempt)
		}
		if _, err := c.Resolve(ctx(t), k, once.Resolution{Decision: d, By: "ops@example.com", Note: "checked", Attempt: 1}); err != nil {
			t.Fatalf("%s: Resolve: %v", d, err)
		}
		if got := trail(t, s, k); got != "claimed,failed,resolved" {
			t.Fatalf("%s: trail %s, want claimed,failed,resolved", d, got)
		}
		evs, err := s.Events(ctx(t), k)
		if err != nil {
			t.Fatal(err)
		}
		if f := evs[1]; f.Attempt != 1 || f.From != once.StatusInFlight || f.To != once.StatusFailed || f.Actor != once.ActorWorker || f.At.After(evs[2].At) {
			t.Fatalf("%s: the failure reads %+v, want attempt 1 in_flight->failed by the worker, before the decision %+v", d, f, evs[2])
		}
		recent, err := s.RecentEvents(ctx(t), []once.EventType{once.EventFailed}, 50)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range recent {
			if e.Key == k {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("%s: RecentEvents lists the failure %d times, want once", d, n)
		}
	}
}

// A stored result that does not decode into Do's T (a person's Done
// with a result in their own shape, or what a verifier found) must not
// loop the job: the effect happened. Do says what did not decode, into
// which type, and Dispose takes the job off the queue for a person
// (drop), never retry, which would fail the same way on every delivery.
func testUndecodableResultSettles(t *testing.T, h Harness) {
	verified := once.KindPolicy{Recovery: once.VerifyThenDecide, Lease: time.Second,
		Verifier: func(context.Context, once.Action) (bool, json.RawMessage, error) {
			return true, json.RawMessage(`{"message_id":"<7@mx>"}`), nil
		}}
	_, c, _ := setup(t, h, once.Config{Kinds: map[string]once.KindPolicy{"verified": verified}})
	for _, tc := range []struct {
		name   string
		in     once.Intent
		decide func(k once.Key)
	}{
		{"PersonDone", once.Intent{Run: "undecodable", Kind: "send_email", Target: "ada@example.com"}, func(k once.Key) {
			if _, err := c.Resolve(ctx(t), k, once.Resolution{Decision: once.DecisionDone, Result: json.RawMessage(`{"seen":"in the mail log"}`),
				By: "ada", Note: "in the mail log"}); err != nil {
				t.Fatal(err)
			}
		}},
		{"VerifierLanded", once.Intent{Run: "undecodable", Kind: "verified", Target: "ada@example.com"}, func(once.Key) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := once.Do(ctx(t), c, tc.in, func(context.Context, once.Attempt) (int, error) {
				return 0, errors.New("connection reset after DATA")
			}); !errors.Is(err, once.ErrOutcomeUnknown) {
				t.Fatalf("Do = %v, want the outcome unknown", err)
			}
			k := keyOf(t, tc.in)
			tc.decide(k)
			var effects counter
			var err error
			for range 50 {
				// The verifier is asked once the unknown outcome is due.
				if _, err = once.Do(ctx(t), c, tc.in, func(context.Context, once.Attempt) (int, error) {
					effects.n.Add(1)
					return 1, nil
				}); !errors.Is(err, once.ErrOutcomeUnknown) {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if !errors.Is(err, once.ErrResultUndecodable) || effects.n.Load() != 0 {
				t.Fatalf("Do = %v (ran %d); want ErrResultUndecodable and nothing run", err, effects.n.Load())
			}
			var de *once.DecodeError
			if !errors.As(err, &de) || de.Key != k || de.Type != "int" || len(de.Result) == 0 || !strings.Contains(err.Error(), "int") {
				t.Fatalf("error %v; want a *DecodeError naming the key, the type int and the stored result", err)
			}
			if d := once.Dispose(err); d.Action != once.JobDrop {
				t.Fatalf("Dispose = %+v; want drop: the effect happened, and every delivery would fail the same way", d)
			}
		})
	}
}
