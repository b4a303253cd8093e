package once_test

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/sqlite"
)

// Each verifier failure reaches the hooks once, with the verifier's
// duration: metrics count recoveries and verifier latency from it.
func TestVerifyFailureObservedOnce(t *testing.T) {
	s, err := sqlite.Open(filepath.Join(t.TempDir(), "once.db"), sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []once.Observation
	c, err := once.New(once.Config{Store: s,
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
	if err != nil {
		t.Fatal(err)
	}
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
