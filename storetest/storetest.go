// Package storetest is the conformance suite every once.Store must pass:
// claim races between goroutines and between OS processes, replay,
// fencing, leases by the database's clock, release, permanent failure,
// fingerprint refusal, size limits, bad input and migrations. A store
// package runs it from its tests:
//
//	func TestMain(m *testing.M) {
//		storetest.MaybeChild(open) // worker processes re-enter here
//		os.Exit(m.Run())
//	}
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, storetest.Harness{New: newStore, Open: open})
//	}
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

// Harness tells the suite how to make stores.
type Harness struct {
	// New returns a fresh, isolated, not yet migrated store, and a spec
	// that Open understands, so a worker process can open the same store.
	// It registers its own cleanup.
	New func(t *testing.T) (once.Store, string)
	// Open opens the store a spec names. Worker processes call it.
	Open func(ctx context.Context, spec string) (once.Store, error)
}

// Run runs the whole suite. Subtests run in parallel.
func Run(t *testing.T, h Harness) {
	tests := []namedTest{
		{"MigrateTwice", testMigrateTwice},
		{"MigrateConcurrently", testMigrateConcurrently},
		{"ClaimRace64Goroutines", testClaimRace},
		{"ClaimRace4Processes", testProcessRace},
		{"KilledAfterEffect", testKilledAfterEffect},
		{"Replay", testReplay},
		{"ReplayStruct", testReplayStruct},
		{"FencingStore", testFencingStore},
		{"FencingDo", testFencingDo},
		{"LeaseByDatabaseClock", testLeaseExpiry},
		{"HeartbeatKeepsLease", testHeartbeatKeepsLease},
		{"MaxExecution", testMaxExecution},
		{"RetryLaterReleases", testRelease},
		{"PermanentFailure", testPermanent},
		{"UnknownOutcome", testUnknown},
		{"PanicIsUnknown", testPanic},
		{"FingerprintMismatch", testFingerprint},
		{"FingerprintMismatchAfterRelease", testFingerprintAfterRelease},
		{"PayloadInKey", testPayloadInKey},
		{"CanonicalPayload", testCanonicalPayload},
		{"ResultTooLarge", testResultTooLarge},
		{"BadInputWritesNothing", testBadInput},
		{"GetNotFound", testGetNotFound},
		{"List", testList},
	}
	tests = append(tests, recoveryTests()...)
	tests = append(tests, edgeTests()...)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.fn(t, h)
		})
	}
}

// setup returns a migrated store and a client over it.
func setup(t *testing.T, h Harness, cfg once.Config) (once.Store, *once.Client, string) {
	t.Helper()
	s, spec := h.New(t)
	if err := s.Migrate(ctx(t)); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	cfg.Store = s
	c, err := once.New(cfg)
	if err != nil {
		t.Fatalf("once.New: %v", err)
	}
	childRecovery.Store(spec, c.Policy(processIntent.Kind).Recovery)
	return s, c, spec
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

func intent(step int64) once.Intent {
	return once.Intent{Run: "run-1", Step: step, Kind: "send_email", Target: "ada@example.com", Payload: map[string]any{"subject": "hello", "n": step}}
}

// counter is an effect that counts its executions.
type counter struct{ n atomic.Int64 }

func (c *counter) fn(v string) func(context.Context, once.Attempt) (string, error) {
	return func(context.Context, once.Attempt) (string, error) {
		c.n.Add(1)
		return v, nil
	}
}

func mustGet(t *testing.T, s once.Store, k once.Key) once.Action {
	t.Helper()
	a, err := s.Get(ctx(t), k)
	if err != nil {
		t.Fatalf("Get(%s): %v", k, err)
	}
	return a
}

func keyOf(t *testing.T, in once.Intent) once.Key {
	t.Helper()
	k, _, err := once.KeyOf(in)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func testMigrateTwice(t *testing.T, h Harness) {
	s, _ := h.New(t)
	if v, err := s.Version(ctx(t)); err != nil || v != 0 {
		t.Fatalf("Version before Migrate = %d, %v; want 0", v, err)
	}
	for i := range 2 {
		if err := s.Migrate(ctx(t)); err != nil {
			t.Fatalf("Migrate #%d: %v", i+1, err)
		}
	}
	v, err := s.Version(ctx(t))
	if err != nil || v < 2 {
		t.Fatalf("Version after Migrate = %d, %v", v, err)
	}
	c, _ := once.New(once.Config{Store: s})
	if _, err := once.Do(ctx(t), c, intent(0), (&counter{}).fn("ok")); err != nil {
		t.Fatalf("Do after two migrations: %v", err)
	}
	once.Do(ctx(t), c, intent(1), func(context.Context, once.Attempt) (string, error) { return "", errors.New("lost") })
	recent, err := s.RecentEvents(ctx(t), []once.EventType{once.EventReview, once.EventSucceeded}, 10)
	if err != nil || len(recent) != 2 || recent[0].Type != once.EventReview || recent[1].Type != once.EventSucceeded {
		t.Fatalf("RecentEvents = %+v, %v; want review then succeeded", recent, err)
	}
	if all, _ := s.RecentEvents(ctx(t), nil, 10); len(all) != 4 {
		t.Fatalf("RecentEvents(all) = %d events, want 4", len(all))
	}
}

func testMigrateConcurrently(t *testing.T, h Harness) {
	s, spec := h.New(t)
	const n = 4
	errs := make(chan error, n)
	for i := range n {
		go func() {
			st := s
			if i > 0 {
				// Separate connections, as separate processes would have.
				o, err := h.Open(ctx(t), spec)
				if err != nil {
					errs <- err
					return
				}
				defer closeStore(o)
				st = o
			}
			errs <- st.Migrate(ctx(t))
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Errorf("concurrent Migrate: %v", err)
		}
	}
	c, _ := once.New(once.Config{Store: s})
	if _, err := once.Do(ctx(t), c, intent(0), (&counter{}).fn("ok")); err != nil {
		t.Fatalf("Do after concurrent migrations: %v", err)
	}
}

func closeStore(s once.Store) { s.Close() }

func testClaimRace(t *testing.T, h Harness) {
	_, c, _ := setup(t, h, once.Config{})
	var effects counter
	const n = 64
	var wg sync.WaitGroup
	var replays, inflight, won atomic.Int64
	start := make(chan struct{})
	for range n {
		wg.Go(func() {
			<-start
			res, err := once.Do(ctx(t), c, intent(1), func(ctx context.Context, a once.Attempt) (string, error) {
				effects.n.Add(1)
				time.Sleep(20 * time.Millisecond) // widen the window
				return "sent", nil
			})
			switch {
			case errors.Is(err, once.ErrInFlight):
				inflight.Add(1)
			case err != nil:
				t.Errorf("Do: %v", err)
			case res.Replayed:
				if res.Value != "sent" {
					t.Errorf("replayed %q, want %q", res.Value, "sent")
				}
				replays.Add(1)
			default:
				won.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	if got := effects.n.Load(); got != 1 {
		t.Fatalf("effect ran %d times across %d goroutines, want 1", got, n)
	}
	if won.Load() != 1 || won.Load()+replays.Load()+inflight.Load() != n {
		t.Fatalf("won=%d replays=%d inflight=%d, want 1 winner and %d in all", won.Load(), replays.Load(), inflight.Load(), n)
	}
}

func testReplay(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{})
	var effects counter
	first, err := once.Do(ctx(t), c, intent(1), func(ctx context.Context, a once.Attempt) (string, error) {
		effects.n.Add(1)
		if a.Number != 1 || a.ProviderKey == "" || a.Key != keyOf(t, intent(1)) {
			t.Errorf("attempt = %+v", a)
		}
		return "msg-42", nil
	})
	if err != nil || first.Replayed || first.Value != "msg-42" || first.Attempt != 1 {
		t.Fatalf("first Do = %+v, %v", first, err)
	}
	for range 3 {
		again, err := once.Do(ctx(t), c, intent(1), effects.fn("other"))
		if err != nil || !again.Replayed || again.Value != "msg-42" || again.Key != first.Key {
			t.Fatalf("duplicate Do = %+v, %v; want the stored result replayed", again, err)
		}
	}
	if effects.n.Load() != 1 {
		t.Fatalf("effect ran %d times, want 1", effects.n.Load())
	}
	a := mustGet(t, s, first.Key)
	if a.Status != once.StatusSucceeded || a.Attempt != 1 || string(a.Result) == "" || a.CompletedAt.IsZero() || !a.LeaseUntil.IsZero() {
		t.Fatalf("stored action = %+v", a)
	}
	if a.Run != "run-1" || a.Step != 1 || a.Kind != "send_email" || a.Target != "ada@example.com" || len(a.Payload) == 0 {
		t.Fatalf("stored intent fields = %+v", a)
	}
}

type receipt struct {
	ID       string            `json:"id"`
	Amount   int64             `json:"amount"`
	Tags     []string          `json:"tags"`
	Meta     map[string]string `json:"meta"`
	Accepted time.Time         `json:"accepted"`
}

func testReplayStruct(t *testing.T, h Harness) {
	_, c, _ := setup(t, h, once.Config{})
	want := receipt{ID: "ch_1", Amount: 1999, Tags: []string{"a", "b"}, Meta: map[string]string{"z": "1", "a": "\x00nul"}, Accepted: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)}
	in := once.Intent{Run: "r", Kind: "charge_card", Target: "cus_1", Payload: []byte("raw bytes \xff")}
	if _, err := once.Do(ctx(t), c, in, func(context.Context, once.Attempt) (receipt, error) { return want, nil }); err != nil {
		t.Fatal(err)
	}
	got, err := once.Do(ctx(t), c, in, func(context.Context, once.Attempt) (receipt, error) {
		t.Error("effect ran on replay")
		return receipt{}, nil
	})
	if err != nil || !got.Replayed {
		t.Fatalf("replay: %+v, %v", got, err)
	}
	if got.Value.ID != want.ID || got.Value.Amount != want.Amount || strings.Join(got.Value.Tags, ",") != "a,b" ||
		got.Value.Meta["a"] != "\x00nul" || !got.Value.Accepted.Equal(want.Accepted) {
		t.Fatalf("replayed %+v, want %+v", got.Value, want)
	}
}

func claimReq(t *testing.T, in once.Intent, lease time.Duration) once.ClaimRequest {
	k, fp, err := once.KeyOf(in)
	if err != nil {
		t.Fatal(err)
	}
	return once.ClaimRequest{Key: k, Fingerprint: fp, Run: in.Run, Step: in.Step, Kind: in.Kind, Target: in.Target, Lease: lease}
}

func testFencingStore(t *testing.T, h Harness) {
	s, _, _ := setup(t, h, once.Config{})
	req := claimReq(t, intent(1), time.Hour)
	c1, err := s.Claim(ctx(t), req)
	if err != nil || !c1.Claimed || c1.Action.Attempt != 1 || c1.Action.Status != once.StatusInFlight {
		t.Fatalf("first claim = %+v, %v", c1, err)
	}
	if !c1.Action.LeaseUntil.After(c1.Now) {
		t.Fatalf("lease %v not after db now %v", c1.Action.LeaseUntil, c1.Now)
	}
	dup, err := s.Claim(ctx(t), req)
	if err != nil || dup.Claimed || dup.Action.Attempt != 1 {
		t.Fatalf("duplicate claim = %+v, %v; want refused", dup, err)
	}
	// Recovery releases attempt 1 (its worker is presumed dead) …
	ok, err := s.Transition(ctx(t), once.Transition{Key: req.Key, Attempt: 1, From: []once.Status{once.StatusInFlight}, To: once.StatusReleased, Error: "presumed dead"})
	if err != nil || !ok {
		t.Fatalf("release: %v, %v", ok, err)
	}
	// … and attempt 2 claims.
	c2, err := s.Claim(ctx(t), req)
	if err != nil || !c2.Claimed || c2.Action.Attempt != 2 || c2.Action.Error != "" {
		t.Fatalf("second claim = %+v, %v", c2, err)
	}
	// The presumed-dead attempt 1 comes back: every write it tries is refused.
	if _, held, err := s.Heartbeat(ctx(t), req.Key, 1, time.Hour); err != nil || held {
		t.Fatalf("stale heartbeat held=%v err=%v; want refused", held, err)
	}
	for _, to := range []once.Status{once.StatusSucceeded, once.StatusFailed, once.StatusUnknown, once.StatusReleased} {
		ok, err := s.Transition(ctx(t), once.Transition{Key: req.Key, Attempt: 1, From: []once.Status{once.StatusInFlight, once.StatusReview}, To: to, Result: []byte(`"stale"`)})
		if err != nil || ok {
			t.Fatalf("stale transition to %s = %v, %v; want refused", to, ok, err)
		}
	}
	if _, held, err := s.Heartbeat(ctx(t), req.Key, 2, time.Hour); err != nil || !held {
		t.Fatalf("current heartbeat held=%v err=%v", held, err)
	}
	ok, err = s.Transition(ctx(t), once.Transition{Key: req.Key, Attempt: 2, From: []once.Status{once.StatusInFlight}, To: once.StatusSucceeded, Result: []byte(`"fresh"`)})
	if err != nil || !ok {
		t.Fatalf("current transition = %v, %v", ok, err)
	}
	a := mustGet(t, s, req.Key)
	if a.Status != once.StatusSucceeded || a.Attempt != 2 || string(a.Result) != `"fresh"` {
		t.Fatalf("stored = %+v", a)
	}
	// A transition from a status the row is not in is refused too.
	if ok, _ := s.Transition(ctx(t), once.Transition{Key: req.Key, Attempt: 2, From: []once.Status{once.StatusInFlight}, To: once.StatusFailed}); ok {
		t.Fatal("transition from in_flight applied to a succeeded row")
	}
}

func testFencingDo(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{Default: once.KindPolicy{Lease: 90 * time.Millisecond}})
	in := intent(1)
	k := keyOf(t, in)
	running := make(chan struct{})
	type out struct {
		res   once.Result[string]
		err   error
		cause error
	}
	first := make(chan out, 1)
	go func() {
		var cause error
		res, err := once.Do(ctx(t), c, in, func(ctx context.Context, a once.Attempt) (string, error) {
			close(running)
			select {
			case <-ctx.Done():
				cause = context.Cause(ctx)
			case <-time.After(20 * time.Second):
			}
			return "stale", nil
		})
		first <- out{res, err, cause}
	}()
	<-running
	// Recovery gives the claim away while attempt 1 still runs.
	if ok, err := s.Transition(ctx(t), once.Transition{Key: k, Attempt: 1, From: []once.Status{once.StatusInFlight}, To: once.StatusReleased}); err != nil || !ok {
		t.Fatalf("release: %v %v", ok, err)
	}
	second, err := once.Do(ctx(t), c, in, func(ctx context.Context, a once.Attempt) (string, error) {
		if a.Number != 2 {
			t.Errorf("attempt number %d, want 2", a.Number)
		}
		return "fresh", nil
	})
	if err != nil || second.Value != "fresh" || second.Attempt != 2 {
		t.Fatalf("second Do = %+v, %v", second, err)
	}
	o := <-first
	var fe *once.FencedError
	if !errors.As(o.err, &fe) || fe.Attempt != 1 {
		t.Fatalf("stale attempt returned %v, want *FencedError for attempt 1", o.err)
	}
	if !errors.As(o.cause, &fe) {
		t.Fatalf("stale effect's context cause = %v, want the heartbeat to report the lost claim", o.cause)
	}
	a := mustGet(t, s, k)
	if a.Status != once.StatusSucceeded || a.Attempt != 2 || string(a.Result) != `"fresh"` {
		t.Fatalf("stored = %+v; the stale attempt overwrote the newer one", a)
	}
}

func testLeaseExpiry(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{})
	long := claimReq(t, intent(1), time.Hour)
	if cr, err := s.Claim(ctx(t), long); err != nil || !cr.Claimed {
		t.Fatalf("claim: %+v %v", cr, err)
	}
	var ife *once.InFlightError
	var effects counter
	_, err := once.Do(ctx(t), c, intent(1), effects.fn("x"))
	if !errors.As(err, &ife) || ife.Expired || ife.Attempt != 1 || ife.ClaimedAt.IsZero() {
		t.Fatalf("Do on a held claim = %v; want an unexpired *InFlightError", err)
	}
	if got, _, err := s.Recoverable(ctx(t), once.RecoverRequest{Key: long.Key, Limit: 10, Hold: time.Minute, Token: "t1"}); err != nil || len(got) != 0 {
		t.Fatalf("Recoverable on a held lease = %d, %v; want none", len(got), err)
	}

	// A lapsed lease, extended again by a heartbeat, is not due.
	short := claimReq(t, intent(2), time.Millisecond)
	if cr, err := s.Claim(ctx(t), short); err != nil || !cr.Claimed {
		t.Fatalf("claim: %+v %v", cr, err)
	}
	time.Sleep(50 * time.Millisecond)
	until, held, err := s.Heartbeat(ctx(t), short.Key, 1, time.Hour)
	if err != nil || !held {
		t.Fatalf("heartbeat: %v %v", held, err)
	}
	_, err = once.Do(ctx(t), c, intent(2), effects.fn("x"))
	if !errors.As(err, &ife) || ife.Expired || !ife.LeaseUntil.Equal(until) {
		t.Fatalf("after heartbeat Do = %v; want unexpired until %v", err, until)
	}

	// A lapsed lease is due, by the database's clock, and once taken it
	// is held for the taker alone.
	lapsed := claimReq(t, intent(3), time.Millisecond)
	if cr, err := s.Claim(ctx(t), lapsed); err != nil || !cr.Claimed {
		t.Fatalf("claim: %+v %v", cr, err)
	}
	time.Sleep(50 * time.Millisecond)
	got, now, err := s.Recoverable(ctx(t), once.RecoverRequest{Key: lapsed.Key, Limit: 10, Hold: time.Hour, Token: "t2"})
	if err != nil || len(got) != 1 || got[0].Key != lapsed.Key || !got[0].LeaseUntil.After(now.Add(59*time.Minute)) {
		t.Fatalf("Recoverable on a lapsed lease = %+v, %v; want it, held for an hour", got, err)
	}
	if again, _, err := s.Recoverable(ctx(t), once.RecoverRequest{Limit: 10, Hold: time.Hour, Token: "t3"}); err != nil || len(again) != 0 {
		t.Fatalf("second Recoverable = %d, %v; a held action was handed out twice", len(again), err)
	}
	if effects.n.Load() != 0 {
		t.Fatal("an effect ran")
	}
}

func testHeartbeatKeepsLease(t *testing.T, h Harness) {
	_, c, _ := setup(t, h, once.Config{Default: once.KindPolicy{Lease: 600 * time.Millisecond}})
	release := make(chan struct{})
	done := make(chan error, 1)
	running := make(chan struct{})
	go func() {
		_, err := once.Do(ctx(t), c, intent(1), func(ctx context.Context, a once.Attempt) (string, error) {
			close(running)
			<-release
			return "ok", nil
		})
		done <- err
	}()
	<-running
	// Three lease lengths later the claim is still held: the heartbeat
	// kept it.
	time.Sleep(1800 * time.Millisecond)
	var ife *once.InFlightError
	_, err := once.Do(ctx(t), c, intent(1), (&counter{}).fn("dup"))
	if !errors.As(err, &ife) || ife.Expired {
		t.Fatalf("duplicate during a long effect = %v; want an unexpired *InFlightError", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func testMaxExecution(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{Kinds: map[string]once.KindPolicy{"send_email": {MaxExecution: 50 * time.Millisecond}}})
	var ctxErr error
	_, err := once.Do(ctx(t), c, intent(1), func(ctx context.Context, a once.Attempt) (string, error) {
		<-ctx.Done()
		ctxErr = ctx.Err()
		return "", ctx.Err()
	})
	if !errors.Is(ctxErr, context.DeadlineExceeded) {
		t.Fatalf("effect context ended with %v, want DeadlineExceeded", ctxErr)
	}
	if !errors.Is(err, once.ErrOutcomeUnknown) {
		t.Fatalf("Do = %v; a timed-out effect has an unknown outcome", err)
	}
	if a := mustGet(t, s, keyOf(t, intent(1))); a.Status != once.StatusReview {
		t.Fatalf("status %s, want review (unknown outcome, default recovery)", a.Status)
	}
}

func testRelease(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{})
	var provider []string
	_, err := once.Do(ctx(t), c, intent(1), func(ctx context.Context, a once.Attempt) (string, error) {
		provider = append(provider, a.ProviderKey)
		return "", once.RetryLater(errors.New("429 too many requests"))
	})
	if !errors.Is(err, once.ErrRetryLater) || !strings.Contains(err.Error(), "429") {
		t.Fatalf("Do = %v, want ErrRetryLater carrying the cause", err)
	}
	k := keyOf(t, intent(1))
	if a := mustGet(t, s, k); a.Status != once.StatusReleased || a.Attempt != 1 || !strings.Contains(a.Error, "429") {
		t.Fatalf("stored = %+v", a)
	}
	res, err := once.Do(ctx(t), c, intent(1), func(ctx context.Context, a once.Attempt) (string, error) {
		provider = append(provider, a.ProviderKey)
		if a.Number != 2 {
			t.Errorf("attempt %d, want 2", a.Number)
		}
		return "sent", nil
	})
	if err != nil || res.Value != "sent" || res.Attempt != 2 || res.Replayed {
		t.Fatalf("retry Do = %+v, %v", res, err)
	}
	if len(provider) != 2 || provider[0] != provider[1] {
		t.Fatalf("provider keys %q: must be the same on every attempt", provider)
	}
	if a := mustGet(t, s, k); a.Status != once.StatusSucceeded || a.Error != "" {
		t.Fatalf("stored = %+v", a)
	}
}

func testPermanent(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{})
	cause := errors.New("550 no such mailbox")
	_, err := once.Do(ctx(t), c, intent(1), func(context.Context, once.Attempt) (string, error) {
		return "", once.Permanent(cause)
	})
	var fe *once.FailedError
	if !errors.As(err, &fe) || fe.Replayed || !errors.Is(err, cause) || fe.Message != cause.Error() {
		t.Fatalf("Do = %v, want *FailedError wrapping the cause", err)
	}
	var effects counter
	_, err = once.Do(ctx(t), c, intent(1), effects.fn("x"))
	if !errors.As(err, &fe) || !fe.Replayed || fe.Message != cause.Error() {
		t.Fatalf("duplicate Do = %v, want the stored failure", err)
	}
	if effects.n.Load() != 0 {
		t.Fatal("a permanently failed action ran again")
	}
	if a := mustGet(t, s, keyOf(t, intent(1))); a.Status != once.StatusFailed || a.CompletedAt.IsZero() {
		t.Fatalf("stored = %+v", a)
	}
}

func testUnknown(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{})
	cause := errors.New("connection reset after DATA")
	_, err := once.Do(ctx(t), c, intent(1), func(context.Context, once.Attempt) (string, error) { return "", cause })
	if !errors.Is(err, once.ErrOutcomeUnknown) || !errors.Is(err, cause) {
		t.Fatalf("Do = %v, want ErrOutcomeUnknown wrapping the cause", err)
	}
	// The default recovery asks a person: never re-executed.
	var effects counter
	_, err = once.Do(ctx(t), c, intent(1), effects.fn("x"))
	if !errors.Is(err, once.ErrReview) || effects.n.Load() != 0 {
		t.Fatalf("duplicate Do = %v (ran %d); an unknown outcome must not be re-executed automatically", err, effects.n.Load())
	}
	if a := mustGet(t, s, keyOf(t, intent(1))); a.Status != once.StatusReview || a.Error != cause.Error() {
		t.Fatalf("stored = %+v", a)
	}
}

func testPanic(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{})
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Errorf("recovered %v, want the effect's panic to go on up", p)
			}
		}()
		once.Do(ctx(t), c, intent(1), func(context.Context, once.Attempt) (string, error) { panic("boom") })
	}()
	if a := mustGet(t, s, keyOf(t, intent(1))); a.Status != once.StatusReview || !strings.Contains(a.Error, "boom") {
		t.Fatalf("stored = %+v, want review with the panic", a)
	}
}

func testFingerprint(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{})
	in := intent(1)
	if _, err := once.Do(ctx(t), c, in, (&counter{}).fn("first")); err != nil {
		t.Fatal(err)
	}
	in.Payload = map[string]any{"subject": "hello again, rewritten by the model"}
	var effects counter
	_, err := once.Do(ctx(t), c, in, effects.fn("second"))
	var fe *once.FingerprintError
	if !errors.As(err, &fe) || fe.Stored == fe.Got || fe.Key != keyOf(t, in) {
		t.Fatalf("Do with a changed payload = %v, want *FingerprintError", err)
	}
	if effects.n.Load() != 0 {
		t.Fatal("a changed payload was executed")
	}
	if a := mustGet(t, s, fe.Key); a.Status != once.StatusSucceeded || a.Attempt != 1 {
		t.Fatalf("stored = %+v", a)
	}
}

func testFingerprintAfterRelease(t *testing.T, h Harness) {
	_, c, _ := setup(t, h, once.Config{})
	in := intent(1)
	once.Do(ctx(t), c, in, func(context.Context, once.Attempt) (string, error) { return "", once.RetryLater(nil) })
	in.Payload = "different"
	var effects counter
	if _, err := once.Do(ctx(t), c, in, effects.fn("x")); !errors.Is(err, once.ErrFingerprintMismatch) || effects.n.Load() != 0 {
		t.Fatalf("claim of a released key with another payload = %v (ran %d); want refused", err, effects.n.Load())
	}
}

func testPayloadInKey(t *testing.T, h Harness) {
	_, c, _ := setup(t, h, once.Config{})
	in := intent(1)
	in.PayloadInKey = true
	var effects counter
	if _, err := once.Do(ctx(t), c, in, effects.fn("a")); err != nil {
		t.Fatal(err)
	}
	in.Payload = "another body"
	res, err := once.Do(ctx(t), c, in, effects.fn("b"))
	if err != nil || res.Replayed || effects.n.Load() != 2 {
		t.Fatalf("with PayloadInKey a new payload is a new action: %+v, %v, ran %d", res, err, effects.n.Load())
	}
}

func testCanonicalPayload(t *testing.T, h Harness) {
	_, c, _ := setup(t, h, once.Config{})
	a := intent(1)
	a.Payload = map[string]any{"to": "ada", "cc": []any{"x", "y"}, "n": 1}
	b := intent(1)
	b.Payload = jsonRaw(`{ "n": 1, "cc": ["x","y"], "to": "ada" }`)
	var effects counter
	if _, err := once.Do(ctx(t), c, a, effects.fn("ok")); err != nil {
		t.Fatal(err)
	}
	res, err := once.Do(ctx(t), c, b, effects.fn("ok"))
	if err != nil || !res.Replayed || effects.n.Load() != 1 {
		t.Fatalf("equal JSON in another order = %+v, %v; want a replay", res, err)
	}
}

func testResultTooLarge(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{MaxResultBytes: 64})
	var effects counter
	res, err := once.Do(ctx(t), c, intent(1), func(context.Context, once.Attempt) (string, error) {
		effects.n.Add(1)
		return strings.Repeat("x", 100), nil
	})
	if !errors.Is(err, once.ErrResultTooLarge) || !strings.Contains(err.Error(), "MaxResultBytes") || len(res.Value) != 100 {
		t.Fatalf("Do = %v; want ErrResultTooLarge naming the limit, with the value", err)
	}
	a := mustGet(t, s, keyOf(t, intent(1)))
	if a.Status != once.StatusReview || a.Result != nil {
		t.Fatalf("stored = %+v; the effect happened, so it goes to review and is never re-run", a)
	}
	if _, err := once.Do(ctx(t), c, intent(1), effects.fn("x")); !errors.Is(err, once.ErrReview) || effects.n.Load() != 1 {
		t.Fatalf("duplicate = %v (ran %d)", err, effects.n.Load())
	}
	// An unencodable result is treated the same way.
	_, err = once.Do(ctx(t), c, intent(2), func(context.Context, once.Attempt) (chan int, error) { return make(chan int), nil })
	if !errors.Is(err, once.ErrResultNotJSON) || errors.Is(err, once.ErrResultTooLarge) {
		t.Fatalf("unencodable result: %v, want ErrResultNotJSON", err)
	}
}

func testBadInput(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{MaxPayloadBytes: 1024})
	long := strings.Repeat("r", once.MaxIDBytes+1)
	cases := []struct {
		name  string
		in    once.Intent
		field string
	}{
		{"empty run", once.Intent{Kind: "k"}, "Run"},
		{"empty kind", once.Intent{Run: "r"}, "Kind"},
		{"run too long", once.Intent{Run: long, Kind: "k"}, "Run"},
		{"kind too long", once.Intent{Run: "r", Kind: long}, "Kind"},
		{"target too long", once.Intent{Run: "r", Kind: "k", Target: strings.Repeat("t", once.MaxTargetBytes+1)}, "Target"},
		{"negative step", once.Intent{Run: "r", Kind: "k", Step: -1}, "Step"},
		{"invalid utf-8 run", once.Intent{Run: "r\xff", Kind: "k"}, "Run"},
		{"invalid utf-8 target", once.Intent{Run: "r", Kind: "k", Target: "\xc3\x28"}, "Target"},
		{"nul in kind", once.Intent{Run: "r", Kind: "k\x00"}, "Kind"},
		{"payload too large", once.Intent{Run: "r", Kind: "k", Payload: strings.Repeat("p", 2000)}, "Payload"},
		{"payload not json", once.Intent{Run: "r", Kind: "k", Payload: jsonRaw(`{"a":`)}, "Payload"},
		{"payload unencodable", once.Intent{Run: "r", Kind: "k", Payload: func() {}}, "Payload"},
	}
	var effects counter
	for _, tc := range cases {
		_, err := once.Do(ctx(t), c, tc.in, effects.fn("x"))
		var ie *once.IntentError
		if !errors.As(err, &ie) || ie.Field != tc.field || !errors.Is(err, once.ErrInvalidIntent) {
			t.Errorf("%s: Do = %v, want *IntentError on %s", tc.name, err, tc.field)
			continue
		}
		if !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: message %q does not name the field", tc.name, err)
		}
	}
	if _, err := once.Do[string](ctx(t), c, intent(1), nil); err == nil {
		t.Error("nil effect accepted")
	}
	if _, err := once.Do(ctx(t), nil, intent(1), effects.fn("x")); err == nil {
		t.Error("nil client accepted")
	}
	if effects.n.Load() != 0 {
		t.Fatalf("bad input ran the effect %d times", effects.n.Load())
	}
	rows, err := s.List(ctx(t), once.Filter{})
	if err != nil || len(rows) != 0 {
		t.Fatalf("bad input wrote %d rows (%v)", len(rows), err)
	}
}

func testGetNotFound(t *testing.T, h Harness) {
	s, _, _ := setup(t, h, once.Config{})
	_, err := s.Get(ctx(t), keyOf(t, intent(9)))
	if !errors.Is(err, once.ErrNotFound) {
		t.Fatalf("Get of a missing key = %v, want ErrNotFound", err)
	}
}

func testList(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{})
	for i := range 5 {
		in := intent(int64(i))
		if i%2 == 1 {
			in.Kind = "post_message"
			in.Run = "run-2"
		}
		once.Do(ctx(t), c, in, func(context.Context, once.Attempt) (int, error) {
			if i == 4 {
				return 0, once.Permanent(errors.New("no"))
			}
			return i, nil
		})
	}
	check := func(f once.Filter, want int) {
		t.Helper()
		rows, err := s.List(ctx(t), f)
		if err != nil || len(rows) != want {
			t.Errorf("List(%+v) = %d rows, %v; want %d", f, len(rows), err, want)
		}
	}
	check(once.Filter{}, 5)
	check(once.Filter{Status: once.StatusSucceeded}, 4)
	check(once.Filter{Status: once.StatusFailed}, 1)
	check(once.Filter{Kind: "post_message"}, 2)
	check(once.Filter{Run: "run-2"}, 2)
	check(once.Filter{Run: "run-1", Kind: "send_email", Status: once.StatusSucceeded}, 2)
	check(once.Filter{Limit: 2}, 2)
	check(once.Filter{Since: time.Now().Add(time.Hour)}, 0)
	check(once.Filter{Since: time.Now().Add(-time.Hour)}, 5)
	check(once.Filter{KeyPrefix: string(keyOf(t, intent(2)))[:10]}, 1)
	check(once.Filter{KeyPrefix: string(keyOf(t, intent(2)))}, 1)
	rows, _ := s.List(ctx(t), once.Filter{})
	for i := 1; i < len(rows); i++ {
		if rows[i].UpdatedAt.After(rows[i-1].UpdatedAt) {
			t.Fatalf("List not newest first: %v after %v", rows[i].UpdatedAt, rows[i-1].UpdatedAt)
		}
	}
}

func jsonRaw(s string) json.RawMessage { return json.RawMessage(s) }
