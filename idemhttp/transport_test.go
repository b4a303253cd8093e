package idemhttp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/oncehq/once"
	"github.com/oncehq/once/idemhttp"
	"github.com/oncehq/once/internal/testdb"
)

// provider is a loopback payment API that honours Idempotency-Key: it
// executes a key's first call and answers every later call with the same
// key from what it stored. dropFirst makes it close the connection
// instead of answering its first execution, as a reply lost on the
// network would be.
type provider struct {
	mu        sync.Mutex
	stored    map[string]string
	keys      []string
	calls     int
	executed  int
	dropFirst bool
}

func (p *provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	p.mu.Lock()
	p.calls++
	p.keys = append(p.keys, key)
	body, seen := p.stored[key]
	drop := false
	if !seen || key == "" {
		p.executed++
		body = fmt.Sprintf(`{"charge":"ch_%d"}`, p.executed)
		if key != "" {
			p.stored[key] = body
		}
		drop, p.dropFirst = p.dropFirst, false
	}
	p.mu.Unlock()
	if drop {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
		return
	}
	io.WriteString(w, body)
}

func TestTransportRetryWithProviderKey(t *testing.T) {
	p := &provider{stored: map[string]string{}, dropFirst: true}
	api := httptest.NewServer(p)
	defer api.Close()
	c, _ := testdb.SQLiteClient(t, once.Config{Kinds: map[string]once.KindPolicy{"charge": {Recovery: once.RetryWithProviderKey}}})
	// No keep-alives: net/http resends a request that carries an
	// Idempotency-Key by itself when a reused connection fails, which
	// would hide the retry this test is about.
	hc := &http.Client{Transport: &idemhttp.Transport{Base: &http.Transport{DisableKeepAlives: true}}}

	var providerKeys []string
	charge := func(ctx context.Context, a once.Attempt) (string, error) {
		providerKeys = append(providerKeys, a.ProviderKey)
		req, err := http.NewRequestWithContext(idemhttp.WithKey(ctx, a.ProviderKey), http.MethodPost, api.URL+"/charges", nil)
		if err != nil {
			return "", once.Permanent(err)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return "", err // the call may have happened: an unknown outcome
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	in := once.Intent{Run: "order-7", Kind: "charge", Target: "cus_1", Payload: map[string]int{"amount": 100}}

	_, err := once.Do(context.Background(), c, in, charge)
	var unknown *once.UnknownOutcomeError
	if !errors.As(err, &unknown) || unknown.Status != once.StatusReleased {
		t.Fatalf("first attempt: %v; want an unknown outcome, released for a retry", err)
	}
	res, err := once.Do(context.Background(), c, in, charge)
	if err != nil {
		t.Fatal(err)
	}
	if res.Value != `{"charge":"ch_1"}` || res.Attempt != 2 || res.Replayed {
		t.Fatalf("retry: %+v; want attempt 2 running and getting the provider's stored ch_1", res)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.executed != 1 || p.calls != 2 {
		t.Fatalf("provider executed %d of %d calls; want 1 of 2", p.executed, p.calls)
	}
	if len(providerKeys) != 2 || providerKeys[0] == "" || providerKeys[0] != providerKeys[1] {
		t.Fatalf("attempts had provider keys %q; want one key, the same twice", providerKeys)
	}
	for _, k := range p.keys {
		if k != providerKeys[0] {
			t.Fatalf("provider saw keys %q; want %q on every call", p.keys, providerKeys[0])
		}
	}
}

func TestTransportLeavesRequestAlone(t *testing.T) {
	p := &provider{stored: map[string]string{}}
	api := httptest.NewServer(p)
	defer api.Close()
	hc := &http.Client{Transport: &idemhttp.Transport{}}

	// No key in the context: no header. A header already set wins.
	req, _ := http.NewRequest(http.MethodPost, api.URL, nil)
	keyed, _ := http.NewRequestWithContext(idemhttp.WithKey(context.Background(), "from-ctx"), http.MethodPost, api.URL, nil)
	keyed.Header.Set("Idempotency-Key", "explicit")
	set, _ := http.NewRequest(http.MethodPost, api.URL, nil)
	idemhttp.SetKey(set, once.Attempt{ProviderKey: "from-attempt"})
	for _, r := range []*http.Request{req, keyed, set} {
		resp, err := hc.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if keyed.Header.Get("Idempotency-Key") != "explicit" || req.Header.Get("Idempotency-Key") != "" {
		t.Fatal("the transport changed the caller's request")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	want := []string{"", "explicit", "from-attempt"}
	if fmt.Sprint(p.keys) != fmt.Sprint(want) {
		t.Fatalf("provider saw keys %q, want %q", p.keys, want)
	}
}
