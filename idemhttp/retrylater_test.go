package idemhttp_test

import (
	"net/http"
	"testing"

	"github.com/oncehq/once/idemhttp"
)

// TestTryAgainStatusesReleaseTheKey: a handler that answers 429 (a rate
// limit inside it), 408 or 425 did nothing and told the client to send
// the same request again later. Stored, that answer would be replayed
// to every retry, and the key could never do what it was sent for.
func TestTryAgainStatusesReleaseTheKey(t *testing.T) {
	for _, status := range []int{http.StatusTooManyRequests, http.StatusRequestTimeout, http.StatusTooEarly} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			h := &orders{status: func(n int64) int {
				if n == 1 {
					return status
				}
				return http.StatusCreated
			}}
			srv := serve(t, h, idemhttp.Config{})
			if r := post(t, srv.URL, "k-1", "a", `{}`); r.status != status {
				t.Fatalf("first: %d %s; want the handler's own %d", r.status, r.body, status)
			}
			retry := post(t, srv.URL, "k-1", "a", `{}`)
			if retry.status != http.StatusCreated || retry.header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("retry: %d replayed=%q %s; want the handler run again (201)", retry.status, retry.header.Get("Idempotent-Replayed"), retry.body)
			}
			if n := h.runs.Load(); n != 2 {
				t.Fatalf("handler ran %d times, want 2", n)
			}
		})
	}
}
