package idemhttp_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/oncehq/once"
	"github.com/oncehq/once/idemhttp"
	"github.com/oncehq/once/internal/testdb"
)

// TestResponseTooLargeToStore: with the defaults, a request body may be
// 1 MiB and a stored result 256 KiB, so a handler that echoes its body
// answers more than can be stored. The first client gets the whole
// answer; the key must not then wait for a person (a review item any
// client could make), but be settled with a small stand-in that every
// repeat gets: a 500 that says the request was carried out and its
// response was too large to keep, with the Location it had.
func TestResponseTooLargeToStore(t *testing.T) {
	var runs atomic.Int64
	c, _ := testdb.SQLiteClient(t, once.Config{})
	echo := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("Location", "/echoes/1")
		w.WriteHeader(http.StatusCreated)
		io.Copy(w, r.Body)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /orders", idemhttp.Middleware(c, idemhttp.Config{Scope: func(*http.Request) string { return "t" }})(echo))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	big := strings.Repeat("x", 300<<10)
	first := post(t, srv.URL, "k-1", "a", big)
	if first.status != http.StatusCreated || first.body != big {
		t.Fatalf("first: %d, %d bytes; want 201 and the %d bytes echoed", first.status, len(first.body), len(big))
	}
	for range 2 {
		r := post(t, srv.URL, "k-1", "a", big)
		if code := problemOf(t, r, http.StatusInternalServerError); code != "response-too-large" {
			t.Fatalf("repeat: code %q; want response-too-large: %s", code, r.body)
		}
		if r.header.Get(idemhttp.ReplayedHeader) != "true" || r.header.Get("Location") != "/echoes/1" || !strings.Contains(r.body, "201") {
			t.Fatalf("repeat: %v %s; want it replayed, with the Location and the status it had", r.header, r.body)
		}
	}
	acts, err := c.List(context.Background(), once.Filter{})
	if err != nil || len(acts) != 1 || acts[0].Status != once.StatusSucceeded {
		t.Fatalf("actions %+v (%v); want one, succeeded, not in review", acts, err)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

// TestMaxResultBytesTooSmallForAStandIn: a client whose MaxResultBytes
// cannot hold even the stand-in for a response too large to store would
// put such keys up for review after all: Middleware refuses it.
func TestMaxResultBytesTooSmallForAStandIn(t *testing.T) {
	c, _ := testdb.SQLiteClient(t, once.Config{MaxResultBytes: 200})
	defer func() {
		if p := recover(); p == nil || !strings.Contains(fmtAny(p), "MaxResultBytes") {
			t.Fatalf("recovered %v; want a panic naming MaxResultBytes", p)
		}
	}()
	idemhttp.Middleware(c, idemhttp.Config{Scope: func(*http.Request) string { return "t" }})
}
