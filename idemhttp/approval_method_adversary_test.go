package idemhttp_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/idemhttp"
	"github.com/oncehq/once/internal/testdb"
)

// TestApprovalGateNotBypassedByMethod: an application gates DELETE
// /orders/{id} (kind "http:DELETE /orders/{id}", as the middleware names
// it). With the default Methods (POST, PATCH), the middleware passes a
// DELETE straight to the handler: the kind's approval policy is never
// consulted, and the handler runs unasked, with nothing said anywhere.
func TestApprovalGateNotBypassedByMethod(t *testing.T) {
	h := &orders{}
	const kind = "http:DELETE /orders/{id}"
	c, _ := testdb.SQLiteClient(t, once.Config{Kinds: map[string]once.KindPolicy{kind: {Approval: once.ApprovalPolicy{Always: true, Expiry: time.Hour}}}})
	mux := http.NewServeMux()
	mux.Handle("DELETE /orders/{id}", h)
	srv := httptest.NewServer(idemhttp.Middleware(c, idemhttp.Config{Scope: func(r *http.Request) string { return "tenant:acme" }})(mux))
	t.Cleanup(srv.Close)

	req, err := http.NewRequest(http.MethodDelete, srv.URL+"/orders/42", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(idemhttp.Header, "k-delete")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if n := h.runs.Load(); n != 0 {
		t.Fatalf("DELETE on a route whose kind %q always asks for approval ran the handler %d time(s), unapproved (answer %d %s); "+
			"want it held for approval, or the middleware to refuse a gated kind it will not key", kind, n, resp.StatusCode, b)
	}
}
