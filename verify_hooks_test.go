package once_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/oncehq/once"
)

// Each verifier failure reaches the hooks once, with the verifier's
// duration: metrics count recoveries and verifier latency from it.
func TestVerifyFailureObservedOnce(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	var seen []once.Observation
	c, _ := newClient(t, once.Config{
		Default: once.KindPolicy{Recovery: once.VerifyThenDecide, VerifyBackoff: time.Millisecond,
			Verifier: func(context.Context, once.Action) (bool, json.RawMessage, error) {
				time.Sleep(2 * time.Millisecond)
				return false, nil, errors.New("provider API down")
			}},
		Hooks: once.Hooks{OnEvent: func(_ context.Context, o once.Observation) {
			mu.Lock()
			defer mu.Unlock()
			if o.Type == once.EventVerifyFailed {
				seen = append(seen, o)
			}
		}}})
	in := once.Intent{Run: "r", Kind: "post_message"}
	if _, err := once.Do(ctx, c, in, func(context.Context, once.Attempt) (int, error) { return 0, errors.New("timeout") }); !errors.Is(err, once.ErrOutcomeUnknown) {
		t.Fatalf("Do = %v", err)
	}
	time.Sleep(5 * time.Millisecond)
	r, err := once.NewReaper(c, once.ReaperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := r.RunOnce(ctx); err != nil || rep.Deferred != 1 {
		t.Fatalf("reaper = %+v, %v; want one deferral", rep, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 {
		t.Fatalf("one verifier failure reached the hooks %d times", len(seen))
	}
	if o := seen[0]; o.Duration < 2*time.Millisecond || o.Key == "" || o.Attempt != 1 || o.Kind != "post_message" {
		t.Fatalf("observation %+v; want the key, attempt, kind and the verifier's duration", o)
	}
}

// A panicking effect's outcome reaches the hooks like any other: with
// its key, attempt and status (metrics count it by status).
func TestPanicObservation(t *testing.T) {
	ctx := context.Background()
	var seen []once.Observation
	var ended []error
	c, _ := newClient(t, once.Config{Hooks: once.Hooks{
		OnEvent: func(_ context.Context, o once.Observation) { seen = append(seen, o) },
		OnExecute: func(ctx context.Context, _ once.Observation) (context.Context, func(once.Observation, error)) {
			return ctx, func(o once.Observation, err error) { ended = append(ended, err) }
		},
	}})
	in := once.Intent{Run: "r", Kind: "send_email"}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the panic was swallowed")
			}
		}()
		once.Do(ctx, c, in, func(context.Context, once.Attempt) (int, error) { panic("nil map") })
	}()
	k, _, _ := once.KeyOf(in)
	if len(seen) != 2 || seen[0].Type != once.EventClaimed {
		t.Fatalf("observations %+v; want claimed, then the outcome", seen)
	}
	if o := seen[1]; o.Key != k || o.Attempt != 1 || o.To != once.StatusReview || o.Type != once.EventReview || o.Kind != "send_email" {
		t.Fatalf("the panic's outcome reached the hooks as %+v", o)
	}
	if len(ended) != 1 || ended[0] == nil {
		t.Fatalf("OnExecute's end was called %d times (%v); want once, with the error", len(ended), ended)
	}
}
