package idemhttp_test

import (
	"context"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/oncehq/once"
	"github.com/oncehq/once/idemhttp"
	"github.com/oncehq/once/internal/testdb"
)

// TestResolvedWithoutResponse: a handler that died mid-way goes to
// review; a person checks, finds the order was created, and resolves the
// action Done, with no result or with one of their own (an order id).
// The client's retry must get an answer that says the request was
// carried out and its response is not on record, not a dropped
// connection (a stored status of 0 makes WriteHeader panic) nor a 503
// that sends it round again forever. The handler must not run again.
func TestResolvedWithoutResponse(t *testing.T) {
	for _, tc := range []struct {
		name   string
		result json.RawMessage
	}{
		{"no result", nil},
		{"an order id", json.RawMessage(`"order-17"`)},
		{"an object", json.RawMessage(`{"order":17}`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
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
			fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
			send := func() (*http.Response, string, error) {
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{}`))
				req.Header.Set("Idempotency-Key", "k-1")
				resp, err := fresh.Do(req)
				if err != nil {
					return nil, "", err
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				return resp, string(b), err
			}
			if resp, _, err := send(); err == nil {
				t.Fatalf("the panicking request was answered %d; want the connection dropped", resp.StatusCode)
			}
			acts, err := c.List(context.Background(), once.Filter{Status: once.StatusReview})
			if err != nil || len(acts) != 1 {
				t.Fatalf("actions in review: %v %v; want one", acts, err)
			}
			if _, err := c.Resolve(context.Background(), acts[0].Key, once.Resolution{Decision: once.DecisionDone, Result: tc.result, By: "ops", Note: "the order exists"}); err != nil {
				t.Fatal(err)
			}

			resp, body, err := send()
			if err != nil {
				t.Fatalf("the retry after the action was resolved got no answer: %v", err)
			}
			r := reply{resp.StatusCode, resp.Header, body}
			if code := problemOf(t, r, http.StatusConflict); code != "response-not-recorded" {
				t.Fatalf("code %q; want response-not-recorded: %s", code, body)
			}
			if n := runs.Load(); n != 1 {
				t.Fatalf("handler ran %d times, want 1", n)
			}
		})
	}
}
