package idemhttp_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/idemhttp"
	"github.com/oncehq/once/internal/testdb"
)

// TestApprovalGateNotBypassedWithoutKey: on a route whose kind always
// asks for approval, a request that simply leaves out the
// Idempotency-Key (Config.Optional) must not run the handler unasked.
// Optional lets a keyless request through "as it would be without the
// middleware"; for a gated kind that skips the person entirely: a
// client avoids the approval of a large payment by dropping a header.
func TestApprovalGateNotBypassedWithoutKey(t *testing.T) {
	h := &orders{}
	c, _ := testdb.SQLiteClient(t, once.Config{Kinds: map[string]once.KindPolicy{approvalKind: {Approval: once.ApprovalPolicy{Always: true, Expiry: time.Hour}}}})
	mux := http.NewServeMux()
	mux.Handle("POST /orders", idemhttp.Middleware(c, idemhttp.Config{
		Optional: true,
		Scope:    func(r *http.Request) string { return "tenant:" + r.Header.Get("X-Tenant") },
	})(h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	// With a key: the gate holds.
	awaitingReply(t, post(t, srv.URL, "k-keyed", "acme", `{"sku":"tea","cents":250000}`))
	if n := h.runs.Load(); n != 0 {
		t.Fatalf("setup: the keyed request ran the handler %d times before approval", n)
	}
	// Without one: the handler must not run before a person approves.
	r := post(t, srv.URL, "", "acme", `{"sku":"tea","cents":250000}`)
	if n := h.runs.Load(); n != 0 {
		t.Fatalf("a request without an Idempotency-Key on a route whose kind always asks for approval ran the handler "+
			"%d time(s), unapproved (answer %d %s); want it refused (400 key-missing) or held for approval", n, r.status, r.body)
	}
}
