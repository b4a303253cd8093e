package idemhttp_test

import (
	"context"
	"errors"
	"io"
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

// leaving serves h behind the middleware (kind policy pol) and a wrapper
// that reports when the server saw the client leave (its own request's
// context ended) and when the handler returned. It sends one keyed
// request with a client that gives up as soon as started is closed.
type leaving struct {
	srv            *httptest.Server
	client         *once.Client
	gone, returned chan struct{}
	clientErr      chan error
}

func leave(t *testing.T, pol once.KindPolicy, started <-chan struct{}, h http.Handler) *leaving {
	t.Helper()
	c, _ := testdb.SQLiteClient(t, once.Config{Kinds: map[string]once.KindPolicy{"http:POST /orders": pol}})
	l := &leaving{client: c, gone: make(chan struct{}), returned: make(chan struct{}), clientErr: make(chan error, 1)}
	idem := idemhttp.Middleware(c, idemhttp.Config{Scope: func(*http.Request) string { return "t" }})(h)
	var first atomic.Bool
	mux := http.NewServeMux()
	mux.Handle("POST /orders", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !first.CompareAndSwap(false, true) {
			idem.ServeHTTP(w, r) // a retry
			return
		}
		context.AfterFunc(r.Context(), func() { close(l.gone) })
		idem.ServeHTTP(w, r)
		close(l.returned)
	}))
	l.srv = httptest.NewServer(mux)
	t.Cleanup(l.srv.Close)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-started
		cancel()
	}()
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, l.srv.URL+"/orders", strings.NewReader(`{}`))
		req.Header.Set(idemhttp.Header, "k-1")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		l.clientErr <- err
	}()
	return l
}

// TestClientLeavingDoesNotCancelTheHandler: a client that times out
// and leaves while the handler works must not cut the handler's work
// off: an effect cut off half-way is an unknown outcome (a person's
// review, by default), though nothing went wrong but a client's
// patience. The handler's context outlives the client, bounded by the
// kind's MaxExecution. Here the handler's effect is a call to a
// provider over loopback, made after the client has left; it must
// happen, and its answer be recorded for the client's retry.
func TestClientLeavingDoesNotCancelTheHandler(t *testing.T) {
	var mu sync.Mutex
	calls := 0
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls++
		mu.Unlock()
		io.WriteString(w, "ch_1")
	}))
	defer provider.Close()

	started, proceed := make(chan struct{}), make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-proceed
		req, _ := http.NewRequestWithContext(r.Context(), http.MethodPost, provider.URL+"/charges", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, "the provider call failed: "+err.Error(), http.StatusBadGateway)
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		w.WriteHeader(http.StatusCreated)
		w.Write(b)
	})
	l := leave(t, once.KindPolicy{}, started, h)
	if err := await(t, l.clientErr, "the client giving up"); !errors.Is(err, context.Canceled) {
		t.Fatalf("the client's request: %v; want it cancelled", err)
	}
	await(t, l.gone, "the server seeing the client leave")
	close(proceed)
	await(t, l.returned, "the handler returning")

	mu.Lock()
	n := calls
	mu.Unlock()
	if n != 1 {
		t.Fatalf("the provider got %d calls; want the one the handler made after its client left", n)
	}
	acts, err := l.client.List(context.Background(), once.Filter{})
	if err != nil || len(acts) != 1 || acts[0].Status != once.StatusSucceeded {
		t.Fatalf("actions %+v (%v); want one, succeeded", acts, err)
	}
	r := post(t, l.srv.URL, "k-1", "a", `{}`)
	if r.status != http.StatusCreated || r.body != "ch_1" || r.header.Get(idemhttp.ReplayedHeader) != "true" {
		t.Fatalf("the retry: %d %s; want the 201 recorded after the client left, replayed", r.status, r.body)
	}
}

// TestHandlerContextEndsAtMaxExecution: outliving its client, the
// handler's context still ends, at the kind's MaxExecution.
func TestHandlerContextEndsAtMaxExecution(t *testing.T) {
	started := make(chan struct{})
	ended := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-r.Context().Done()
		ended <- context.Cause(r.Context())
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	l := leave(t, once.KindPolicy{MaxExecution: 500 * time.Millisecond}, started, h)
	await(t, l.gone, "the server seeing the client leave")
	if err := await(t, ended, "the handler's context ending"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the handler's context ended with %v; want the kind's MaxExecution (%v)", err, context.DeadlineExceeded)
	}
}
