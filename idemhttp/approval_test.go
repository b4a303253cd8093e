package idemhttp_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/idemhttp"
	"github.com/oncehq/once/internal/testdb"
)

// approvalKind is the kind of the POST /orders route behind the
// middleware, which the tests' policies gate.
const approvalKind = "http:POST /orders"

// serveGated is serve, with the route's kind under pol.
func serveGated(t *testing.T, h http.Handler, pol once.KindPolicy) (*httptest.Server, *once.Client) {
	t.Helper()
	c, _ := testdb.SQLiteClient(t, once.Config{Kinds: map[string]once.KindPolicy{approvalKind: pol}})
	mux := http.NewServeMux()
	mux.Handle("POST /orders", idemhttp.Middleware(c, idemhttp.Config{Scope: func(r *http.Request) string { return "tenant:" + r.Header.Get("X-Tenant") }})(h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv, c
}

// awaitingReply checks r is the 202 of a request awaiting approval and
// returns the expiry its body names.
func awaitingReply(t *testing.T, r reply) time.Time {
	t.Helper()
	if r.status != http.StatusAccepted || r.header.Get("Content-Type") != "application/json" || r.header.Get(idemhttp.ReplayedHeader) != "" {
		t.Fatalf("answer %d %q (replayed %q): %s; want 202 application/json, not marked replayed", r.status, r.header.Get("Content-Type"), r.header.Get(idemhttp.ReplayedHeader), r.body)
	}
	if n, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || n < 1 || n > 61 {
		t.Fatalf("Retry-After %q; want whole seconds, at most a minute", r.header.Get("Retry-After"))
	}
	var p struct {
		Code, Detail, Expires string
		Status                int
	}
	if err := json.Unmarshal([]byte(r.body), &p); err != nil || p.Code != "awaiting-approval" || p.Status != http.StatusAccepted {
		t.Fatalf("body %s (%v); want code awaiting-approval and status 202", r.body, err)
	}
	exp, err := time.Parse(time.RFC3339, p.Expires)
	if err != nil || !strings.Contains(p.Detail, p.Expires) {
		t.Fatalf("expires %q (%v), detail %q; want the expiry, in RFC 3339 and in the detail", p.Expires, err, p.Detail)
	}
	return exp
}

// orderKey is the action key of tenant acme's POST /orders with key.
func orderKey(t *testing.T, c *once.Client, key string) once.Key {
	t.Helper()
	acts, err := c.List(context.Background(), once.Filter{Kind: approvalKind})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range acts {
		if a.Target == key {
			return a.Key
		}
	}
	t.Fatalf("no action for Idempotency-Key %s among %d", key, len(acts))
	return ""
}

// TestApprovalAcceptedThenRunOnce: a request on a route whose kind asks
// for approval is answered 202 with Retry-After and the wait's expiry,
// and its repeat the same, without the handler running. After a person
// approves, the next repeat runs the handler, once, and the one after
// gets its answer replayed.
func TestApprovalAcceptedThenRunOnce(t *testing.T) {
	h := &orders{}
	srv, c := serveGated(t, h, once.KindPolicy{Approval: once.ApprovalPolicy{Always: true, Expiry: time.Hour}})
	first := awaitingReply(t, post(t, srv.URL, "k-approve", "acme", `{"sku":"tea"}`))
	if d := time.Until(first); d < 59*time.Minute || d > 61*time.Minute {
		t.Fatalf("the answer says the wait expires in %v; want an hour, as the kind asks", d)
	}
	if again := awaitingReply(t, post(t, srv.URL, "k-approve", "acme", `{"sku":"tea"}`)); !again.Equal(first) {
		t.Fatalf("the repeat names expiry %v, the first %v; want the same wait", again, first)
	}
	if n := h.runs.Load(); n != 0 {
		t.Fatalf("the handler ran %d times before anyone approved it", n)
	}
	if _, err := c.Approve(context.Background(), orderKey(t, c, "k-approve"), once.Approval{By: "ada", Via: "console"}); err != nil {
		t.Fatal(err)
	}
	ran := post(t, srv.URL, "k-approve", "acme", `{"sku":"tea"}`)
	if ran.status != http.StatusCreated || ran.header.Get(idemhttp.ReplayedHeader) != "" || h.runs.Load() != 1 {
		t.Fatalf("after approval: %d (replayed %q), handler ran %d times: %s; want 201 from one run", ran.status, ran.header.Get(idemhttp.ReplayedHeader), h.runs.Load(), ran.body)
	}
	replay := post(t, srv.URL, "k-approve", "acme", `{"sku":"tea"}`)
	if replay.status != http.StatusCreated || replay.header.Get(idemhttp.ReplayedHeader) != "true" || replay.body != ran.body || h.runs.Load() != 1 {
		t.Fatalf("the repeat after the run: %d (replayed %q), handler ran %d times: %s; want the 201 replayed", replay.status, replay.header.Get(idemhttp.ReplayedHeader), h.runs.Load(), replay.body)
	}
	if other := post(t, srv.URL, "k-approve", "acme", `{"sku":"coffee"}`); problemOf(t, other, http.StatusUnprocessableEntity) != "key-reused" {
		t.Fatalf("the key with another body after approval: %s; want key-reused", other.body)
	}
}

// TestApprovalRejectedAnswered: a rejected request is answered 409 with
// the person's reason, to every repeat, and the handler never runs; the
// answer does not name who rejected it.
func TestApprovalRejectedAnswered(t *testing.T) {
	h := &orders{}
	srv, c := serveGated(t, h, once.KindPolicy{Approval: once.ApprovalPolicy{Always: true}})
	awaitingReply(t, post(t, srv.URL, "k-reject", "acme", `{"sku":"tea"}`))
	if _, err := c.Reject(context.Background(), orderKey(t, c, "k-reject"), once.Approval{By: "grace.hopper", Note: "the customer is unknown"}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		r := post(t, srv.URL, "k-reject", "acme", `{"sku":"tea"}`)
		if code := problemOf(t, r, http.StatusConflict); code != "key-rejected" || !strings.Contains(r.body, "the customer is unknown") || strings.Contains(r.body, "grace.hopper") {
			t.Fatalf("a rejected request: code %q, body %s; want key-rejected with the reason, and not the person's name", code, r.body)
		}
	}
	if n := h.runs.Load(); n != 0 {
		t.Fatalf("the handler of a rejected request ran %d times", n)
	}
}

// TestApprovalExpiredAnswered: a request whose wait expired unanswered
// is told it does not run, not sent round again with 202.
func TestApprovalExpiredAnswered(t *testing.T) {
	h := &orders{}
	srv, _ := serveGated(t, h, once.KindPolicy{Approval: once.ApprovalPolicy{Always: true, Expiry: time.Second}})
	exp := awaitingReply(t, post(t, srv.URL, "k-expire", "acme", `{"sku":"tea"}`))
	time.Sleep(time.Until(exp) + 1100*time.Millisecond)
	r := post(t, srv.URL, "k-expire", "acme", `{"sku":"tea"}`)
	if code := problemOf(t, r, http.StatusConflict); code != "approval-expired" || r.header.Get("Retry-After") != "" {
		t.Fatalf("a request whose wait expired: code %q, Retry-After %q; want approval-expired, and no Retry-After", code, r.header.Get("Retry-After"))
	}
	if n := h.runs.Load(); n != 0 {
		t.Fatalf("the handler of an expired request ran %d times", n)
	}
}

// A request whose wait expired into review (OnExpiry StatusReview) is
// told it did not run and a person decides, not that it stopped before
// its outcome was known.
func TestApprovalExpiredToReviewAnswered(t *testing.T) {
	h := &orders{}
	srv, c := serveGated(t, h, once.KindPolicy{Approval: once.ApprovalPolicy{Always: true, Expiry: time.Second, OnExpiry: once.StatusReview}})
	exp := awaitingReply(t, post(t, srv.URL, "k-review", "acme", `{"sku":"tea"}`))
	time.Sleep(time.Until(exp) + 1100*time.Millisecond)
	r, err := once.NewReaper(c, once.ReaperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := r.RunOnce(context.Background()); err != nil || rep.Expired != 1 {
		t.Fatalf("reaper = %+v, %v", rep, err)
	}
	got := post(t, srv.URL, "k-review", "acme", `{"sku":"tea"}`)
	if code := problemOf(t, got, http.StatusConflict); code != "approval-expired" || !strings.Contains(string(got.body), "did not run") {
		t.Fatalf("a request whose wait expired into review: code %q, body %s; want approval-expired, saying it did not run", code, got.body)
	}
	if n := h.runs.Load(); n != 0 {
		t.Fatalf("the handler ran %d times", n)
	}
}
