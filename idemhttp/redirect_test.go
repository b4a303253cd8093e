package idemhttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/oncehq/once/idemhttp"
)

// TestTransportKeepsTheKeyToItsHost: a 307 keeps the method and body,
// and Go's client follows it. The Idempotency-Key names one request to
// one provider: it goes with a redirect on the same host, and never to
// another host, whether Transport added it or the caller set it (Go's
// client copies the caller's headers on a redirect).
func TestTransportKeepsTheKeyToItsHost(t *testing.T) {
	var mu sync.Mutex
	got := map[string]string{}
	record := func(name string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			got[name] = r.Header.Get(idemhttp.Header)
			mu.Unlock()
			w.WriteHeader(http.StatusCreated)
		}
	}
	other := httptest.NewServer(record("other host"))
	defer other.Close()
	mux := http.NewServeMux()
	mux.HandleFunc("/to-other", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+"/charges", http.StatusTemporaryRedirect)
	})
	mux.HandleFunc("/to-same", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/charges", http.StatusTemporaryRedirect)
	})
	mux.Handle("/charges", record("same host"))
	first := httptest.NewServer(mux)
	defer first.Close()

	client := &http.Client{Transport: &idemhttp.Transport{}}
	for _, tc := range []struct {
		path, where, want string
		header            bool // the caller sets the header itself
	}{
		{"/to-same", "same host", "k-1", false},
		{"/to-other", "other host", "", false},
		{"/to-other", "other host", "", true},
	} {
		ctx := idemhttp.WithKey(context.Background(), "k-1")
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, first.URL+tc.path, strings.NewReader(`{"amount":1}`))
		if err != nil {
			t.Fatal(err)
		}
		if tc.header {
			req.Header.Set(idemhttp.Header, "k-1")
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		mu.Lock()
		k, ok := got[tc.where]
		delete(got, tc.where)
		mu.Unlock()
		if !ok || k != tc.want {
			t.Errorf("POST %s (header set by the caller: %v): the %s got Idempotency-Key %q (reached: %v); want %q",
				tc.path, tc.header, tc.where, k, ok, tc.want)
		}
	}
}
