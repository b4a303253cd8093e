package idemhttp_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/idemhttp"
	"github.com/oncehq/once/internal/testdb"
)

// TestApprovalKeyMissingSaysGated: a gated route refuses a request
// without a key, Optional or not, and When or Always: 400 key-missing,
// saying the route waits for approval. Another route behind the same
// Optional middleware still lets a keyless request through.
func TestApprovalKeyMissingSaysGated(t *testing.T) {
	for _, tc := range []struct {
		name     string
		optional bool
		pol      once.ApprovalPolicy
	}{
		{"optional, always", true, once.ApprovalPolicy{Always: true}},
		{"optional, when", true, once.ApprovalPolicy{When: func(once.Intent) bool { return false }}},
		{"required, always", false, once.ApprovalPolicy{Always: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &orders{}
			c, _ := testdb.SQLiteClient(t, once.Config{Kinds: map[string]once.KindPolicy{approvalKind: {Approval: tc.pol}}})
			mux := http.NewServeMux()
			mux.Handle("POST /orders", h)
			mux.Handle("POST /notes", h)
			srv := httptest.NewServer(idemhttp.Middleware(c, idemhttp.Config{Optional: tc.optional, Scope: func(*http.Request) string { return "tenant:acme" }})(mux))
			t.Cleanup(srv.Close)

			r := post(t, srv.URL, "", "acme", `{"sku":"tea"}`)
			if code := problemOf(t, r, http.StatusBadRequest); code != "key-missing" || !strings.Contains(r.body, "approval") {
				t.Fatalf("a keyless request on a gated route: %s; want 400 key-missing saying the route waits for approval", r.body)
			}
			if n := h.runs.Load(); n != 0 {
				t.Fatalf("the handler ran %d times", n)
			}
			if !tc.optional {
				return
			}
			resp, err := http.Post(srv.URL+"/notes", "application/json", strings.NewReader(`{}`))
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated || h.runs.Load() != 1 {
				t.Fatalf("a keyless request on an ungated route behind Optional: %d, ran %d; want it run", resp.StatusCode, h.runs.Load())
			}
		})
	}
}

// do sends method to url with key (none if empty) and returns the reply.
func do(t *testing.T, method, url, key string) reply {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set(idemhttp.Header, key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, string(b)}
}

// TestApprovalGateOnOtherMethods: a gated DELETE, outside the default
// Methods, goes through the gate: 202 until approved, then run once and
// replayed. An ungated DELETE, and a GET (a safe method) even on a kind
// the Default gates, pass straight to the handler as before.
func TestApprovalGateOnOtherMethods(t *testing.T) {
	h := &orders{}
	const kind = "http:DELETE /orders/{id}"
	gate := map[string]once.KindPolicy{kind: {Approval: once.ApprovalPolicy{Always: true, Expiry: time.Hour}}}
	// c gates every kind (Default), c2 only the DELETE of an order.
	c, _ := testdb.SQLiteClient(t, once.Config{Default: once.KindPolicy{Approval: once.ApprovalPolicy{Always: true}}, Kinds: gate})
	c2, _ := testdb.SQLiteClient(t, once.Config{Kinds: gate})
	mux := http.NewServeMux()
	mux.Handle("DELETE /orders/{id}", h)
	mux.Handle("DELETE /carts/{id}", h)
	mux.Handle("GET /orders/{id}", h)
	scope := idemhttp.Config{Scope: func(*http.Request) string { return "tenant:acme" }}
	srv := httptest.NewServer(idemhttp.Middleware(c, scope)(mux))
	t.Cleanup(srv.Close)
	plain := httptest.NewServer(idemhttp.Middleware(c2, scope)(mux))
	t.Cleanup(plain.Close)

	awaitingReply(t, do(t, http.MethodDelete, srv.URL+"/orders/42", "k-del"))
	awaitingReply(t, do(t, http.MethodDelete, srv.URL+"/orders/42", "k-del"))
	if code := problemOf(t, do(t, http.MethodDelete, srv.URL+"/orders/42", ""), http.StatusBadRequest); code != "key-missing" {
		t.Fatalf("a keyless gated DELETE: code %s; want key-missing", code)
	}
	if n := h.runs.Load(); n != 0 {
		t.Fatalf("a gated DELETE ran the handler %d times before approval", n)
	}
	acts, err := c.List(context.Background(), once.Filter{Kind: kind})
	if err != nil || len(acts) != 1 {
		t.Fatalf("actions of %s: %d, %v; want 1", kind, len(acts), err)
	}
	if _, err := c.Approve(context.Background(), acts[0].Key, once.Approval{By: "ada", Attempt: acts[0].Attempt, Fingerprint: acts[0].Fingerprint}); err != nil {
		t.Fatal(err)
	}
	first := do(t, http.MethodDelete, srv.URL+"/orders/42", "k-del")
	again := do(t, http.MethodDelete, srv.URL+"/orders/42", "k-del")
	if first.status != http.StatusCreated || again.body != first.body || again.header.Get(idemhttp.ReplayedHeader) != "true" || h.runs.Load() != 1 {
		t.Fatalf("after approval: %d %s, then %d %s (replayed %q), ran %d; want it run once and replayed",
			first.status, first.body, again.status, again.body, again.header.Get(idemhttp.ReplayedHeader), h.runs.Load())
	}

	// A GET is safe: not keyed, though the Default gates its kind.
	if r := do(t, http.MethodGet, srv.URL+"/orders/42", ""); r.status != http.StatusCreated || h.runs.Load() != 2 {
		t.Fatalf("GET: %d %s, ran %d; want it passed to the handler", r.status, r.body, h.runs.Load())
	}
	// An ungated DELETE is not keyed either, as before.
	if r := do(t, http.MethodDelete, plain.URL+"/carts/7", ""); r.status != http.StatusCreated || h.runs.Load() != 3 {
		t.Fatalf("ungated DELETE: %d %s, ran %d; want it passed to the handler", r.status, r.body, h.runs.Load())
	}
}

// payloadOf is the stored payload of tenant acme's POST /orders with key.
func payloadOf(t *testing.T, c *once.Client, key string) map[string]any {
	t.Helper()
	a, err := c.Get(context.Background(), orderKey(t, c, key))
	if err != nil {
		t.Fatal(err)
	}
	var p map[string]any
	if err := json.Unmarshal(a.Payload, &p); err != nil {
		t.Fatalf("payload %s: %v", a.Payload, err)
	}
	return p
}

// TestApprovalPayloadForms: a gated request's payload holds its body by
// what the bytes are: JSON as JSON, other text as text (JSON once could
// not keep as written too), anything else in base64; the same bytes make
// the same fingerprint, and other bytes (whitespace too) another.
func TestApprovalPayloadForms(t *testing.T) {
	h := &orders{}
	srv, c := serveGated(t, h, once.KindPolicy{Approval: once.ApprovalPolicy{Always: true, Expiry: time.Hour}})
	for _, tc := range []struct {
		key, body, field string
		want             any
	}{
		{"k-json", `{"iban":"DE89","cents":250000}`, "body", map[string]any{"iban": "DE89", "cents": 250000.0}},
		{"k-text", "pay DE89 2500.00 EUR\n", "body_text", "pay DE89 2500.00 EUR\n"},
		{"k-bigint", `{"cents":123456789012345678901}`, "body_text", `{"cents":123456789012345678901}`},
		{"k-dup", `{"a":1,"a":2}`, "body_text", `{"a":1,"a":2}`},
		{"k-bin", "\xff\x00\x01", "body_base64", "/wAB"},
	} {
		awaitingReply(t, post(t, srv.URL, tc.key, "acme", tc.body))
		p := payloadOf(t, c, tc.key)
		if got, _ := json.Marshal(p[tc.field]); string(got) != mustJSON(t, tc.want) || p["method"] != "POST" || p["path"] != "/orders" || p["body_sha256"] == nil {
			t.Fatalf("%s: payload %v; want %s = %s beside method, path and body_sha256", tc.key, p, tc.field, mustJSON(t, tc.want))
		}
		awaitingReply(t, post(t, srv.URL, tc.key, "acme", tc.body))
	}
	if code := problemOf(t, post(t, srv.URL, "k-json", "acme", `{"iban":"DE89", "cents":250000}`), http.StatusUnprocessableEntity); code != "key-reused" {
		t.Fatalf("the same JSON with other whitespace: code %s; want key-reused, as without a gate", code)
	}
	if n := h.runs.Load(); n != 0 {
		t.Fatalf("ran %d times", n)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestApprovalBodyTooLargeToShow: a gated request whose body cannot be
// shown within the client's MaxPayloadBytes is refused with 413, before
// anything is claimed; ungated, the same body is taken (its hash is the
// payload).
func TestApprovalBodyTooLargeToShow(t *testing.T) {
	h := &orders{}
	always := once.KindPolicy{Approval: once.ApprovalPolicy{Always: true}}
	c, _ := testdb.SQLiteClient(t, once.Config{MaxPayloadBytes: 4 << 10, Kinds: map[string]once.KindPolicy{approvalKind: always, "http:POST /docs/{id}": always}})
	mux := http.NewServeMux()
	mw := idemhttp.Middleware(c, idemhttp.Config{Scope: func(*http.Request) string { return "tenant:acme" }})
	mux.Handle("POST /orders", mw(h))
	mux.Handle("POST /notes", mw(h))
	mux.Handle("POST /docs/{id}", mw(h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	big := `{"text":"` + strings.Repeat("x", 8<<10) + `"}`
	r := post(t, srv.URL, "k-big", "acme", big)
	if code := problemOf(t, r, http.StatusRequestEntityTooLarge); code != "body-too-large-to-approve" {
		t.Fatalf("code %s (%s); want body-too-large-to-approve", code, r.body)
	}
	if acts, err := c.List(context.Background(), once.Filter{}); err != nil || len(acts) != 0 || h.runs.Load() != 0 {
		t.Fatalf("%d actions (%v), ran %d; want nothing claimed or run", len(acts), err, h.runs.Load())
	}
	// A payload at fault for another reason than the body's size is
	// not said to be too large: a path that is not UTF-8.
	odd, _ := http.NewRequest(http.MethodPost, srv.URL+"/docs/%ff", strings.NewReader(`{}`))
	odd.Header.Set(idemhttp.Header, "k-odd")
	resp, err := http.DefaultClient.Do(odd)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "request-invalid") {
		t.Fatalf("a gated request whose path is not UTF-8: %d %s; want 400 request-invalid", resp.StatusCode, b)
	}

	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/notes", strings.NewReader(big))
	req.Header.Set(idemhttp.Header, "k-big")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("the same body on an ungated route: %d; want it run", resp.StatusCode)
	}
}

// TestUngatedPayloadUnchanged: an ungated kind's payload is what it has
// always been (method, path, query, body_sha256), so its fingerprints
// do not change.
func TestUngatedPayloadUnchanged(t *testing.T) {
	c, _ := testdb.SQLiteClient(t, once.Config{})
	srv := httptest.NewServer(idemhttp.Middleware(c, idemhttp.Config{Scope: func(*http.Request) string { return "tenant:acme" }})(&orders{}))
	t.Cleanup(srv.Close)
	if r := post(t, srv.URL, "k-plain", "acme", `{"sku":"tea"}`); r.status != http.StatusCreated {
		t.Fatalf("%d %s", r.status, r.body)
	}
	acts, err := c.List(context.Background(), once.Filter{})
	if err != nil || len(acts) != 1 {
		t.Fatalf("%d actions, %v", len(acts), err)
	}
	const want = `{"body_sha256":"522055bcc47ec4c33c7af9eb4be94d09680871370bad79fbd5569519641bd86f","method":"POST","path":"/orders"}`
	if got := string(acts[0].Payload); got != want {
		t.Fatalf("payload %s; want %s", got, want)
	}
}

// TestGatingChangeKeepsTheRecord: a key first used while its kind was
// not gated is the same request once the kind is (the payload then
// shows the body), and the other way round: a repeat gets the record's
// answer, not a 422.
func TestGatingChangeKeepsTheRecord(t *testing.T) {
	h := &orders{}
	plain, s := testdb.SQLiteClient(t, once.Config{})
	gated, err := once.New(once.Config{Store: s, Kinds: map[string]once.KindPolicy{approvalKind: {Approval: once.ApprovalPolicy{Always: true}}}})
	if err != nil {
		t.Fatal(err)
	}
	serveWith := func(c *once.Client) string {
		mux := http.NewServeMux()
		mux.Handle("POST /orders", idemhttp.Middleware(c, idemhttp.Config{Scope: func(r *http.Request) string { return "tenant:" + r.Header.Get("X-Tenant") }})(h))
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		return srv.URL
	}
	before, after := serveWith(plain), serveWith(gated)

	first := post(t, before, "k-up", "acme", `{"sku":"tea"}`)
	again := post(t, after, "k-up", "acme", `{"sku":"tea"}`)
	if first.status != http.StatusCreated || again.body != first.body || again.header.Get(idemhttp.ReplayedHeader) != "true" {
		t.Fatalf("ungated %d %s, then gated %d %s; want the first replayed", first.status, first.body, again.status, again.body)
	}
	if code := problemOf(t, post(t, after, "k-up", "acme", `{"sku":"milk"}`), http.StatusUnprocessableEntity); code != "key-reused" {
		t.Fatalf("another body: code %s; want key-reused", code)
	}

	awaitingReply(t, post(t, after, "k-down", "acme", `{"sku":"tea"}`))
	if _, err := gated.Approve(context.Background(), orderKey(t, gated, "k-down"), once.Approval{By: "ada"}); err != nil {
		t.Fatal(err)
	}
	if r := post(t, before, "k-down", "acme", `{"sku":"tea"}`); r.status != http.StatusCreated || h.runs.Load() != 2 {
		t.Fatalf("approved while gated, repeated ungated: %d %s (ran %d); want it run", r.status, r.body, h.runs.Load())
	}
}
