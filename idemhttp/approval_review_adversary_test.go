package idemhttp_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/oncehq/once"
)

// TestApprovalExpiredToReviewNotToldDead: a kind whose unanswered wait
// goes to review (OnExpiry: StatusReview) leaves the request to a person,
// who may still Retry it, and then it runs. Before the reaper's pass, a
// repeat is told "it does not run: use a new key to ask again"; after
// it, "a person decides what then. Contact the operator". The first
// answer sends the client to make the same request again under a new
// key, while the old one may still be run by a person: two payments.
// Both answers must say the same: a person decides.
func TestApprovalExpiredToReviewNotToldDead(t *testing.T) {
	h := &orders{}
	srv, c := serveGated(t, h, once.KindPolicy{Approval: once.ApprovalPolicy{Always: true, Expiry: time.Second, OnExpiry: once.StatusReview}})
	exp := awaitingReply(t, post(t, srv.URL, "k-review-early", "acme", `{"sku":"tea"}`))
	time.Sleep(time.Until(exp) + 1100*time.Millisecond)
	// No reaper pass yet: the row still awaits approval, its wait over.
	early := post(t, srv.URL, "k-review-early", "acme", `{"sku":"tea"}`)
	problemOf(t, early, http.StatusConflict)

	// What the client was told is then shown wrong: the reaper puts it
	// up for review, a person retries it, and the same key runs.
	r, err := once.NewReaper(c, once.ReaperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := r.RunOnce(context.Background()); err != nil || rep.Expired != 1 {
		t.Fatalf("reaper = %+v, %v", rep, err)
	}
	if _, err := c.Resolve(context.Background(), orderKey(t, c, "k-review-early"), once.Resolution{Decision: once.DecisionRetry, By: "ada", Note: "the customer called; go ahead"}); err != nil {
		t.Fatalf("Retry of the expired-to-review request: %v", err)
	}
	ran := post(t, srv.URL, "k-review-early", "acme", `{"sku":"tea"}`)
	if ran.status != http.StatusCreated || h.runs.Load() != 1 {
		t.Fatalf("setup: after a person's Retry the key's repeat answered %d (ran %d): %s", ran.status, h.runs.Load(), ran.body)
	}
	if strings.Contains(early.body, "use a new key") || strings.Contains(early.body, "it does not run") {
		t.Fatalf("a request whose wait expired into review was told, before the reaper's pass: %s; "+
			"yet a person retried it and the same key then ran the handler. Told to use a new key, the client sends the "+
			"request again under another one: two effects. Want what it is told after the pass: a person decides", early.body)
	}
}
