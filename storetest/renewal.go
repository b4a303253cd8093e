package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncehq/once"
)

// The renewal before the effect, and takeovers abandoned before it:
// when too little of a claim's lease is left to start on, Do renews it
// first, and a renewal that fails runs nothing; a takeover whose caller
// is gone before its effect runs nothing either, and says so.

func renewalTests() []namedTest {
	return []namedTest{
		{name: "FailedRenewalReleasesTheUnrunClaim", fn: testFailedRenewalReleasesTheUnrunClaim, needs: needFaults, serial: true},
		{name: "FailedRenewalAndReleaseSayNothingRan", fn: testFailedRenewalAndReleaseSayNothingRan, needs: needFaults, serial: true},
		{name: "FailedRenewalOfATakeoverAsksTheVerifierAgain", fn: testFailedRenewalOfATakeoverAsksTheVerifierAgain, needs: needFaults, serial: true},
		{name: "CallerGoneAfterATakeoverAsksTheVerifierAgain", fn: testCallerGoneAfterATakeoverAsksTheVerifierAgain},
		{name: "AbandonedTakeoverTrailSaysNothingRan", fn: testAbandonedTakeoverTrailSaysNothingRan},
		{name: "TwiceAbandonedTakeoverBlamesNoAttemptThatNeverRan", fn: testTwiceAbandonedTakeoverBlamesNoAttemptThatNeverRan},
		{name: "AbandonedRetryTakeoverIsReleased", fn: testAbandonedRetryTakeoverIsReleased},
		{name: "AbandonedTakeoverPausedPastItsLeaseIsFenced", fn: testAbandonedTakeoverPausedPastItsLeaseIsFenced, serial: true},
	}
}

// lockOnExecute is an OnExecute hook that, when the given attempt
// starts, locks its action's row for hold (Faults.Lock), so that the
// renewal before the effect, and whatever writes the row after it, wait;
// then it holds the worker for pause. The lock's end, or its failure,
// comes on the channel.
func lockOnExecute(f Faults, attempt int, hold, pause time.Duration) (func(context.Context, once.Observation) (context.Context, func(once.Observation, error)), <-chan error) {
	locked := make(chan error, 1)
	return func(ctx context.Context, o once.Observation) (context.Context, func(once.Observation, error)) {
		if o.Event.Attempt != attempt {
			return ctx, nil
		}
		unlock, err := f.Lock(ctx, o.Event.Key)
		if err != nil {
			locked <- err
			return ctx, nil
		}
		time.AfterFunc(hold, func() { locked <- unlock() })
		time.Sleep(pause)
		return ctx, nil
	}, locked
}

// renewalStore is a migrated store and the faults of its database, for
// Faults.Lock.
func renewalStore(t *testing.T, h Harness) (once.Store, Faults) {
	s, spec := newStore(t, h)
	_, f := h.Faults(t, spec)
	return s, f
}

// FailedRenewalReleasesTheUnrunClaim: when too little of a claim's
// lease is left to start the effect on (a hook held the worker up) and
// its renewal fails because the database is slow (here, a lock on the
// row held past the renewal's deadline), nothing runs, and the claim is
// released for the next delivery, not left in flight for recovery to
// put to a person as an effect that may have happened.
func testFailedRenewalReleasesTheUnrunClaim(t *testing.T, h Harness) {
	s, f := renewalStore(t, h)
	ctx := context.Background()
	const lease = 1500 * time.Millisecond
	// The row locked past the renewal's deadline (a third of the
	// lease), and the worker held past the point where enough lease is
	// left to start on; the next attempt is left alone.
	hook, locked := lockOnExecute(f, 1, lease, lease*8/15)
	c, err := once.New(once.Config{Store: s,
		Kinds: map[string]once.KindPolicy{"send_email": {Lease: lease, Recovery: once.AskPerson}},
		Hooks: once.Hooks{OnExecute: hook}})
	if err != nil {
		t.Fatal(err)
	}
	in := once.Intent{Run: "renewal", Kind: "send_email", Target: "ada@example.com", Payload: "hello"}
	ran := false
	res, err := once.Do(ctx, c, in, func(context.Context, once.Attempt) (string, error) {
		ran = true
		return "sent", nil
	})
	if lerr := <-locked; lerr != nil {
		t.Fatal(lerr)
	}
	if ran {
		t.Fatal("the effect ran on a lease that could not be renewed")
	}
	if err == nil {
		t.Fatalf("Do = %+v, want an error: the lease could not be renewed", res)
	}
	a, gerr := s.Get(ctx, keyOf(t, in))
	if gerr != nil {
		t.Fatal(gerr)
	}
	if a.Status != once.StatusReleased || !errors.Is(err, once.ErrRetryLater) {
		t.Errorf("after a failed renewal the action is %s (%q) and Do said %v; want it released, and Do to say retry later", a.Status, a.Error, err)
	}
	// The next delivery runs it.
	res, err = once.Do(ctx, c, in, func(context.Context, once.Attempt) (string, error) { return "sent", nil })
	if err != nil || res.Replayed || res.Value != "sent" {
		t.Errorf("the next delivery = %+v, %v; want it to run the effect", res, err)
	}
}

// FailedRenewalAndReleaseSayNothingRan: the renewal before the
// effect fails (the row is locked past its deadline) and so does the
// release of the unrun claim (locked past RecordTimeout). Nothing ran,
// and Do's error says so, and why: the renewal failed, and the release
// was not recorded (it may yet commit; the claim may stay in flight).
func testFailedRenewalAndReleaseSayNothingRan(t *testing.T, h Harness) {
	s, f := renewalStore(t, h)
	ctx := context.Background()
	const lease = 1500 * time.Millisecond
	// Held past the renewal (Lease/3) and the release's RecordTimeout.
	hook, locked := lockOnExecute(f, 1, 4*time.Second, lease*8/15)
	c, err := once.New(once.Config{Store: s, RecordTimeout: time.Second,
		Kinds: map[string]once.KindPolicy{"send_email": {Lease: lease, Recovery: once.AskPerson}},
		Hooks: once.Hooks{OnExecute: hook}})
	if err != nil {
		t.Fatal(err)
	}
	in := once.Intent{Run: "renewal-2", Kind: "send_email", Target: "ada@example.com", Payload: "hello"}
	ran := false
	_, err = once.Do(ctx, c, in, func(context.Context, once.Attempt) (string, error) {
		ran = true
		return "sent", nil
	})
	if lerr := <-locked; lerr != nil {
		t.Fatal(lerr)
	}
	if ran {
		t.Fatal("the effect ran")
	}
	t.Logf("Do: %v", err)
	if err == nil {
		t.Fatal("Do = nil, want an error")
	}
	if !strings.Contains(err.Error(), "could not be renewed") || !strings.Contains(err.Error(), "nothing ran") {
		t.Errorf("Do's error does not say the renewal failed and nothing ran: %v", err)
	}
	a, gerr := s.Get(ctx, keyOf(t, in))
	if gerr != nil {
		t.Fatal(gerr)
	}
	t.Logf("row: %s attempt %d %q", a.Status, a.Attempt, a.Error)
}

// FailedRenewalOfATakeoverAsksTheVerifierAgain: attempt 1's
// worker died with its effect's outcome unknown. A delivery recovers it
// under VerifyThenDecide: the verifier (slow: the provider is eventually
// consistent) finds no trace yet, and the action is taken over as
// attempt 2. The verifier used up the lease counted from before recovery,
// so the takeover is renewed before the effect, and the renewal fails (the
// row locked past Lease/3). Attempt 2 must not be released: attempt 1's
// outcome is still unknown, and a released action's next delivery would
// run the effect without asking the verifier again, though attempt 1's
// effect has landed by then. It stays in flight, its lease lapses, and
// recovery asks the verifier again, which finds the effect landed.
func testFailedRenewalOfATakeoverAsksTheVerifierAgain(t *testing.T, h Harness) {
	s, f := renewalStore(t, h)
	ctx := context.Background()
	const lease = 1500 * time.Millisecond
	provider := &lateProvider{pause: lease * 8 / 15}
	hook, locked := lockOnExecute(f, 2, lease, 0)
	c, err := once.New(once.Config{Store: s,
		Kinds: map[string]once.KindPolicy{"send_email": {Lease: lease, Recovery: once.VerifyThenDecide, Verifier: provider.verify}},
		Hooks: once.Hooks{OnExecute: hook}})
	if err != nil {
		t.Fatal(err)
	}
	in := once.Intent{Run: "verify", Kind: "send_email", Target: "ada@example.com", Payload: "hello"}
	// Attempt 1: claimed by a worker that died; its effect is in the
	// provider's pipeline, not yet visible.
	k := deadClaim(t, s, in, once.VerifyThenDecide)

	var runs atomic.Int32
	effect := func(context.Context, once.Attempt) (string, error) {
		runs.Add(1)
		return "sent", nil
	}
	_, err = once.Do(ctx, c, in, effect)
	if lerr := <-locked; lerr != nil {
		t.Fatal(lerr)
	}
	a, _ := s.Get(ctx, k)
	t.Logf("delivery 2: %v; row %s attempt %d %q", err, a.Status, a.Attempt, a.Error)

	// Attempt 1's effect lands at the provider now.
	provider.landed.Store(true)
	// The old path: the lease of attempt 2 lapses before the next delivery.
	time.Sleep(lease + 500*time.Millisecond)
	res, err := once.Do(ctx, c, in, effect)
	a, _ = s.Get(ctx, k)
	t.Logf("delivery 3: %+v, %v; row %s attempt %d; verifier asked %d times; effect ran %d times here (+1 by attempt 1)", res, err, a.Status, a.Attempt, provider.verifies.Load(), runs.Load())
	if runs.Load() != 0 {
		t.Errorf("the effect ran again (%d) without the verifier being asked after attempt 1's outcome was left unknown; it had landed, so it happened twice", runs.Load())
	}
}

// CallerGoneAfterATakeoverAsksTheVerifierAgain: a caller whose
// context ends between taking a claim over and starting its effect runs
// nothing, and does not release the takeover: it marks it unknown, due
// at once. Released, it would let the next delivery run the effect
// without the verifier being asked again, while attempt 1's effect,
// which the verifier did not yet see, may still land. Here the caller's
// context ends while a hook observes the takeover (a slow hook, a
// deadline reached during the verification), and the next delivery
// comes at once.
func testCallerGoneAfterATakeoverAsksTheVerifierAgain(t *testing.T, h Harness) {
	s, _ := newStore(t, h)
	const lease = time.Second
	provider := &lateProvider{}
	c, err := once.New(once.Config{Store: s,
		Kinds: map[string]once.KindPolicy{"send_email": {Lease: lease, Recovery: once.VerifyThenDecide, Verifier: provider.verify}},
		Hooks: once.Hooks{OnEvent: cancelOnTakeover}})
	if err != nil {
		t.Fatal(err)
	}
	in := once.Intent{Run: "verify", Kind: "send_email", Target: "ada@example.com", Payload: "hello"}
	bg := context.Background()
	// Attempt 1: claimed by a worker that died; its effect is in the
	// provider's pipeline, not yet visible.
	k := deadClaim(t, s, in, once.VerifyThenDecide)

	var runs atomic.Int32
	effect := func(context.Context, once.Attempt) (string, error) {
		runs.Add(1)
		return "sent", nil
	}
	ctx, cancel := context.WithCancel(bg)
	_, err = once.Do(context.WithValue(ctx, cancelKey{}, cancel), c, in, effect)
	cancel()
	a, gerr := s.Get(bg, k)
	if gerr != nil {
		t.Fatal(gerr)
	}
	if !errors.Is(err, context.Canceled) || runs.Load() != 0 {
		t.Fatalf("delivery 2, its caller gone after the takeover: %v, the effect ran %d times; want context.Canceled and nothing run", err, runs.Load())
	}
	if a.Status != once.StatusUnknown || a.Attempt != 2 {
		t.Errorf("after delivery 2 the row is %s, attempt %d; want the takeover, attempt 2, unknown", a.Status, a.Attempt)
	}

	// Attempt 1's effect lands at the provider now; the next delivery
	// comes at once.
	provider.landed.Store(true)
	asked := provider.verifies.Load()
	res, err := deliverWhenDue(bg, c, in, effect)
	if runs.Load() != 0 {
		t.Errorf("the effect ran again (%d) without the verifier being asked after the takeover was abandoned; attempt 1's had landed, so it happened twice", runs.Load())
	}
	if err != nil || res.Value != "sent" || provider.verifies.Load() == asked {
		t.Errorf("delivery 3: %+v, %v, verifier asked %d times before and %d after; want the verifier asked again and its result replayed", res, err, asked, provider.verifies.Load())
	}
}

// cancelKey carries, in a Do call's context, the function that cancels it.
type cancelKey struct{}

// AbandonedTakeoverTrailSaysNothingRan: the trail says that a
// takeover abandoned before its effect never ran, and a person who is
// asked later (the verifier could not tell) reads that, not that
// attempt 2's worker stopped answering, as if it might have sent too.
func testAbandonedTakeoverTrailSaysNothingRan(t *testing.T, h Harness) {
	s, _ := newStore(t, h)
	c, err := once.New(once.Config{Store: s,
		Kinds: map[string]once.KindPolicy{"send_email": {Lease: time.Second, Recovery: once.VerifyThenDecide, MaxVerifyFailures: 1,
			Verifier: func(ctx context.Context, a once.Action) (bool, json.RawMessage, error) {
				if a.Attempt == 1 {
					return false, nil, nil // no trace of attempt 1: take over
				}
				return false, nil, errors.New("provider API down")
			}}},
		Hooks: once.Hooks{OnEvent: cancelOnTakeover}})
	if err != nil {
		t.Fatal(err)
	}
	in := once.Intent{Run: "trail", Kind: "send_email", Target: "ada@example.com", Payload: "hello"}
	k := deadClaim(t, s, in, once.VerifyThenDecide)
	effect := neverRuns(t)
	ctx, cancel := context.WithCancel(context.Background())
	_, err = once.Do(context.WithValue(ctx, cancelKey{}, cancel), c, in, effect)
	cancel()
	if !errors.Is(err, context.Canceled) || !errors.Is(err, once.ErrRetryLater) {
		t.Errorf("delivery 2, its caller gone after the takeover: %v; want context.Canceled and ErrRetryLater", err)
	}
	_, err = deliverWhenDue(context.Background(), c, in, effect)
	if !errors.Is(err, once.ErrReview) {
		t.Errorf("delivery 3, the verifier unable to tell: %v; want the action put up for review", err)
	}
	a, err := c.Get(context.Background(), k)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := c.Events(context.Background(), k)
	if err != nil {
		t.Fatal(err)
	}
	var trail []string
	said := false
	for _, e := range evs {
		trail = append(trail, string(e.Type)+"#"+strconv.Itoa(e.Attempt)+": "+e.Note)
		said = said || (e.Attempt == 2 && strings.Contains(e.Note, "never ran"))
	}
	if a.Status != once.StatusReview || !said || strings.Contains(a.Error, "stopped answering") {
		t.Errorf("the row is %s, its reason %q, and the trail:\n%s\nwant it put up for review, with an entry saying attempt 2 never ran, and no worker said to have stopped answering",
			a.Status, a.Error, strings.Join(trail, "\n"))
	}
}

// TwiceAbandonedTakeoverBlamesNoAttemptThatNeverRan: when a takeover
// is abandoned, then the next one too, the trail says of each that it
// never ran, and neither note names the other as the attempt whose
// effect may have happened.
func testTwiceAbandonedTakeoverBlamesNoAttemptThatNeverRan(t *testing.T, h Harness) {
	s, _ := newStore(t, h)
	c, err := once.New(once.Config{Store: s,
		Kinds: map[string]once.KindPolicy{"send_email": {Lease: time.Second, Recovery: once.VerifyThenDecide, Verifier: (&lateProvider{}).verify}},
		Hooks: once.Hooks{OnEvent: cancelOnTakeover}})
	if err != nil {
		t.Fatal(err)
	}
	in := once.Intent{Run: "twice", Kind: "send_email", Target: "ada@example.com", Payload: "hello"}
	k := deadClaim(t, s, in, once.VerifyThenDecide)
	effect := neverRuns(t)
	// Deliveries whose callers are gone after each takeover, until two
	// takeovers were abandoned (a delivery that comes before the
	// unknown is due is only answered).
	for a, n := (once.Action{}), 0; a.Attempt < 3; n++ {
		if n == 20 {
			t.Fatalf("after %d deliveries the row is %s at attempt %d; want two takeovers abandoned", n, a.Status, a.Attempt)
		}
		ctx, cancel := context.WithCancel(context.Background())
		_, err := once.Do(context.WithValue(ctx, cancelKey{}, cancel), c, in, effect)
		cancel()
		var ue *once.UnknownOutcomeError
		if !errors.As(err, &ue) {
			t.Fatalf("an abandoned takeover: %v; want an *UnknownOutcomeError", err)
		}
		time.Sleep(max(time.Until(ue.Due), 0) + time.Millisecond)
		if a, err = s.Get(context.Background(), k); err != nil {
			t.Fatal(err)
		}
	}
	evs, err := c.Events(context.Background(), k)
	if err != nil {
		t.Fatal(err)
	}
	var trail []string
	never := map[int]bool{}
	for _, e := range evs {
		trail = append(trail, string(e.Type)+"#"+strconv.Itoa(e.Attempt)+": "+e.Note)
		if e.Type == once.EventUnknown {
			never[e.Attempt] = strings.HasPrefix(e.Note, "attempt "+strconv.Itoa(e.Attempt)+", a takeover, never ran")
		}
	}
	for _, e := range evs {
		for a := 2; a <= 3; a++ {
			if strings.Contains(e.Note, "attempt "+strconv.Itoa(a)+" is still unknown") || strings.Contains(e.Note, "outcome of attempt "+strconv.Itoa(a)) {
				t.Errorf("a note names attempt %d, which never ran, as one whose outcome is unknown: %q", a, e.Note)
			}
		}
	}
	if !never[2] || !never[3] {
		t.Errorf("the trail does not say of attempts 2 and 3 that they never ran:\n%s", strings.Join(trail, "\n"))
	}
}

// AbandonedRetryTakeoverIsReleased: under RetryWithProviderKey, a
// takeover abandoned before its effect is released, as a first claim
// is: its next attempt carries the provider's key, which absorbs a late
// attempt 1, and the next delivery runs it at once instead of waiting a
// lease for a claim nobody holds.
func testAbandonedRetryTakeoverIsReleased(t *testing.T, h Harness) {
	s, _ := newStore(t, h)
	c, err := once.New(once.Config{Store: s,
		Kinds: map[string]once.KindPolicy{"charge": {Lease: 2 * time.Second, Recovery: once.RetryWithProviderKey}},
		Hooks: once.Hooks{OnEvent: cancelOnTakeover}})
	if err != nil {
		t.Fatal(err)
	}
	in := once.Intent{Run: "retry", Kind: "charge", Target: "cus_1", Payload: "10"}
	deadClaim(t, s, in, once.RetryWithProviderKey)
	var runs atomic.Int32
	effect := func(context.Context, once.Attempt) (string, error) {
		runs.Add(1)
		return "ch_1", nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	_, err = once.Do(context.WithValue(ctx, cancelKey{}, cancel), c, in, effect)
	cancel()
	if !errors.Is(err, context.Canceled) || runs.Load() != 0 {
		t.Fatalf("delivery 2, its caller gone after the takeover: %v, ran %d times; want context.Canceled and nothing run", err, runs.Load())
	}
	res, err := once.Do(context.Background(), c, in, effect)
	if err != nil || runs.Load() != 1 || res.Value != "ch_1" {
		t.Errorf("delivery 3, at once: %+v, %v, ran %d times; want the effect run once, with the provider's key", res, err, runs.Load())
	}
}

// cancelOnTakeover is an OnEvent hook that cancels the Do call whose
// context carries a cancelKey when it takes an action over.
func cancelOnTakeover(ctx context.Context, o once.Observation) {
	if o.Event.Type == once.EventTakenOver {
		if cancel, ok := ctx.Value(cancelKey{}).(context.CancelFunc); ok {
			cancel()
		}
	}
}

// deadClaim claims in's key as attempt 1 of a worker that died at once:
// its lease, a millisecond, has lapsed when it returns.
func deadClaim(t *testing.T, s once.Store, in once.Intent, recovery once.Recovery) once.Key {
	t.Helper()
	k, fp, err := once.KeyOf(in)
	if err != nil {
		t.Fatal(err)
	}
	payload, err := json.Marshal(in.Payload)
	if err != nil {
		t.Fatal(err)
	}
	if cr, err := s.Claim(context.Background(), once.ClaimRequest{Key: k, Fingerprint: fp, Run: in.Run, Step: in.Step, Kind: in.Kind,
		Target: in.Target, Payload: payload, Lease: time.Millisecond, Recovery: recovery}); err != nil || !cr.Claimed {
		t.Fatalf("claim: %+v, %v", cr, err)
	}
	time.Sleep(50 * time.Millisecond)
	return k
}

// deliverWhenDue runs Do as a queue redelivers: again, when it said the
// action is unknown and due for recovery a moment later, once that
// moment came (for up to five seconds).
func deliverWhenDue(ctx context.Context, c *once.Client, in once.Intent, effect func(context.Context, once.Attempt) (string, error)) (once.Result[string], error) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		res, err := once.Do(ctx, c, in, effect)
		var ue *once.UnknownOutcomeError
		if !errors.As(err, &ue) || ue.Status != once.StatusUnknown || time.Now().After(deadline) {
			return res, err
		}
		time.Sleep(max(time.Until(ue.Due), 0) + time.Millisecond)
	}
}

// lateProvider is a provider at which attempt 1's effect lands late:
// its verifier finds it only once landed is set, and otherwise, after
// pause, finds no trace of it.
type lateProvider struct {
	verifies atomic.Int32
	landed   atomic.Bool
	pause    time.Duration
}

func (p *lateProvider) verify(context.Context, once.Action) (bool, json.RawMessage, error) {
	p.verifies.Add(1)
	if p.landed.Load() {
		return true, json.RawMessage(`"sent"`), nil
	}
	time.Sleep(p.pause)
	return false, nil, nil
}

// AbandonedTakeoverPausedPastItsLeaseIsFenced: a worker that took an
// action over pauses past its lease, another takes it over meanwhile
// and runs the effect, and then the first, its caller gone, abandons its
// takeover: its mark as unknown is refused by the newer attempt
// (*FencedError), and the newer attempt's outcome stands.
func testAbandonedTakeoverPausedPastItsLeaseIsFenced(t *testing.T, h Harness) {
	s, _ := newStore(t, h)
	const lease = 300 * time.Millisecond
	kinds := map[string]once.KindPolicy{"send_email": {Lease: lease, Recovery: once.VerifyThenDecide, Verifier: (&lateProvider{}).verify}}
	other, err := once.New(once.Config{Store: s, Kinds: kinds})
	if err != nil {
		t.Fatal(err)
	}
	in := once.Intent{Run: "paused", Kind: "send_email", Target: "ada@example.com", Payload: "hello"}
	var runs atomic.Int32
	effect := func(context.Context, once.Attempt) (string, error) {
		runs.Add(1)
		return "sent", nil
	}
	var newer error
	paused, err := once.New(once.Config{Store: s, Kinds: kinds,
		Hooks: once.Hooks{OnEvent: func(ctx context.Context, o once.Observation) {
			if o.Event.Type != once.EventTakenOver || o.Event.Attempt != 2 {
				return
			}
			// Paused past attempt 2's lease, while another worker takes
			// the action over as attempt 3 and runs the effect.
			time.Sleep(lease + 100*time.Millisecond)
			_, newer = deliverWhenDue(context.Background(), other, in, effect)
			cancelOnTakeover(ctx, o)
		}}})
	if err != nil {
		t.Fatal(err)
	}
	k := deadClaim(t, s, in, once.VerifyThenDecide)
	ctx, cancel := context.WithCancel(context.Background())
	_, err = once.Do(context.WithValue(ctx, cancelKey{}, cancel), paused, in, effect)
	cancel()
	if newer != nil {
		t.Fatalf("the other worker's delivery: %v", newer)
	}
	a, gerr := s.Get(context.Background(), k)
	if gerr != nil {
		t.Fatal(gerr)
	}
	if !errors.Is(err, once.ErrFenced) || a.Status != once.StatusSucceeded || a.Attempt != 3 || runs.Load() != 1 {
		t.Errorf("the paused worker's abandon: %v; the row %s at attempt %d, the effect run %d times; want *FencedError, attempt 3 succeeded, one run",
			err, a.Status, a.Attempt, runs.Load())
	}
}

// neverRuns is an effect that fails the test if it runs.
func neverRuns(t *testing.T) func(context.Context, once.Attempt) (string, error) {
	return func(context.Context, once.Attempt) (string, error) {
		t.Error("the effect ran")
		return "", nil
	}
}
