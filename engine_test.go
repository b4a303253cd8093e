package once_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/sqlite"
)

// ValidateResolution refuses what Resolve would, naming the field, with
// no I/O; every decision it offers is accepted.
func TestValidateResolution(t *testing.T) {
	c, _ := newClient(t, once.Config{MaxResultBytes: 16})
	for _, d := range once.Decisions() {
		if err := c.ValidateResolution(once.Resolution{Decision: d, By: "ada", Note: "checked the log"}); err != nil {
			t.Errorf("%s refused: %v", d, err)
		}
	}
	if got := fmt.Sprint(once.Decisions()); got != "[done retry abandon]" {
		t.Errorf("Decisions() = %s", got)
	}
	ok := once.Resolution{Decision: once.DecisionDone, By: "ada", Note: "n", Result: json.RawMessage(`{"id":1}`)}
	if err := c.ValidateResolution(ok); err != nil {
		t.Fatalf("a valid resolution refused: %v", err)
	}
	for _, tc := range []struct {
		name  string
		edit  func(*once.Resolution)
		field string
		says  string
	}{
		{"no decision", func(r *once.Resolution) { r.Decision = "" }, "Decision", "use once.DecisionDone"},
		{"unknown decision", func(r *once.Resolution) { r.Decision = "maybe" }, "Decision", `"maybe"`},
		{"no one", func(r *once.Resolution) { r.By = " " }, "By", "say who decided"},
		{"no note", func(r *once.Resolution) { r.Note = "" }, "Note", "say why"},
		{"name too long", func(r *once.Resolution) { r.By = strings.Repeat("a", once.MaxIDBytes+1) }, "By", "over the limit of 255"},
		{"note too long", func(r *once.Resolution) { r.Note = strings.Repeat("n", 4097) }, "Note", "over the limit of 4096"},
		{"name not UTF-8", func(r *once.Resolution) { r.By = "a\xff" }, "By", "not valid UTF-8"},
		{"NUL in note", func(r *once.Resolution) { r.Note = "a\x00b" }, "Note", "contains a NUL byte"},
		{"result not JSON", func(r *once.Resolution) { r.Result = json.RawMessage(`{`) }, "Result", "not valid JSON"},
		{"result too large", func(r *once.Resolution) { r.Result = json.RawMessage(`"` + strings.Repeat("x", 20) + `"`) }, "Result", "over Config.MaxResultBytes (16)"},
		{"result with retry", func(r *once.Resolution) { r.Decision = once.DecisionRetry }, "Result", "only stored with Done"},
	} {
		r := ok
		tc.edit(&r)
		err := c.ValidateResolution(r)
		var re *once.ResolutionError
		if !errors.As(err, &re) || re.Field != tc.field || !errors.Is(err, once.ErrInvalidResolution) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v; want a *ResolutionError on %s saying %q", tc.name, err, tc.field, tc.says)
		}
	}
}

// Purge works in batches, reports progress after each, and with DryRun
// only counts; a negative batch size is refused before any I/O.
func TestPurgeOptions(t *testing.T) {
	c, s := newClient(t, once.Config{Default: once.KindPolicy{Retention: time.Millisecond}})
	ctx := context.Background()
	if _, err := c.Purge(ctx, once.PurgeOptions{BatchSize: -1}); err == nil || !strings.Contains(err.Error(), "BatchSize and OlderThan must not be negative") {
		t.Fatalf("negative batch size: %v", err)
	}
	for i := range 5 {
		if _, err := once.Do(ctx, c, once.Intent{Run: "purge", Step: int64(i), Kind: "k"}, func(context.Context, once.Attempt) (int, error) { return i, nil }); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(10 * time.Millisecond)
	var progress []int
	n, err := c.Purge(ctx, once.PurgeOptions{DryRun: true, Progress: func(d int) { progress = append(progress, d) }})
	if err != nil || n != 5 || !slices.Equal(progress, []int{5}) {
		t.Fatalf("dry run = %d, %v (progress %v); want 5 counted once", n, err, progress)
	}
	if rows, _ := c.List(ctx, once.Filter{}); len(rows) != 5 {
		t.Fatalf("a dry run deleted: %d rows left", len(rows))
	}
	progress = nil
	n, err = c.Purge(ctx, once.PurgeOptions{BatchSize: 2, Progress: func(d int) { progress = append(progress, d) }})
	if err != nil || n != 5 || !slices.Equal(progress, []int{2, 4, 5}) {
		t.Fatalf("purge = %d, %v (progress %v); want 5 in batches of 2", n, err, progress)
	}
	if rows, _ := s.List(ctx, once.Filter{}); len(rows) != 0 {
		t.Fatalf("%d rows left", len(rows))
	}
	if n, err := c.Purge(ctx, once.PurgeOptions{}); err != nil || n != 0 {
		t.Fatalf("purge of nothing = %d, %v", n, err)
	}
}

// Run.Next numbers a run's intents in call order, from 0, whatever Run
// and Step held, and never hands out a number twice.
func TestRunNext(t *testing.T) {
	c, _ := newClient(t, once.Config{})
	run := c.Run("agent-7")
	if run.ID() != "agent-7" {
		t.Fatalf("ID = %q", run.ID())
	}
	first := run.Next(once.Intent{Run: "ignored", Step: 99, Kind: "send_email", Target: "ada@example.com", Payload: "hi"})
	if first.Run != "agent-7" || first.Step != 0 || first.Kind != "send_email" || first.Target != "ada@example.com" || first.Payload != "hi" {
		t.Fatalf("first = %+v", first)
	}
	var mu sync.Mutex
	seen := map[int64]bool{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 10 {
				in := run.Next(once.Intent{Kind: "k"})
				mu.Lock()
				if seen[in.Step] {
					t.Errorf("step %d handed out twice", in.Step)
				}
				seen[in.Step] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for step := int64(1); step <= 80; step++ {
		if !seen[step] {
			t.Fatalf("step %d never handed out", step)
		}
	}
	// Another handle on the same run starts again at 0: that is what
	// resuming a run means.
	if in := c.Run("agent-7").Next(once.Intent{Kind: "k"}); in.Step != 0 {
		t.Fatalf("a new handle started at %d", in.Step)
	}
}

// A replay decodes the stored result into the caller's type, and says
// so when it cannot.
func TestReplayIntoAnotherType(t *testing.T) {
	c, _ := newClient(t, once.Config{})
	ctx := context.Background()
	in := once.Intent{Run: "types", Kind: "k"}
	if _, err := once.Do(ctx, c, in, func(context.Context, once.Attempt) (string, error) { return "msg-1", nil }); err != nil {
		t.Fatal(err)
	}
	_, err := once.Do(ctx, c, in, func(context.Context, once.Attempt) (int, error) { return 0, nil })
	if err == nil || !strings.Contains(err.Error(), "does not decode into int") || !strings.Contains(err.Error(), "the type the first attempt returned") {
		t.Fatalf("replay into int = %v", err)
	}
	// A resolution with no result replays the zero value.
	lost := once.Intent{Run: "types", Step: 1, Kind: "k"}
	once.Do(ctx, c, lost, func(context.Context, once.Attempt) (int, error) { return 0, errors.New("EOF") })
	if _, err := c.Resolve(ctx, mustKey(t, lost), once.Resolution{Decision: once.DecisionDone, By: "ada", Note: "sent"}); err != nil {
		t.Fatal(err)
	}
	res, err := once.Do(ctx, c, lost, func(context.Context, once.Attempt) (int, error) { return 7, nil })
	if err != nil || !res.Replayed || res.Value != 0 {
		t.Fatalf("replay of a resolution without a result = %+v, %v", res, err)
	}
}

// With the database gone, every call says what failed and none panics.
func TestStoreGone(t *testing.T) {
	c, s := newClient(t, once.Config{Default: once.KindPolicy{Recovery: once.RetryWithProviderKey}})
	ctx := context.Background()
	in := once.Intent{Run: "gone", Kind: "send_email"}
	dead := deadClaim(t, s, once.Intent{Run: "gone", Step: 1, Kind: "send_email"})
	s.Close()
	ran := false
	effect := func(context.Context, once.Attempt) (int, error) { ran = true; return 0, nil }
	if _, err := once.Do(ctx, c, in, effect); err == nil || !strings.Contains(err.Error(), "once: claiming action") || !strings.Contains(err.Error(), "send_email") {
		t.Errorf("Do = %v", err)
	}
	if _, err := c.Resolve(ctx, dead, once.Resolution{Decision: once.DecisionRetry, By: "ada", Note: "n"}); err == nil {
		t.Error("Resolve on a closed store succeeded")
	}
	if _, err := c.Purge(ctx, once.PurgeOptions{}); err == nil || !strings.Contains(err.Error(), "once: purge") {
		t.Errorf("Purge = %v", err)
	}
	r, _ := once.NewReaper(c, once.ReaperConfig{})
	if _, err := r.RunOnce(ctx); err == nil || !strings.Contains(err.Error(), "once: reaper") {
		t.Errorf("RunOnce = %v", err)
	}
	if _, err := c.Stats(ctx); err == nil {
		t.Error("Stats on a closed store succeeded")
	}
	if ran {
		t.Error("an effect ran without a claim")
	}
}

// An effect that outlives its database: the heartbeat cannot get
// through, so after a whole lease the effect is stopped with a
// *FencedError as its context's cause (recovery may take over); the
// outcome cannot be written, so Do returns the value with a
// *RecordError, and the claim stays in flight for recovery.
func TestEffectOutlivesStore(t *testing.T) {
	var logs syncBuffer
	s, path := testdb.NewSQLite(t)
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	c, err := once.New(once.Config{Store: s, Default: once.KindPolicy{Lease: 60 * time.Millisecond}, RecordTimeout: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	in := once.Intent{Run: "outlives", Kind: "send_email"}
	var cause error
	res, err := once.Do(context.Background(), c, in, func(ctx context.Context, a once.Attempt) (string, error) {
		s.Close()
		select {
		case <-ctx.Done():
			cause = context.Cause(ctx)
		case <-time.After(30 * time.Second):
			t.Error("the effect was never stopped")
		}
		return "sent", nil
	})
	var fe *once.FencedError
	if !errors.As(cause, &fe) || fe.Outcome != once.StatusInFlight {
		t.Fatalf("the effect's context ended with %v; want a *FencedError: no heartbeat for a lease", cause)
	}
	var re *once.RecordError
	if !errors.As(err, &re) || re.Outcome != once.StatusSucceeded || res.Value != "sent" || !strings.Contains(err.Error(), "recovery applies") {
		t.Fatalf("Do = %+v, %v; want the value with a *RecordError", res, err)
	}
	for _, line := range []string{"heartbeat failed", "no heartbeat got through for a lease", "recording outcome failed; retrying"} {
		if !strings.Contains(logs.String(), line) {
			t.Errorf("the log does not say %q:\n%s", line, logs.String())
		}
	}
	again, err := sqlite.Open(path, sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if a, err := again.Get(context.Background(), mustKey(t, in)); err != nil || a.Status != once.StatusInFlight || a.Attempt != 1 {
		t.Fatalf("stored %+v, %v; want the claim still in flight", a, err)
	}
}

// The logger hears what an operator should.
func TestLogger(t *testing.T) {
	var logs syncBuffer
	c, _ := newClient(t, once.Config{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	ctx := context.Background()
	in := once.Intent{Run: "log", Kind: "send_email", Payload: "a"}
	once.Do(ctx, c, in, func(context.Context, once.Attempt) (int, error) { return 0, errors.New("EOF") })
	in.Payload = "b"
	once.Do(ctx, c, in, func(context.Context, once.Attempt) (int, error) { return 0, nil })
	k := mustKey(t, in)
	if _, err := c.Resolve(ctx, k, once.Resolution{Decision: once.DecisionDone, By: "ada", Note: "sent"}); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	for _, line := range []string{"once: claimed", "once: outcome unknown", "payload differs from the first attempt", "once: resolved", "key=" + string(k)} {
		if !strings.Contains(out, line) {
			t.Errorf("the log does not say %q:\n%s", line, out)
		}
	}
}

func TestStatuses(t *testing.T) {
	all := once.Statuses()
	if len(all) != 8 || len(slices.Compact(slices.Sorted(slices.Values(all)))) != 8 {
		t.Fatalf("Statuses() = %v", all)
	}
	for _, s := range all {
		if !s.Valid() {
			t.Errorf("%s not valid", s)
		}
		if want := slices.Contains(once.ResolvableStatuses(), s); s.Resolvable() != want {
			t.Errorf("%s.Resolvable() = %v", s, !want)
		}
	}
	if once.Status("done").Valid() || once.Status("").Valid() {
		t.Error("a made-up status is valid")
	}
	if got := fmt.Sprint(once.ResolvableStatuses()); got != "[review unknown failed]" {
		t.Errorf("ResolvableStatuses() = %s", got)
	}
}

// A person may resolve a failed action too: Retry releases it, and the
// next delivery runs it again as the next attempt.
func TestResolveFailed(t *testing.T) {
	c, s := newClient(t, once.Config{})
	ctx := context.Background()
	in := once.Intent{Run: "resolve-failed", Kind: "send_email", Target: "ada@example.com"}
	once.Do(ctx, c, in, func(context.Context, once.Attempt) (string, error) {
		return "", once.Permanent(errors.New("550 mailbox full"))
	})
	a, err := c.Resolve(ctx, mustKey(t, in), once.Resolution{Decision: once.DecisionRetry, By: "ada", Note: "mailbox emptied"})
	if err != nil || a.Status != once.StatusReleased || !strings.Contains(a.Error, "released by ada") {
		t.Fatalf("Resolve = %+v, %v", a, err)
	}
	res, err := once.Do(ctx, c, in, func(context.Context, once.Attempt) (string, error) { return "queued", nil })
	if err != nil || res.Attempt != 2 || res.Value != "queued" {
		t.Fatalf("after the retry: %+v, %v", res, err)
	}
	evs, _ := s.Events(ctx, mustKey(t, in))
	var types []string
	for _, e := range evs {
		types = append(types, string(e.Type))
	}
	if got := strings.Join(types, ","); got != "claimed,failed,resolved,claimed,succeeded" {
		t.Fatalf("trail %s", got)
	}
}
