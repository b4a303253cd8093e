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

// keysSeen is a loopback provider that records the Idempotency-Key of
// each request by method and path.
type keysSeen struct {
	mu   sync.Mutex
	keys map[string][]string
}

func (k *keysSeen) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/old-charges" {
		http.Redirect(w, r, "/charges", http.StatusTemporaryRedirect)
		return
	}
	k.mu.Lock()
	k.keys[r.Method+" "+r.URL.Path] = append(k.keys[r.Method+" "+r.URL.Path], r.Header.Get(idemhttp.Header))
	k.mu.Unlock()
}

// TestOneEffectManyRequests: WithKey puts the effect's one key on every
// request made with the context, which a provider reads as one request
// sent again: an effect that creates a customer and then charges it
// must not. WithRequestKeys gives each request a key of its own, derived
// from the effect's key, the method, the host and the path: the same on
// every attempt of the effect, so each call is still absorbed when the
// effect runs again. A redirect keeps the key of the request it answers.
func TestOneEffectManyRequests(t *testing.T) {
	p := &keysSeen{keys: map[string][]string{}}
	api := httptest.NewServer(p)
	defer api.Close()
	hc := &http.Client{Transport: &idemhttp.Transport{}}
	effect := func(ctx context.Context) {
		for _, call := range []struct{ method, path string }{{"POST", "/customers"}, {"POST", "/charges"}, {"GET", "/telemetry"}} {
			req, err := http.NewRequestWithContext(ctx, call.method, api.URL+call.path, strings.NewReader(`{}`))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
	}

	effect(idemhttp.WithKey(context.Background(), "pk-1"))
	for call, keys := range p.keys {
		if len(keys) != 1 || keys[0] != "pk-1" {
			t.Fatalf("WithKey: %s carried %q; want the effect's key pk-1 (as documented)", call, keys)
		}
	}

	p.keys = map[string][]string{}
	effect(idemhttp.WithRequestKeys(context.Background(), "pk-1"))
	effect(idemhttp.WithRequestKeys(context.Background(), "pk-1")) // the effect run again
	seen := map[string]string{}
	for call, keys := range p.keys {
		if len(keys) != 2 || keys[0] == "" || keys[0] != keys[1] {
			t.Fatalf("WithRequestKeys: %s carried %q; want one key, the same on both runs", call, keys)
		}
		method, path, _ := strings.Cut(call, " ")
		req, _ := http.NewRequest(method, api.URL+path, nil)
		if want := idemhttp.RequestKey("pk-1", req); keys[0] != want {
			t.Fatalf("%s carried %q; want RequestKey's %q", call, keys[0], want)
		}
		if other, dup := seen[keys[0]]; dup {
			t.Fatalf("%s and %s carried the same key %q", call, other, keys[0])
		}
		seen[keys[0]] = call
		if len(keys[0]) > idemhttp.MaxKeyLength {
			t.Fatalf("key %q is over MaxKeyLength", keys[0])
		}
	}
	if len(seen) != 3 {
		t.Fatalf("keys %v; want three calls", p.keys)
	}

	// A 307 on the same host: the redirected request carries the key of
	// the request it answers.
	p.keys = map[string][]string{}
	req, _ := http.NewRequestWithContext(idemhttp.WithRequestKeys(context.Background(), "pk-1"), "POST", api.URL+"/old-charges", strings.NewReader(`{}`))
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got, want := p.keys["POST /charges"], idemhttp.RequestKey("pk-1", req); len(got) != 1 || got[0] != want {
		t.Fatalf("redirected POST /charges carried %q; want the key of POST /old-charges, %q", got, want)
	}
}
