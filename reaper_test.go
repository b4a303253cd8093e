package once_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncehq/once"
)

type reaperPass struct {
	rep once.ReapReport
	err error
}

func passesTo(ch chan<- reaperPass) func(once.ReapReport, error) {
	return func(rep once.ReapReport, err error) { ch <- reaperPass{rep, err} }
}

func waitPass(t *testing.T, ch <-chan reaperPass) reaperPass {
	t.Helper()
	select {
	case p := <-ch:
		return p
	case <-time.After(30 * time.Second):
		t.Fatal("no reaper pass")
		return reaperPass{}
	}
}

// Start runs passes until Stop or its context ends, reporting each to
// OnPass; a failed pass is reported and the loop goes on; a stopped
// reaper starts again.
func TestReaperStartStop(t *testing.T) {
	c, _ := newClient(t, once.Config{})
	if _, err := once.NewReaper(nil, once.ReaperConfig{}); err == nil || !strings.Contains(err.Error(), "needs a *Client") {
		t.Fatalf("NewReaper(nil) = %v", err)
	}
	for _, cfg := range []once.ReaperConfig{{Interval: -time.Second}, {MaxPerPass: -1}} {
		if _, err := once.NewReaper(c, cfg); err == nil || !strings.Contains(err.Error(), "must not be negative") {
			t.Errorf("NewReaper(%+v) = %v", cfg, err)
		}
	}

	passes := make(chan reaperPass, 100)
	r, err := once.NewReaper(c, once.ReaperConfig{Interval: 20 * time.Millisecond, OnPass: passesTo(passes)})
	if err != nil {
		t.Fatal(err)
	}
	r.Stop() // not started: nothing to stop
	for round := range 2 {
		if err := r.Start(context.Background()); err != nil {
			t.Fatalf("Start #%d: %v", round+1, err)
		}
		if p := waitPass(t, passes); p.err != nil || p.rep.Examined != 0 {
			t.Fatalf("pass = %+v", p)
		}
		r.Stop()
		for len(passes) > 0 {
			<-passes
		}
		time.Sleep(100 * time.Millisecond) // five intervals
		if len(passes) != 0 {
			t.Fatalf("%d passes ran after Stop returned", len(passes))
		}
	}

	// A context that ends stops the loop too; Stop then returns at once.
	ctx, cancel := context.WithCancel(context.Background())
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitPass(t, passes)
	cancel()
	r.Stop()

	// Failed passes are reported, and the loop goes on.
	broken, s := newClient(t, once.Config{})
	s.Close()
	failing := make(chan reaperPass, 100)
	r, _ = once.NewReaper(broken, once.ReaperConfig{Interval: 10 * time.Millisecond, OnPass: passesTo(failing)})
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if p := waitPass(t, failing); p.err == nil || !strings.Contains(p.err.Error(), "once: reaper") {
			t.Errorf("a pass over a closed store reported %v", p.err)
		}
	}
	r.Stop()
}

// MaxPerPass spreads a backlog over several passes; without it one pass
// takes the whole backlog, one action at a time.
func TestReaperMaxPerPass(t *testing.T) {
	c, s := newClient(t, once.Config{})
	for i := range 5 {
		kind := "a"
		if i%2 == 1 {
			kind = "b"
		}
		deadClaim(t, s, once.Intent{Run: "backlog", Step: int64(i), Kind: kind})
	}
	r, _ := once.NewReaper(c, once.ReaperConfig{MaxPerPass: 2})
	byKind := map[string]int{}
	for i, want := range []int{2, 2, 1, 0} {
		rep, err := r.RunOnce(context.Background())
		if err != nil || rep.Examined != want || rep.Review != want {
			t.Fatalf("pass %d = %+v, %v; want %d examined and put up for review", i+1, rep, err, want)
		}
		for k, n := range rep.ByKind {
			byKind[k] += n
		}
	}
	if byKind["a"] != 3 || byKind["b"] != 2 {
		t.Fatalf("by kind %v", byKind)
	}

	c, s = newClient(t, once.Config{})
	for i := range 5 {
		deadClaim(t, s, once.Intent{Run: "backlog", Step: int64(i), Kind: "a"})
	}
	r, _ = once.NewReaper(c, once.ReaperConfig{})
	if rep, err := r.RunOnce(context.Background()); err != nil || rep.Examined != 5 {
		t.Fatalf("one pass = %+v, %v; want all 5", rep, err)
	}
}

// A verifier that answers oddly is not trusted: a result that is not
// JSON or too large to store, or a panic, ends in review, never in a
// re-execution, and never takes the reaper down.
func TestReaperVerifierOddities(t *testing.T) {
	verifier := func(landed bool, result string, panics bool) once.KindPolicy {
		return once.KindPolicy{Recovery: once.VerifyThenDecide, MaxVerifyFailures: 1, Verifier: func(context.Context, once.Action) (bool, json.RawMessage, error) {
			if panics {
				panic("verifier bug")
			}
			return landed, json.RawMessage(result), nil
		}}
	}
	var logs syncBuffer
	c, s := newClient(t, once.Config{MaxResultBytes: 64, Logger: slog.New(slog.NewTextHandler(&logs, nil)), Kinds: map[string]once.KindPolicy{
		"bad_json":     verifier(true, `{`, false),
		"too_big":      verifier(true, `"`+strings.Repeat("x", 100)+`"`, false),
		"panics":       verifier(false, "", true),
		"landed_empty": verifier(true, "", false),
	}})
	keys := map[string]once.Key{}
	for _, kind := range []string{"bad_json", "too_big", "panics", "landed_empty"} {
		keys[kind] = deadClaim(t, s, once.Intent{Run: "odd", Kind: kind})
	}
	r, _ := once.NewReaper(c, once.ReaperConfig{})
	rep, err := r.RunOnce(context.Background())
	if err != nil || rep.Examined != 4 || rep.Review != 3 || rep.Verified != 1 {
		t.Fatalf("pass = %+v, %v", rep, err)
	}
	for kind, want := range map[string]string{"bad_json": "not valid JSON", "too_big": "over Config.MaxResultBytes", "panics": "verifier panicked: verifier bug"} {
		if a, _ := s.Get(context.Background(), keys[kind]); a.Status != once.StatusReview || !strings.Contains(a.Error, want) {
			t.Errorf("%s: stored %s %q, want review saying %q", kind, a.Status, a.Error, want)
		}
	}
	if a, _ := s.Get(context.Background(), keys["landed_empty"]); a.Status != once.StatusSucceeded || a.Result != nil {
		t.Errorf("landed without a result: stored %s %s", a.Status, a.Result)
	}
	if out := logs.String(); !strings.Contains(out, "once: reaper pass") || !strings.Contains(out, "examined=4") {
		t.Errorf("the pass was not logged:\n%s", out)
	}
}

// syncBuffer is a log sink several goroutines may write.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
