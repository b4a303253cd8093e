package idemhttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/idemhttp"
	"github.com/oncehq/once/internal/testdb"
)

// TestTakenOverBeforeTheHandler: a request wins the claim and then stalls
// before its handler starts (a GC pause, a stopped process: here a hook
// that blocks) for longer than the lease. A retry takes the key over and
// runs the handler. The stalled request must not run it again, and must
// not tell its client the store could not be reached: it was reachable,
// and the key's request is being (or has been) carried out by another
// attempt, whose answer a retry gets.
func TestTakenOverBeforeTheHandler(t *testing.T) {
	stall := make(chan struct{})
	var stalled atomic.Bool
	c, _ := testdb.SQLiteClient(t, once.Config{
		Default: once.KindPolicy{Recovery: once.RetryWithProviderKey, Lease: 100 * time.Millisecond},
		Hooks: once.Hooks{OnExecute: func(ctx context.Context, o once.Observation) (context.Context, func(once.Observation, error)) {
			if stalled.CompareAndSwap(false, true) {
				<-stall
			}
			return ctx, nil
		}},
	})
	h := &orders{}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", idemhttp.Middleware(c, idemhttp.Config{Scope: func(*http.Request) string { return "t" }})(h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	first := make(chan reply, 1)
	go func() {
		first <- post(t, srv.URL, "k-1", "a", `{}`)
	}()
	for !stalled.Load() {
		time.Sleep(5 * time.Millisecond)
	}
	var retry reply
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		retry = post(t, srv.URL, "k-1", "a", `{}`)
		if retry.status != http.StatusConflict {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the stalled claim was not taken over within 20s")
		}
	}
	if retry.status != http.StatusCreated {
		t.Fatalf("retry: %d %s; want 201 from taking the key over", retry.status, retry.body)
	}
	close(stall)
	r := <-first
	if n := h.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	if code := problemOf(t, r, http.StatusConflict); code != "key-in-flight" {
		t.Fatalf("the stalled request was answered %d %s; want 409 key-in-flight: another attempt took its key over", r.status, code)
	}
	if again := post(t, srv.URL, "k-1", "a", `{}`); again.body != retry.body || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("repeat: %d %s; want the replay of %s", again.status, again.body, retry.body)
	}
}
