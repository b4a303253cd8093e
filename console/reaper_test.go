package console_test

import (
	"context"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/console"
	"github.com/oncehq/once/sqlite"
)

// reaperRow is the overview's table of the last pass: examined, to
// review, released, verified, deferred, changed.
var reaperRow = regexp.MustCompile(`<tbody><tr><td class="num">(\d+)</td><td class="num">(\d+)</td><td class="num">(\d+)</td>`)

// startReaper starts a real reaper over c whose passes go to status, and
// returns a channel closed after its first pass.
func startReaper(t *testing.T, c *once.Client, status *console.ReaperStatus) <-chan struct{} {
	t.Helper()
	passed := make(chan struct{})
	var first sync.Once
	r, err := once.NewReaper(c, once.ReaperConfig{Interval: time.Hour, OnPass: func(rep once.ReapReport, err error) {
		status.OnPass(rep, err)
		first.Do(func() { close(passed) })
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return passed
}

func waitPass(t *testing.T, passed <-chan struct{}) {
	t.Helper()
	select {
	case <-passed:
	case <-time.After(time.Minute):
		t.Fatal("the reaper made no pass in a minute")
	}
}

// TestReaperStatus wires the library's reaper to the console the way an
// application does, through ReaperStatus.OnPass, and reads its pass on
// the overview: a claim whose worker died goes to review, and the
// overview counts it. A pass that fails shows why.
func TestReaperStatus(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	status := new(console.ReaperStatus)
	b := setup(t, console.Config{Reaper: status, Prefix: "/ops/once"})
	if body := b.get("/").Body.String(); !strings.Contains(body, "Last reaper pass") || !strings.Contains(body, "has not finished a pass yet") {
		t.Errorf("before the first pass, the overview says:\n%s", body)
	}
	if _, ok := status.Last(); ok {
		t.Fatal("Last reports a pass before any")
	}

	// A worker that claimed and died: its lease lapses unanswered.
	in := once.Intent{Run: "run-2", Kind: "send_email", Target: "eve@example.com"}
	key, fp, err := once.KeyOf(in)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Claim(ctx, once.ClaimRequest{Key: key, Fingerprint: fp, Run: in.Run, Kind: in.Kind, Target: in.Target, Lease: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // past the lease, by any clock
	waitPass(t, startReaper(t, b.client, status))

	pass, ok := status.Last()
	if !ok || pass.Err != nil || pass.Report.Examined != 1 || pass.Report.Review != 1 || pass.At.IsZero() {
		t.Fatalf("Last = %+v, %v; want one action examined and put up for review", pass, ok)
	}
	if got := b.status(t, key); got != once.StatusReview {
		t.Errorf("the dead claim is %s, want review", got)
	}
	body := b.get("/").Body.String()
	if m := reaperRow.FindStringSubmatch(body); m == nil || m[1] != "1" || m[2] != "1" || m[3] != "0" {
		t.Errorf("the overview's reaper row is %v, want 1 examined, 1 to review, 0 released:\n%s", m, body)
	}
	if strings.Contains(body, "The pass failed") {
		t.Errorf("a good pass is shown as failed")
	}

	// A reaper over a store that went away fails its pass, and says so.
	down, err := sqlite.Open(filepath.Join(t.TempDir(), "down.db"), sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := down.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	downClient, err := once.New(once.Config{Store: down})
	if err != nil {
		t.Fatal(err)
	}
	down.Close()
	failed := new(console.ReaperStatus)
	waitPass(t, startReaper(t, downClient, failed))
	if pass, ok := failed.Last(); !ok || pass.Err == nil {
		t.Fatalf("a pass over a closed store: %+v, %v; want an error", pass, ok)
	}
	b.mount(t, console.Config{Client: b.client, Reaper: failed})
	if body := b.get("/").Body.String(); !strings.Contains(body, "The pass failed") || !strings.Contains(body, "closed") {
		t.Errorf("the overview does not show the failed pass:\n%s", body)
	}
}
