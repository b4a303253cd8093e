package idemhttp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/idemhttp"
	"github.com/oncehq/once/internal/testdb"
)

// orders is a POST handler that counts its executions and answers 201
// with a body naming the execution, so a replay is told from a rerun.
type orders struct {
	runs atomic.Int64
	// status, when set, answers the n-th execution (1-based) with it.
	status func(n int64) int
	// block, when set, is waited on before answering; started is
	// closed when the first execution begins.
	block   chan struct{}
	started chan struct{}
	once    sync.Once
}

func (o *orders) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := o.runs.Add(1)
	if o.started != nil {
		o.once.Do(func() { close(o.started) })
	}
	if o.block != nil {
		<-o.block
	}
	body, _ := io.ReadAll(r.Body)
	status := http.StatusCreated
	if o.status != nil {
		status = o.status(n)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/orders/%d", n))
	w.Header().Set("X-Request-Only", "yes")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"order":%d,"got":%q}`, n, body)
}

// serve starts a loopback server with h behind the middleware, over a
// new SQLite store; the scope is the X-Tenant header (a test stand-in
// for an authenticated identity).
func serve(t *testing.T, h http.Handler, cfg idemhttp.Config) *httptest.Server {
	t.Helper()
	c, _ := testdb.SQLiteClient(t, once.Config{})
	if cfg.Scope == nil {
		cfg.Scope = func(r *http.Request) string {
			if t := r.Header.Get("X-Tenant"); t != "" {
				return "tenant:" + t
			}
			return ""
		}
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", idemhttp.Middleware(c, cfg)(h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

type reply struct {
	status int
	header http.Header
	body   string
}

func post(t *testing.T, url, key, tenant, body string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/orders", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	req.Header.Set("X-Tenant", tenant)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{resp.StatusCode, resp.Header, string(b)}
}

// problemOf checks that r is an RFC 9457 problem with status and returns
// its code.
func problemOf(t *testing.T, r reply, status int) string {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d; body %s", r.status, status, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json", ct)
	}
	var p struct {
		Type, Title, Detail, Code string
		Status                    int
	}
	if err := json.Unmarshal([]byte(r.body), &p); err != nil {
		t.Fatalf("problem body %q: %v", r.body, err)
	}
	if p.Type == "" || p.Title == "" || p.Detail == "" || p.Status != status {
		t.Fatalf("problem %+v lacks type, title, detail or the status %d", p, status)
	}
	return p.Code
}

func TestReplaySameKey(t *testing.T) {
	h := &orders{}
	srv := serve(t, h, idemhttp.Config{})
	first := post(t, srv.URL, "k-1", "a", `{"sku":"x"}`)
	if first.status != http.StatusCreated || first.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first: %d replayed=%q %s", first.status, first.header.Get("Idempotent-Replayed"), first.body)
	}
	if first.header.Get("X-Request-Only") != "yes" {
		t.Fatalf("the first response lost the handler's own headers: %v", first.header)
	}
	second := post(t, srv.URL, `"k-1"`, "a", `{"sku":"x"}`) // the structured-field spelling is the same key
	if second.status != first.status || second.body != first.body {
		t.Fatalf("replay %d %s, want %d %s", second.status, second.body, first.status, first.body)
	}
	if got := second.header.Get("Idempotent-Replayed"); got != "true" {
		t.Fatalf("Idempotent-Replayed = %q, want true", got)
	}
	for _, h := range []string{"Content-Type", "Location"} {
		if second.header.Get(h) != first.header.Get(h) {
			t.Fatalf("replayed %s = %q, want %q", h, second.header.Get(h), first.header.Get(h))
		}
	}
	if second.header.Get("X-Request-Only") != "" {
		t.Fatal("a header outside ReplayHeaders was replayed")
	}
	if n := h.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

func TestDifferentBodySameKey(t *testing.T) {
	h := &orders{}
	srv := serve(t, h, idemhttp.Config{})
	if r := post(t, srv.URL, "k-1", "a", `{"sku":"x"}`); r.status != http.StatusCreated {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	if code := problemOf(t, post(t, srv.URL, "k-1", "a", `{"sku":"y"}`), http.StatusUnprocessableEntity); code != "key-reused" {
		t.Fatalf("code %q", code)
	}
	if n := h.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

func TestMissingKey(t *testing.T) {
	h := &orders{}
	srv := serve(t, h, idemhttp.Config{})
	if code := problemOf(t, post(t, srv.URL, "", "a", `{}`), http.StatusBadRequest); code != "key-missing" {
		t.Fatalf("code %q", code)
	}
	if n := h.runs.Load(); n != 0 {
		t.Fatalf("handler ran %d times, want 0", n)
	}
}

func TestOptionalKeyPassesThrough(t *testing.T) {
	h := &orders{}
	srv := serve(t, h, idemhttp.Config{Optional: true})
	for range 2 {
		if r := post(t, srv.URL, "", "a", `{}`); r.status != http.StatusCreated {
			t.Fatalf("%d %s", r.status, r.body)
		}
	}
	if n := h.runs.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2 (no key, no idempotency)", n)
	}
}

func TestConcurrentSameKey(t *testing.T) {
	h := &orders{block: make(chan struct{}), started: make(chan struct{})}
	srv := serve(t, h, idemhttp.Config{})
	first := make(chan reply, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "k-1")
		req.Header.Set("X-Tenant", "a")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			first <- reply{body: err.Error()}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		first <- reply{resp.StatusCode, resp.Header, string(b)}
	}()
	<-h.started
	second := post(t, srv.URL, "k-1", "a", `{}`)
	close(h.block)
	if code := problemOf(t, second, http.StatusConflict); code != "key-in-flight" {
		t.Fatalf("code %q", code)
	}
	if second.header.Get("Retry-After") == "" {
		t.Fatal("409 for a key in flight has no Retry-After")
	}
	if r := <-first; r.status != http.StatusCreated {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	if n := h.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

func TestServerErrorReleasesKey(t *testing.T) {
	h := &orders{status: func(n int64) int {
		if n == 1 {
			return http.StatusInternalServerError
		}
		return http.StatusCreated
	}}
	srv := serve(t, h, idemhttp.Config{})
	if r := post(t, srv.URL, "k-1", "a", `{}`); r.status != http.StatusInternalServerError || !strings.Contains(r.body, `"order":1`) {
		t.Fatalf("first: %d %s; want the handler's own 500", r.status, r.body)
	}
	retry := post(t, srv.URL, "k-1", "a", `{}`)
	if retry.status != http.StatusCreated || retry.header.Get("Idempotent-Replayed") != "" || !strings.Contains(retry.body, `"order":2`) {
		t.Fatalf("retry: %d %s; want the handler run again", retry.status, retry.body)
	}
	again := post(t, srv.URL, "k-1", "a", `{}`)
	if again.body != retry.body || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("after success: %d %s, want the replay of %s", again.status, again.body, retry.body)
	}
	if n := h.runs.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2", n)
	}
}

func TestClientErrorIsStored(t *testing.T) {
	h := &orders{status: func(int64) int { return http.StatusBadRequest }}
	srv := serve(t, h, idemhttp.Config{})
	first := post(t, srv.URL, "k-1", "a", `{}`)
	second := post(t, srv.URL, "k-1", "a", `{}`)
	if first.status != http.StatusBadRequest || second.status != http.StatusBadRequest || second.body != first.body || second.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("first %d %s, second %d %s", first.status, first.body, second.status, second.body)
	}
	if n := h.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

func TestOversizeBody(t *testing.T) {
	h := &orders{}
	srv := serve(t, h, idemhttp.Config{MaxBodyBytes: 16})
	if code := problemOf(t, post(t, srv.URL, "k-1", "a", strings.Repeat("x", 17)), http.StatusRequestEntityTooLarge); code != "body-too-large" {
		t.Fatalf("code %q", code)
	}
	if r := post(t, srv.URL, "k-2", "a", strings.Repeat("x", 16)); r.status != http.StatusCreated {
		t.Fatalf("a body at the limit: %d %s", r.status, r.body)
	}
	if n := h.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

func TestKeyTooLong(t *testing.T) {
	h := &orders{}
	srv := serve(t, h, idemhttp.Config{})
	if code := problemOf(t, post(t, srv.URL, strings.Repeat("k", 256), "a", `{}`), http.StatusBadRequest); code != "key-malformed" {
		t.Fatalf("code %q", code)
	}
	if r := post(t, srv.URL, strings.Repeat("k", 255), "a", `{}`); r.status != http.StatusCreated {
		t.Fatalf("a key of 255 bytes: %d %s", r.status, r.body)
	}
	if n := h.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

func TestTenantScope(t *testing.T) {
	h := &orders{}
	srv := serve(t, h, idemhttp.Config{})
	a := post(t, srv.URL, "k-1", "a", `{}`)
	b := post(t, srv.URL, "k-1", "b", `{}`)
	if a.status != http.StatusCreated || b.status != http.StatusCreated || b.header.Get("Idempotent-Replayed") != "" || a.body == b.body {
		t.Fatalf("tenant a: %d %s; tenant b: %d %s; want two executions", a.status, a.body, b.status, b.body)
	}
	if n := h.runs.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2", n)
	}
	if code := problemOf(t, post(t, srv.URL, "k-2", "", `{}`), http.StatusBadRequest); code != "no-scope" {
		t.Fatalf("code %q", code)
	}
}

// TestOtherMethodsPassThrough: a GET is idempotent already; the
// middleware leaves it alone.
func TestOtherMethodsPassThrough(t *testing.T) {
	var runs atomic.Int64
	c, _ := testdb.SQLiteClient(t, once.Config{})
	h := idemhttp.Middleware(c, idemhttp.Config{Scope: func(*http.Request) string { return "t" }})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { runs.Add(1) }))
	srv := httptest.NewServer(h)
	defer srv.Close()
	for range 2 {
		resp, err := http.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET: %d", resp.StatusCode)
		}
	}
	if runs.Load() != 2 {
		t.Fatalf("GET ran %d times, want 2", runs.Load())
	}
}

// TestHandlerPanicGoesToReview: a handler that panics may have done its
// work; the default recovery (AskPerson) holds the key for a person, and
// a repeat is refused with 409 instead of running the handler again.
func TestHandlerPanicGoesToReview(t *testing.T) {
	var runs atomic.Int64
	c, _ := testdb.SQLiteClient(t, once.Config{})
	h := idemhttp.Middleware(c, idemhttp.Config{Scope: func(*http.Request) string { return "t" }})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		panic("half done")
	}))
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", "k-1")
	// A fresh connection: net/http resends a keyed request by itself
	// when a reused one fails.
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	if resp, err := fresh.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("the panicking request was answered %d; want the connection dropped", resp.StatusCode)
	}
	r := post(t, srv.URL, "k-1", "a", `{}`)
	if code := problemOf(t, r, http.StatusConflict); code != "outcome-review" {
		t.Fatalf("code %q", code)
	}
	if !strings.Contains(r.body, "person decides") {
		t.Fatalf("detail does not say a person decides: %s", r.body)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

// serveWaiting is serve with cfg.Wait, over a client whose EventWaiting
// observations arrive on the returned channel.
func serveWaiting(t *testing.T, h http.Handler, cfg idemhttp.Config) (*httptest.Server, <-chan struct{}) {
	t.Helper()
	waits := make(chan struct{}, 4)
	c, _ := testdb.SQLiteClient(t, once.Config{Hooks: once.Hooks{OnEvent: func(_ context.Context, o once.Observation) {
		if o.Type == once.EventWaiting {
			waits <- struct{}{}
		}
	}}})
	cfg.Scope = func(r *http.Request) string { return "tenant:" + r.Header.Get("X-Tenant") }
	mux := http.NewServeMux()
	mux.Handle("POST /orders", idemhttp.Middleware(c, cfg)(h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv, waits
}

// goPost sends a request in a goroutine.
func goPost(t *testing.T, url, key, body string) <-chan reply {
	out := make(chan reply, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, url+"/orders", strings.NewReader(body))
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("X-Tenant", "a")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			out <- reply{body: err.Error()}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		out <- reply{resp.StatusCode, resp.Header, string(b)}
	}()
	return out
}

func await[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not happen within 30s", what)
		panic("unreachable")
	}
}

// With Wait, a repeat sent while the first request runs gets the first's
// response, replayed, instead of 409.
func TestWaitGetsTheFirstResponse(t *testing.T) {
	h := &orders{block: make(chan struct{}), started: make(chan struct{})}
	srv, waits := serveWaiting(t, h, idemhttp.Config{Wait: time.Hour})
	first := goPost(t, srv.URL, "k-1", `{}`)
	await(t, h.started, "the first request's handler starting")
	second := goPost(t, srv.URL, "k-1", `{}`)
	await(t, waits, "the repeat waiting")
	close(h.block)
	f := await(t, first, "the first response")
	r := await(t, second, "the repeat's response")
	if f.status != http.StatusCreated || r.status != http.StatusCreated || r.body != f.body || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("first %d %s; repeat %d %s (replayed %q); want the first's response replayed", f.status, f.body, r.status, r.body, r.header.Get("Idempotent-Replayed"))
	}
	if n := h.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

// A first request that runs past Wait: the repeat gets 409 with
// Retry-After, as without waiting, saying how long it waited.
func TestWaitRunsOut(t *testing.T) {
	h := &orders{block: make(chan struct{}), started: make(chan struct{})}
	srv, waits := serveWaiting(t, h, idemhttp.Config{Wait: 300 * time.Millisecond})
	first := goPost(t, srv.URL, "k-1", `{}`)
	await(t, h.started, "the first request's handler starting")
	second := goPost(t, srv.URL, "k-1", `{}`)
	await(t, waits, "the repeat waiting")
	r := await(t, second, "the repeat's response")
	if code := problemOf(t, r, http.StatusConflict); code != "key-in-flight" || !strings.Contains(r.body, "after waiting") {
		t.Fatalf("code %q, body %s", code, r.body)
	}
	if r.header.Get("Retry-After") == "" {
		t.Fatal("409 for a key in flight has no Retry-After")
	}
	close(h.block)
	if f := await(t, first, "the first response"); f.status != http.StatusCreated {
		t.Fatalf("first: %d %s", f.status, f.body)
	}
}

// A first request whose response is not kept (a 5xx) releases the key:
// the waiting repeat runs the handler itself.
func TestWaitRunsAfterRelease(t *testing.T) {
	h := &orders{block: make(chan struct{}), started: make(chan struct{}), status: func(n int64) int {
		if n == 1 {
			return http.StatusServiceUnavailable
		}
		return http.StatusCreated
	}}
	srv, waits := serveWaiting(t, h, idemhttp.Config{Wait: time.Hour})
	first := goPost(t, srv.URL, "k-1", `{}`)
	await(t, h.started, "the first request's handler starting")
	second := goPost(t, srv.URL, "k-1", `{}`)
	await(t, waits, "the repeat waiting")
	close(h.block)
	if f := await(t, first, "the first response"); f.status != http.StatusServiceUnavailable {
		t.Fatalf("first: %d %s", f.status, f.body)
	}
	r := await(t, second, "the repeat's response")
	if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" || !strings.Contains(r.body, `"order":2`) {
		t.Fatalf("repeat: %d %s; want the handler run for it", r.status, r.body)
	}
	if n := h.runs.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2", n)
	}
}

func TestWaitNegativePanics(t *testing.T) {
	c, _ := testdb.SQLiteClient(t, once.Config{})
	defer func() {
		if p := recover(); p == nil || !strings.Contains(fmt.Sprint(p), "Wait") {
			t.Fatalf("recovered %v; want a panic naming Wait", p)
		}
	}()
	idemhttp.Middleware(c, idemhttp.Config{Scope: func(*http.Request) string { return "t" }, Wait: -time.Second})
}
