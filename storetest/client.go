package storetest

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncehq/once"
)

// The engine over the store: Do and everything it decides.

func clientTests() []namedTest {
	return []namedTest{
		{name: "DoRace64Goroutines", fn: testDoRace},
		{name: "Replay", fn: testReplay},
		{name: "ReplayStruct", fn: testReplayStruct},
		{name: "FencingDo", fn: testFencingDo},
		{name: "InFlightLease", fn: testInFlightLease},
		{name: "HeartbeatKeepsLease", fn: testHeartbeatKeepsLease},
		{name: "MaxExecution", fn: testMaxExecution},
		{name: "RetryLaterReleases", fn: testRelease},
		{name: "NoteWhileInFlight", fn: testNote},
		{name: "PermanentFailure", fn: testPermanent},
		{name: "UnknownOutcome", fn: testUnknown},
		{name: "PanicIsUnknown", fn: testPanic},
		{name: "FingerprintMismatch", fn: testFingerprint},
		{name: "FingerprintMismatchAfterRelease", fn: testFingerprintAfterRelease},
		{name: "PayloadInKey", fn: testPayloadInKey},
		{name: "CanonicalPayload", fn: testCanonicalPayload},
		{name: "ResultTooLarge", fn: testResultTooLarge},
		{name: "BadInputWritesNothing", fn: testBadInput},
		{name: "ReadAPI", fn: testReadAPI},
		{name: "CallerGivesUp", fn: testCallerGivesUp},
	}
}

func testDoRace(t *testing.T, h Harness) {
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
	// The stale effect returns only after the second Do is done: a
	// success it returned earlier would be recorded from released (a
	// late outcome of the same attempt, by design), and the second Do
	// would replay it instead of running.
	proceed := make(chan struct{})
	go func() {
		var cause error
		res, err := once.Do(ctx(t), c, in, func(ctx context.Context, a once.Attempt) (string, error) {
			close(running)
			select {
			case <-ctx.Done():
				cause = context.Cause(ctx)
			case <-time.After(20 * time.Second):
			}
			<-proceed
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
	close(proceed)
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

// A claim held by a live worker is refused to Do with the lease it
// holds, by the database's clock, and is not recovered.
func testInFlightLease(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{})
	long := claimReq(t, intent(1), time.Hour)
	mustClaim(t, s, long)
	var ife *once.InFlightError
	var effects counter
	_, err := once.Do(ctx(t), c, intent(1), effects.fn("x"))
	if !errors.As(err, &ife) || ife.Expired || ife.Attempt != 1 || ife.ClaimedAt.IsZero() || ife.Key != long.Key {
		t.Fatalf("Do on a held claim = %v; want an unexpired *InFlightError", err)
	}

	// A lapsed lease, extended again by a heartbeat, is held.
	short := claimReq(t, intent(2), time.Millisecond)
	mustClaim(t, s, short)
	time.Sleep(50 * time.Millisecond)
	until, held, err := s.Heartbeat(ctx(t), short.Key, 1, time.Hour)
	if err != nil || !held {
		t.Fatalf("heartbeat: %v %v", held, err)
	}
	_, err = once.Do(ctx(t), c, intent(2), effects.fn("x"))
	if !errors.As(err, &ife) || ife.Expired || !ife.LeaseUntil.Equal(until) {
		t.Fatalf("after heartbeat Do = %v; want unexpired until %v", err, until)
	}
	if effects.n.Load() != 0 {
		t.Fatal("an effect ran")
	}
	for _, k := range []once.Key{long.Key, short.Key} {
		if got := trail(t, s, k); got != "claimed" {
			t.Fatalf("trail of a held claim %s; Do must only answer", got)
		}
	}
}

// heartbeatLease is the lease of the heartbeat tests. A heartbeat must
// get through within two thirds of it; on a loaded machine one SQLite
// write with synchronous=FULL has been seen to take 400ms, so the lease
// is three times that.
const heartbeatLease = 1200 * time.Millisecond

func testHeartbeatKeepsLease(t *testing.T, h Harness) {
	_, c, _ := setup(t, h, once.Config{Default: once.KindPolicy{Lease: heartbeatLease}})
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
	// Two lease lengths later the claim is still held: the heartbeat
	// kept it.
	time.Sleep(2 * heartbeatLease)
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

// An effect's note is the in-flight action's Error, renews its lease and
// writes no event; the outcome replaces it; a note after the attempt
// ended is fenced; a note on an Attempt Do did not give does nothing.
func testNote(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{})
	k := keyOf(t, intent(1))
	var late once.Attempt
	_, err := once.Do(ctx(t), c, intent(1), func(ctx context.Context, a once.Attempt) (string, error) {
		before := mustGet(t, s, k)
		if err := a.Note(ctx, "sending Message-ID <x@once>"); err != nil {
			t.Errorf("Note: %v", err)
		}
		got := mustGet(t, s, k)
		if got.Status != once.StatusInFlight || got.Attempt != 1 || got.Error != "sending Message-ID <x@once>" {
			t.Errorf("after the note the row is %s attempt %d with %q, want in flight, attempt 1, with the note", got.Status, got.Attempt, got.Error)
		}
		if got.LeaseUntil.Before(before.LeaseUntil) {
			t.Errorf("the note moved the lease back, from %v to %v", before.LeaseUntil, got.LeaseUntil)
		}
		late = a
		return "sent", nil
	})
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	if a := mustGet(t, s, k); a.Status != once.StatusSucceeded || a.Error != "" {
		t.Fatalf("after the outcome the row is %s with %q, want succeeded without the note", a.Status, a.Error)
	}
	if got := trail(t, s, k); got != "claimed,succeeded" {
		t.Errorf("trail %s, want the note to write no event", got)
	}
	if err := late.Note(ctx(t), "too late"); !errors.Is(err, once.ErrFenced) {
		t.Errorf("a note after the outcome: %v, want ErrFenced", err)
	}
	if a := mustGet(t, s, k); a.Error != "" {
		t.Errorf("the late note was written: %q", a.Error)
	}
	if err := (once.Attempt{Key: k, Number: 1}).Note(ctx(t), "by hand"); err != nil {
		t.Errorf("a note on an Attempt made by hand: %v, want nothing done", err)
	}

	// An outcome that is unknown is what the note is for: the review
	// item keeps it beside the error, whether the effect returned one
	// or panicked.
	u := keyOf(t, intent(2))
	once.Do(ctx(t), c, intent(2), func(ctx context.Context, a once.Attempt) (string, error) {
		a.Note(ctx, "charging with provider request R-42")
		return "", errors.New("connection reset after the request was sent")
	})
	if a := mustGet(t, s, u); a.Status != once.StatusReview || !strings.Contains(a.Error, "connection reset") || !strings.Contains(a.Error, "R-42") {
		t.Errorf("an unknown outcome after a note is %s with %q, want review naming the error and the note", a.Status, a.Error)
	}
	p := keyOf(t, intent(3))
	func() {
		defer func() { recover() }()
		once.Do(ctx(t), c, intent(3), func(ctx context.Context, a once.Attempt) (string, error) {
			a.Note(ctx, "charging with provider request R-43")
			panic("boom")
		})
	}()
	if a := mustGet(t, s, p); a.Status != once.StatusReview || !strings.Contains(a.Error, "boom") || !strings.Contains(a.Error, "R-43") {
		t.Errorf("a panic after a note is %s with %q, want review naming the panic and the note", a.Status, a.Error)
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

// The client's read API shows what the store holds.
func testReadAPI(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{})
	if v, err := c.SchemaVersion(ctx(t)); err != nil || v != latestVersion(t, s) {
		t.Fatalf("SchemaVersion = %d, %v; want %d", v, err, latestVersion(t, s))
	}
	// A run's steps, done out of order, come back in step order.
	for _, step := range []int64{2, 0, 1} {
		in := once.Intent{Run: "read-run", Step: step, Kind: "send_email", Target: "ada@example.com"}
		if _, err := once.Do(ctx(t), c, in, (&counter{}).fn("ok")); err != nil {
			t.Fatal(err)
		}
	}
	once.Do(ctx(t), c, intent(1), func(context.Context, once.Attempt) (string, error) { return "", errors.New("lost") })
	steps, err := c.RunSteps(ctx(t), "read-run")
	if err != nil || len(steps) != 3 {
		t.Fatalf("RunSteps = %d, %v", len(steps), err)
	}
	for i, a := range steps {
		if a.Step != int64(i) || a.Status != once.StatusSucceeded {
			t.Fatalf("step %d = %+v", i, a)
		}
	}
	if steps, err := c.Run("no-such-run").Steps(ctx(t)); err != nil || len(steps) != 0 {
		t.Fatalf("steps of an unknown run = %d, %v", len(steps), err)
	}

	k := keyOf(t, intent(1))
	if a, err := c.Get(ctx(t), k); err != nil || a.Status != once.StatusReview || a.Key != k {
		t.Fatalf("Get = %+v, %v", a, err)
	}
	if _, err := c.Get(ctx(t), keyOf(t, intent(9))); !isNotFound(err) {
		t.Fatalf("Get of a missing key = %v", err)
	}
	if rows, err := c.List(ctx(t), once.Filter{Status: once.StatusReview}); err != nil || len(rows) != 1 || rows[0].Key != k {
		t.Fatalf("List(review) = %+v, %v", rows, err)
	}
	if evs, err := c.Events(ctx(t), k); err != nil || len(evs) != 2 || evs[0].Type != once.EventClaimed || evs[1].Type != once.EventReview {
		t.Fatalf("Events = %+v, %v", evs, err)
	}
	if evs, err := c.RecentEvents(ctx(t), []once.EventType{once.EventReview}, 5); err != nil || len(evs) != 1 || evs[0].Key != k {
		t.Fatalf("RecentEvents(review) = %+v, %v", evs, err)
	}
	stats, err := c.Stats(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	var cells []string
	for _, st := range stats {
		cells = append(cells, st.Kind+"/"+string(st.Status)+"="+strings.Repeat("|", int(st.Count)))
	}
	slices.Sort(cells)
	if got := strings.Join(cells, " "); got != "send_email/review=| send_email/succeeded=|||" {
		t.Fatalf("Stats = %s", got)
	}
}

// A caller that gives up while the effect runs does not lose its
// outcome: the effect's context ends with the caller's, and what it
// returns is recorded all the same, so duplicates replay it.
func testCallerGivesUp(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{})
	callerCtx, giveUp := context.WithCancel(ctx(t))
	var effectErr error
	res, err := once.Do(callerCtx, c, intent(1), func(ctx context.Context, a once.Attempt) (string, error) {
		giveUp()
		<-ctx.Done()
		effectErr = ctx.Err()
		return "sent before the caller left", nil
	})
	if !errors.Is(effectErr, context.Canceled) {
		t.Fatalf("the effect's context ended with %v, want the caller's cancellation", effectErr)
	}
	if err != nil || res.Value != "sent before the caller left" {
		t.Fatalf("Do = %+v, %v; want the outcome recorded on a context of its own", res, err)
	}
	if a := mustGet(t, s, keyOf(t, intent(1))); a.Status != once.StatusSucceeded {
		t.Fatalf("stored %s, want succeeded", a.Status)
	}
	again, err := once.Do(ctx(t), c, intent(1), (&counter{}).fn("again"))
	if err != nil || !again.Replayed || again.Value != "sent before the caller left" {
		t.Fatalf("duplicate = %+v, %v", again, err)
	}
}
