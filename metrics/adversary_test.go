package metrics_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/metrics"
)

// TestAdversaryWaitingGaugeZeroedByFailedPass: once_released_waiting is
// 1 while an action waits for a delivery. Then the database goes away:
// the next reaper pass fails before it gets to the released actions,
// its report says Waiting 0, and ObservePass sets the gauge to 0. An
// alert on once_released_waiting > 0 clears during the outage, while
// the action still waits.
func TestAdversaryWaitingGaugeZeroedByFailedPass(t *testing.T) {
	ctx := context.Background()
	c, store := testdb.SQLiteClient(t, once.Config{Default: once.KindPolicy{RedriveAfter: 30 * time.Millisecond}})
	in := once.Intent{Run: "r", Kind: "send_email", Target: "ada"}
	once.Do(ctx, c, in, func(context.Context, once.Attempt) (int, error) { return 0, errors.New("reset after DATA") })
	k, _, _ := once.KeyOf(in)
	if _, err := c.Resolve(ctx, k, once.Resolution{Decision: once.DecisionRetry, By: "ada", Note: "send again"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)

	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := once.NewReaper(c, once.ReaperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	m.ObservePass(r.RunOnce(ctx))
	if got := waiting(t, reg); got != 1 {
		t.Fatalf("once_released_waiting after a good pass: %v, want 1", got)
	}

	store.Close() // the database goes away
	rep, err := r.RunOnce(ctx)
	if err == nil {
		t.Fatal("a pass over a closed store did not fail")
	}
	m.ObservePass(rep, err)
	if got := waiting(t, reg); got != 1 {
		t.Errorf("once_released_waiting after a failed pass: %v, want it kept at 1 (the action still waits; the pass could not count)", got)
	}
}

// waiting reads once_released_waiting from reg.
func waiting(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "once_released_waiting" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("no once_released_waiting")
	return 0
}
