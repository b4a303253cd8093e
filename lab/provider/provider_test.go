package provider_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/oncehq/once"
	"github.com/oncehq/once/idemhttp"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/lab/provider"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines leaked:", err)
			code = 1
		}
	}
	os.Exit(code)
}

type bundle struct {
	p   *provider.Provider
	url string
	mu  sync.Mutex
	log []provider.Request
}

func (b *bundle) logged() []provider.Request {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]provider.Request(nil), b.log...)
}

func setup(t *testing.T, cfg provider.Config) *bundle {
	t.Helper()
	b := &bundle{}
	cfg.Client, _ = testdb.SQLiteClient(t, once.Config{})
	if cfg.Log == nil {
		cfg.Log = func(r provider.Request) {
			b.mu.Lock()
			b.log = append(b.log, r)
			b.mu.Unlock()
		}
	}
	p, err := provider.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	b.p, b.url = p, srv.URL
	return b
}

// post sends body to path with key (none when empty) and returns the
// status, the replay header and the decoded body.
func (b *bundle) post(t *testing.T, path, key, body string) (int, bool, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set(idemhttp.Header, key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var m map[string]any
	json.Unmarshal(raw, &m)
	return resp.StatusCode, resp.Header.Get(idemhttp.ReplayedHeader) == "true", m
}

// TestRetriedCallIsAbsorbed: the same call sent twice with one key
// creates one charge; the second request is answered from the store.
// Both requests are counted.
func TestRetriedCallIsAbsorbed(t *testing.T) {
	b := setup(t, provider.Config{})
	defer http.DefaultClient.CloseIdleConnections()
	status, _, cus := b.post(t, "/v1/customers", "k-cus", `{"email":"ada@example.com","name":"Ada"}`)
	if status != 200 || cus["id"] != "cus_1" {
		t.Fatalf("create customer: %d %v", status, cus)
	}
	body := `{"customer":"cus_1","amount":4200,"currency":"eur"}`
	s1, r1, ch1 := b.post(t, "/v1/charges", "k-ch", body)
	s2, r2, ch2 := b.post(t, "/v1/charges", "k-ch", body)
	if s1 != 200 || s2 != 200 || r1 || !r2 || ch1["id"] != "ch_1" || ch2["id"] != "ch_1" {
		t.Fatalf("charge twice: %d %v %v, then %d %v %v; want ch_1 created, then replayed", s1, r1, ch1, s2, r2, ch2)
	}
	if n := b.p.Requests("k-ch"); n != 2 {
		t.Errorf("Requests = %d, want 2", n)
	}
	if got := b.p.Created("k-ch"); len(got) != 1 || got[0].ID != "ch_1" || got[0].Amount != 4200 || got[0].Key != "k-ch" {
		t.Errorf("Created = %+v, want one charge ch_1", got)
	}
	if n := len(b.p.Objects()); n != 2 {
		t.Errorf("%d objects, want 2", n)
	}
	if log := b.logged(); len(log) != 3 || log[2].Nth != 2 || !log[2].Replayed || log[2].Created != nil || log[1].Created == nil || log[1].Created.ID != "ch_1" {
		t.Errorf("log = %+v", log)
	}
	// Another key is another charge.
	if s, _, ch := b.post(t, "/v1/charges", "k-ch2", body); s != 200 || ch["id"] != "ch_2" {
		t.Errorf("a new key: %d %v, want ch_2", s, ch)
	}
}

// TestRefusals: a missing key, a bad body and an unknown customer are
// refused, and nothing is created.
func TestRefusals(t *testing.T) {
	b := setup(t, provider.Config{})
	defer http.DefaultClient.CloseIdleConnections()
	for _, tc := range []struct {
		path, key, body, want string
	}{
		{"/v1/customers", "", `{"email":"ada@example.com"}`, "Idempotency-Key"},
		{"/v1/customers", "k1", `not json`, "not the JSON object"},
		{"/v1/customers", "k2", `{"name":"Ada"}`, "email is required"},
		{"/v1/charges", "k3", `{"customer":"cus_9","amount":100,"currency":"eur"}`, "no such customer"},
		{"/v1/charges", "k4", `{"customer":"cus_9","amount":0,"currency":"eur"}`, "amount must be"},
		{"/v1/charges", "k5", `{"customer":"cus_9","amount":100}`, "currency is required"},
	} {
		status, _, m := b.post(t, tc.path, tc.key, tc.body)
		text := fmt.Sprint(m)
		if status != 400 || !strings.Contains(text, tc.want) {
			t.Errorf("POST %s %s: %d %s; want 400 with %q", tc.path, tc.body, status, text, tc.want)
		}
	}
	if n := len(b.p.Objects()); n != 0 {
		t.Errorf("%d objects created by refused calls", n)
	}
}

// TestNeedsClient: New without a client says what to pass.
func TestNeedsClient(t *testing.T) {
	if _, err := provider.New(provider.Config{}); err == nil || !strings.Contains(err.Error(), "Config.Client") {
		t.Fatalf("New without a client: %v", err)
	}
}
