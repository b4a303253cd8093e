package idemhttp_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/oncehq/once"
	"github.com/oncehq/once/idemhttp"
	"github.com/oncehq/once/internal/testdb"
)

// TestInnerActionInReview: a handler behind the middleware sends an
// email through once.Do of its own. The email's outcome is unknown
// (its kind asks a person), so the handler answers 202 "in review".
// A person then finds the email was sent and resolves it Done.
//
// Stored, the 202 is the key's answer for good: the client's retry gets
// "in review" again though the review is over, because the middleware
// replays and never asks the inner action. With idemhttp.Release the
// handler says its answer is not final: the key is released, the retry
// runs the handler again, whose inner Do now replays the person's Done,
// and that answer is the one stored.
func TestInnerActionInReview(t *testing.T) {
	for _, release := range []bool{false, true} {
		t.Run(fmt.Sprintf("release %v", release), func(t *testing.T) {
			c, _ := testdb.SQLiteClient(t, once.Config{})
			var sends, runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				mail := once.Intent{Run: "order-7", Kind: "email", Target: "ada@example.com", Payload: "receipt"}
				res, err := once.Do(r.Context(), c, mail, func(context.Context, once.Attempt) (string, error) {
					sends.Add(1)
					return "", errors.New("the server hung up after the final dot") // unknown
				})
				if err != nil {
					if release {
						idemhttp.Release(r)
					}
					w.WriteHeader(http.StatusAccepted)
					fmt.Fprint(w, "in review")
					return
				}
				w.WriteHeader(http.StatusCreated)
				fmt.Fprint(w, "sent "+res.Value)
			})
			mux := http.NewServeMux()
			mux.Handle("POST /orders", idemhttp.Middleware(c, idemhttp.Config{Scope: func(*http.Request) string { return "t" }})(h))
			srv := httptest.NewServer(mux)
			defer srv.Close()

			if r := post(t, srv.URL, "k-1", "a", `{}`); r.status != http.StatusAccepted {
				t.Fatalf("first: %d %s; want 202 in review", r.status, r.body)
			}
			acts, err := c.List(context.Background(), once.Filter{Status: once.StatusReview})
			if err != nil || len(acts) != 1 || acts[0].Kind != "email" {
				t.Fatalf("in review: %+v %v; want the email", acts, err)
			}
			if _, err := c.Resolve(context.Background(), acts[0].Key, once.Resolution{Decision: once.DecisionDone, Result: []byte(`"msg-1"`), By: "ops", Note: "in the mail log"}); err != nil {
				t.Fatal(err)
			}
			r := post(t, srv.URL, "k-1", "a", `{}`)
			if !release {
				if r.status != http.StatusAccepted || r.header.Get(idemhttp.ReplayedHeader) != "true" {
					t.Fatalf("without Release: %d %s; want the stored 202 replayed", r.status, r.body)
				}
				return
			}
			if r.status != http.StatusCreated || r.body != "sent msg-1" || r.header.Get(idemhttp.ReplayedHeader) != "" {
				t.Fatalf("with Release, after Done: %d %s; want the handler run again and 201 from the person's result", r.status, r.body)
			}
			if again := post(t, srv.URL, "k-1", "a", `{}`); again.body != r.body || again.header.Get(idemhttp.ReplayedHeader) != "true" {
				t.Fatalf("repeat: %d %s; want the 201 replayed", again.status, again.body)
			}
			if runs.Load() != 2 || sends.Load() != 1 {
				t.Fatalf("handler ran %d times, the email sent %d; want 2 and 1", runs.Load(), sends.Load())
			}
		})
	}
}
