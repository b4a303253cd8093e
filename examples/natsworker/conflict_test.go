package main_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// TestChargeKeyInFlight has the payment API answer a charge with 409, as
// an API behind idemhttp.Middleware (or Stripe) does while an earlier
// request with the same Idempotency-Key is still being processed: an
// attempt that was taken over while its request was still out. This
// request was refused, and the first may yet charge; the charge is not
// known to have failed, so it must not be recorded as failed for good
// (and the job terminated): the next delivery asks again with the same
// key and gets the charge.
func TestChargeKeyInFlight(t *testing.T) {
	mail := startMailbox(t)
	p := &provider{stored: map[string]string{}, charges: map[string]int{}}
	var mu sync.Mutex
	inFlight := map[string]bool{}
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		first := !inFlight[key]
		inFlight[key] = true
		mu.Unlock()
		if first {
			// The key's first request is still being processed elsewhere.
			w.Header().Set("Content-Type", "application/problem+json")
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusConflict)
			fmt.Fprint(w, `{"type":"key-in-flight","title":"a request with this Idempotency-Key is still being processed; wait for it to finish and retry"}`)
			return
		}
		p.ServeHTTP(w, r)
	}))
	t.Cleanup(api.Close)
	r := start(t, mail.Addr(), api.URL+"/charges")
	r.publish(t, `{"id":"order-409","email":"ada@example.com","customer":"cus_ada","amount":100}`)
	waitFor(t, r.exited, "the job settled", r.settled(1))
	if charges, calls := p.counts(); charges["cus_ada"] != 1 {
		t.Errorf("cus_ada charged %d times (%d charge calls after the 409); want once", charges["cus_ada"], calls)
	}
	if n := len(mail.Messages()); n != 1 {
		t.Errorf("%d emails; want the order confirmed once", n)
	}
}
