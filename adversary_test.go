package once_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/oncehq/once"
)

// A worker meets an unknown outcome and recovers it inline: the verifier
// (a provider API that answers slowly, well within MaxExecution) finds no
// trace, and the worker takes the action over with a fresh lease. The
// effect of the takeover must then run under a live context. The
// heartbeat's timer counts from when recovery began, before the verifier
// was asked, so once the verifier took longer than Lease−margin the
// effect's context is already cancelled when it starts: every
// redelivery verifies, takes over, and cancels its own effect, and the
// action never completes.
func TestAdversarySlowVerifierCancelsTakeover(t *testing.T) {
	const lease = 300 * time.Millisecond
	verifier := func(ctx context.Context, a once.Action) (bool, json.RawMessage, error) {
		time.Sleep(2 * lease)
		return false, nil, nil
	}
	c, _ := newClient(t, once.Config{Default: once.KindPolicy{Recovery: once.VerifyThenDecide, Verifier: verifier, Lease: lease, MaxExecution: 10 * time.Second}})
	in := once.Intent{Run: "adv-slow-verifier", Kind: "charge", Target: "cus_1"}
	ctx := context.Background()
	_, err := once.Do(ctx, c, in, func(context.Context, once.Attempt) (string, error) {
		return "", errors.New("provider timed out before it answered")
	})
	if !errors.Is(err, once.ErrOutcomeUnknown) {
		t.Fatalf("first delivery = %v, want an unknown outcome", err)
	}
	var cancelled []string
	for range 3 {
		time.Sleep(5 * time.Millisecond) // the unknown outcome is due 1ms after it was recorded
		res, err := once.Do(ctx, c, in, func(ctx context.Context, a once.Attempt) (string, error) {
			select {
			case <-ctx.Done():
				cancelled = append(cancelled, fmt.Sprintf("attempt %d: %v", a.Number, context.Cause(ctx)))
				return "", ctx.Err()
			case <-time.After(20 * time.Millisecond):
				return "charged", nil
			}
		})
		if err == nil && res.Value == "charged" {
			return
		}
	}
	t.Fatalf("three redeliveries never completed the action: each takeover's effect started under a cancelled context:\n%v", cancelled)
}

// Worker 1 claims and is paused (a GC pause, SIGSTOP, a descheduled VM;
// here its OnExecute hook blocks) between winning the claim and calling
// its effect, for longer than the lease. Worker 2 meets the lapsed claim,
// its verifier finds no trace (worker 1 has not called the provider), and
// it takes over and charges. Worker 1 then goes on: the engine knows its
// claim lapsed (Lease−margin passed since the claim was sent) yet calls
// the effect, with a context that is not yet cancelled, so even an effect
// that checks its context first charges a second time.
func TestAdversaryPauseBeforeEffectRunsTwice(t *testing.T) {
	const lease = 200 * time.Millisecond
	var mu sync.Mutex
	var charged []int
	verifier := func(ctx context.Context, a once.Action) (bool, json.RawMessage, error) {
		mu.Lock()
		defer mu.Unlock()
		if len(charged) > 0 {
			return true, json.RawMessage(`"charged"`), nil
		}
		return false, nil, nil
	}
	pol := once.KindPolicy{Recovery: once.VerifyThenDecide, Verifier: verifier, Lease: lease, MaxExecution: 10 * time.Second}
	paused, resume := make(chan struct{}), make(chan struct{})
	c1, s := newClient(t, once.Config{Default: pol, Hooks: once.Hooks{
		OnExecute: func(ctx context.Context, o once.Observation) (context.Context, func(once.Observation, error)) {
			if o.Attempt == 1 {
				close(paused)
				<-resume
			}
			return ctx, nil
		},
	}})
	c2, err := once.New(once.Config{Store: s, Default: pol})
	if err != nil {
		t.Fatal(err)
	}
	// A careful effect: it does not call the provider once its context
	// has ended. Whether worker 1's context has ended when its effect is
	// called is a race between the effect and the heartbeat's timer, so
	// the test records every call and fails on worker 1's call itself.
	var calls []string
	effect := func(ctx context.Context, a once.Attempt) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, fmt.Sprintf("attempt %d (context ended: %v)", a.Number, ctx.Err() != nil))
		if err := ctx.Err(); err != nil {
			return "", once.RetryLater(err)
		}
		charged = append(charged, a.Number)
		return "charged", nil
	}
	in := once.Intent{Run: "adv-pause", Kind: "charge", Target: "cus_1"}
	ctx := context.Background()
	done := make(chan error, 1)
	go func() {
		_, err := once.Do(ctx, c1, in, effect)
		done <- err
	}()
	<-paused
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err := once.Do(ctx, c2, in, effect)
		if err == nil {
			if res.Attempt != 2 {
				t.Fatalf("worker 2 = %+v", res)
			}
			break
		}
		if !errors.Is(err, once.ErrInFlight) || time.Now().After(deadline) {
			t.Fatalf("worker 2: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(resume)
	err1 := <-done
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 1 {
		t.Fatalf("effect calls %v, provider charged by attempts %v (worker 1 returned %v): worker 1's effect was called after its claim had lapsed and attempt 2 had run", calls, charged, err1)
	}
}

// An action recorded VerifyThenDecide when it was claimed; the outcome
// was unknown. Then the application stopped verifying that kind (a new
// release configures it RetryWithProviderKey, or drops the verifier), so
// no process holds its verifier any more. Recoverable leaves such a row
// to processes that hold the verifier, so neither the worker's inline
// recovery nor the reaper ever takes it: every redelivery is answered
// "unknown, due now" (Dispose: retry at once), the reaper examines
// nothing, and the action stays unknown for good without a person being
// asked.
func TestAdversaryRecordedVerifierNobodyHolds(t *testing.T) {
	verifier := func(context.Context, once.Action) (bool, json.RawMessage, error) { return false, nil, nil }
	v1, s := newClient(t, once.Config{Default: once.KindPolicy{Recovery: once.VerifyThenDecide, Verifier: verifier, Lease: time.Second}})
	in := once.Intent{Run: "adv-no-verifier", Kind: "charge", Target: "cus_1"}
	ctx := context.Background()
	if _, err := once.Do(ctx, v1, in, func(context.Context, once.Attempt) (string, error) {
		return "", errors.New("provider timed out")
	}); !errors.Is(err, once.ErrOutcomeUnknown) {
		t.Fatalf("first delivery = %v, want an unknown outcome", err)
	}
	// The next release: the kind is retried with the provider's key.
	v2, err := once.New(once.Config{Store: s, Kinds: map[string]once.KindPolicy{"charge": {Recovery: once.RetryWithProviderKey, Lease: time.Second}}})
	if err != nil {
		t.Fatal(err)
	}
	reaper, err := once.NewReaper(v2, once.ReaperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var last error
	examined := 0
	for range 20 {
		time.Sleep(50 * time.Millisecond)
		_, last = once.Do(ctx, v2, in, func(context.Context, once.Attempt) (string, error) { return "charged", nil })
		rep, err := reaper.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		examined += rep.Examined
	}
	k := mustKey(t, in)
	a, err := s.Get(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if a.Status == once.StatusUnknown || a.Status == once.StatusInFlight {
		d := once.Dispose(last)
		t.Fatalf("after 20 deliveries and reaper passes over 1s the action is still %s (reaper examined %d); the last delivery got %v, disposed %s after %v: no process will ever take it",
			a.Status, examined, last, d.Action, d.After)
	}
}
