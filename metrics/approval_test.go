package metrics_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/metrics"
)

// Approval gates are counted: waits begun (once per action, however many
// duplicates), and decisions by outcome, the reaper's expiry among them.
func TestApprovalsAreCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := testdb.SQLiteClient(t, once.Config{Hooks: m.Hooks(), Default: once.KindPolicy{Approval: once.ApprovalPolicy{Always: true, Expiry: time.Second}}})
	ctx := context.Background()
	effect := func(context.Context, once.Attempt) (string, error) { return "sent", nil }
	keys := make([]once.Key, 3)
	for i := range keys {
		in := once.Intent{Run: "r", Step: int64(i), Kind: "pay", Target: "t"}
		for range 2 {
			if _, err := once.Do(ctx, c, in, effect); !errors.Is(err, once.ErrAwaitingApproval) {
				t.Fatalf("Do = %v", err)
			}
		}
		keys[i], _, _ = once.KeyOf(in)
	}
	if _, err := c.Approve(ctx, keys[0], once.Approval{By: "ada"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Reject(ctx, keys[1], once.Approval{By: "ada", Note: "no"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1200 * time.Millisecond)
	r, _ := once.NewReaper(c, once.ReaperConfig{})
	if rep, err := r.RunOnce(ctx); err != nil || rep.Expired != 1 {
		t.Fatalf("reaper = %+v, %v", rep, err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP once_approval_decisions_total Decisions on actions that waited for approval: approved, rejected, or expired unanswered.
# TYPE once_approval_decisions_total counter
once_approval_decisions_total{decision="approved",kind="pay"} 1
once_approval_decisions_total{decision="expired",kind="pay"} 1
once_approval_decisions_total{decision="rejected",kind="pay"} 1
# HELP once_approval_waits_total Actions that began to wait for a person's approval.
# TYPE once_approval_waits_total counter
once_approval_waits_total{kind="pay"} 3
`), "once_approval_waits_total", "once_approval_decisions_total"); err != nil {
		t.Fatal(err)
	}
}
