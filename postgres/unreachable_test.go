package postgres_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/idemhttp"
)

// TestBlackholedClaimSaysTheStoreIsUnreachable: with the database
// black-holed, a claim on a fresh key and the read-back after it both go
// unanswered. That is not "no row visible": no transaction is known to
// hold the key. Do says the store could not be reached (ErrUnavailable,
// not *InFlightError), the job is retried, and idemhttp answers 503
// "unavailable", not 409 "still being processed". Once the database
// answers again, the key runs once.
func TestBlackholedClaimSaysTheStoreIsUnreachable(t *testing.T) {
	cut, _, proxy, _ := faultClients(t, once.Config{ClaimTimeout: time.Second, Logger: quiet})
	in := once.Intent{Run: "blackholed", Kind: "send_email", Target: "ada@example.com"}
	var ran atomic.Int64
	effect := func(context.Context, once.Attempt) (string, error) {
		ran.Add(1)
		return "sent", nil
	}
	proxy.Blackout(true)
	_, err := once.Do(context.Background(), cut, in, effect)
	if !errors.Is(err, once.ErrUnavailable) || errors.Is(err, once.ErrInFlight) || ran.Load() != 0 {
		t.Fatalf("Do on a black-holed database = %v (ran %d); want ErrUnavailable, not in flight, and nothing run", err, ran.Load())
	}
	if d := once.Dispose(err); d.Action != once.JobRetry || !strings.Contains(d.Reason, "could not be reached") {
		t.Fatalf("Dispose = %+v; want a retry that says the store could not be reached", d)
	}

	h := idemhttp.Middleware(cut, idemhttp.Config{Scope: func(*http.Request) string { return "tenant:acme" }})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ran.Add(1)
			w.WriteHeader(http.StatusCreated)
		}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", "blackholed-1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), `"unavailable"`) || ran.Load() != 0 {
		t.Fatalf("idemhttp on a black-holed database = %d %s (ran %d); want 503 unavailable, nothing run", resp.StatusCode, string(body), ran.Load())
	}

	proxy.Blackout(false)
	proxy.Reset()
	res, err := once.Do(context.Background(), cut, in, effect)
	if err != nil || res.Value != "sent" || ran.Load() != 1 {
		t.Fatalf("Do once the database answers = %+v, %v (ran %d); want it run once", res, err, ran.Load())
	}
}
