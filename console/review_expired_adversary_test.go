package console_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/console/internal/consoletest"
	"github.com/oncehq/once/internal/testdb"
)

// TestReviewOfExpiredApprovalSaysItNeverRan: a gated kind with OnExpiry
// StatusReview puts a wait nobody answered up for review. Its effect
// certainly never ran (attempt 1, never approved), yet the review page
// tells the person "These actions may or may not have happened; the
// machine cannot tell. Check …, then decide: Done if it happened", and
// offers Done ("It happened: record success"). Done then records a
// success that never happened: every duplicate (an idemhttp repeat is
// answered "was carried out") is told it ran. The page must say this
// one did not run, and not offer to record that it did.
func TestReviewOfExpiredApprovalSaysItNeverRan(t *testing.T) {
	t.Parallel()
	cfg := once.Config{Kinds: map[string]once.KindPolicy{consoletest.GatedKind: {Approval: once.ApprovalPolicy{Always: true, Expiry: time.Second, OnExpiry: once.StatusReview}}}}
	c, _ := testdb.SQLiteClient(t, cfg)
	var runs consoletest.Runs
	key := consoletest.Await(t, c, consoletest.Transfer(0, "DE89370400440532013000", 9_900_000), &runs)
	awaitExpiry(t, c, key)
	r, err := once.NewReaper(c, once.ReaperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := r.RunOnce(context.Background()); err != nil || rep.Expired != 1 {
		t.Fatalf("reaper = %+v, %v", rep, err)
	}
	if a, _ := c.Get(context.Background(), key); a.Status != once.StatusReview || a.Attempt != 1 || runs.N() != 0 {
		t.Fatalf("setup: %s at attempt %d, ran %d", a.Status, a.Attempt, runs.N())
	}
	b := gatedBundle(t, c, mounts[0])
	page := b.get("/review").Body.String()
	if !strings.Contains(page, `id="item-`+string(key)+`"`) {
		t.Fatalf("setup: the review queue does not list %s", key)
	}
	item := page[strings.Index(page, `id="item-`+string(key)+`"`):]
	if strings.Contains(page, "may or may not have happened") && strings.Contains(item, `value="done"`) {
		t.Errorf("the review page says of an action whose approval wait expired (it never ran) that it " +
			"may or may not have happened, and offers Done (record success) for it")
	}
	if strings.Contains(b.get("/actions/"+string(key)).Body.String(), `value="done"`) {
		t.Errorf("the action page of a never-run, never-approved action offers Done: it records a success that never happened")
	}
}
