package protocol_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/connlimit"
	"github.com/oncehq/once/protocol"
)

// TestRightTokenIsServedAfterWrongOnesFromItsAddress: twenty wrong
// tokens from an address slow the guesser there (429), but a request
// that shows a right token from the same address is served: a worker
// whose heartbeats and outcomes got 429 would be fenced by a guesser
// beside it. A wrong token on a connection that already showed a right
// one is answered 401, not 429: that connection is no guesser's.
func TestRightTokenIsServedAfterWrongOnesFromItsAddress(t *testing.T) {
	store := stores(t)["sqlite"](t)
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	c, err := once.New(once.Config{Store: store, Default: once.KindPolicy{Lease: 5 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	p, err := protocol.New(protocol.Config{Client: c, Workers: []string{workerToken}, Operators: []string{operatorToken}})
	if err != nil {
		t.Fatal(err)
	}
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := connlimit.Listen(inner, connlimit.Limits{})
	srv := &http.Server{Handler: p}
	go ln.Serve(srv)
	t.Cleanup(func() { srv.Close() })
	s := &server{t: t, url: "http://" + inner.Addr().String(), c: c}

	from := func(ip string) *http.Client {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		return &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
	}
	send := func(hc *http.Client, path, token, body string) int {
		t.Helper()
		req, _ := http.NewRequest("POST", s.url+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body) // so the connection is kept
		resp.Body.Close()
		return resp.StatusCode
	}
	// The worker's own keep-alive connection shows its token first.
	worker := from("127.0.0.3")
	code, a := s.post("/v1/claim", claimBody(wireIntent(1, "x")))
	want(t, "claim", code, a, 200, "answer", "claimed")
	keys := `{"intent":{"run":"r","step":1,"kind":"k"}}`
	if code := send(worker, "/v1/keys", workerToken, keys); code != 200 {
		t.Fatalf("the worker's first request = %d", code)
	}
	for i := range 20 {
		// A guesser on the worker's address, a new connection each.
		if code := send(from("127.0.0.3"), "/v1/keys", fmt.Sprintf("guess-%020d", i), keys); code != 401 {
			t.Fatalf("guess %d = %d; want 401", i+1, code)
		}
	}
	if code := send(from("127.0.0.3"), "/v1/keys", "guess-21-000000000000", keys); code != 429 {
		t.Fatalf("the 21st guess = %d; want 429", code)
	}
	// A right token from the guessing address, on a new connection: served.
	if code := send(from("127.0.0.3"), "/v1/keys", workerToken, keys); code != 200 {
		t.Fatalf("a right token from the guessing address on a new connection = %d; want 200", code)
	}
	// The worker's heartbeat and outcome, on its own connection: served.
	hb := fmt.Sprintf(`{"key":%q,"attempt":1,"token":%q}`, a["key"], a["token"])
	if code := send(worker, "/v1/heartbeat", workerToken, hb); code != 200 {
		t.Fatalf("the worker's heartbeat from the guessing address = %d; want 200", code)
	}
	out := fmt.Sprintf(`{"key":%q,"attempt":1,"token":%q,"write":%q,"outcome":"succeeded","result":{"ok":true}}`, a["key"], a["token"], write())
	if code := send(worker, "/v1/outcome", workerToken, out); code != 200 {
		t.Fatalf("the worker's outcome from the guessing address = %d; want 200", code)
	}
	// A wrong token on the connection that showed a right one: 401.
	if code := send(worker, "/v1/keys", "a-stale-token-0000000000", keys); code != 401 {
		t.Fatalf("a wrong token on a connection that showed a right one = %d; want 401", code)
	}
}

// guardOnly is /v1 over a real store, called in this process with the
// request's address set: RemoteAddr is what the failure counts go by.
func guardOnly(t *testing.T) func(addr, token string) int {
	t.Helper()
	p := workersOnly(t)
	return func(addr, token string) int {
		req := httptest.NewRequest("POST", "/v1/keys", strings.NewReader(`{"intent":{"run":"r","step":1,"kind":"k"}}`))
		req.RemoteAddr = addr
		req.Header.Set("Authorization", "Bearer "+token)
		w := httptest.NewRecorder()
		p.ServeHTTP(w, req)
		return w.Code
	}
}

// TestWrongTokensAreCountedByIPv6Prefix: a host given an IPv6 /64 has
// 2^64 addresses, and counted by whole address it guessed 20 tokens a
// minute from each: no slowing at all. Its /64 counts as one address,
// as the connection limit counts it; a right token from it is served.
func TestWrongTokensAreCountedByIPv6Prefix(t *testing.T) {
	send := guardOnly(t)
	for i := range 20 {
		if code := send(fmt.Sprintf("[2001:db8:1:2::%x]:4000", i+1), fmt.Sprintf("guess-%020d", i)); code != 401 {
			t.Fatalf("guess %d = %d; want 401", i+1, code)
		}
	}
	if code := send("[2001:db8:1:2:ffff::1]:4000", "guess-21-000000000000"); code != 429 {
		t.Fatalf("the 21st guess, from another address of the same /64 = %d; want 429", code)
	}
	if code := send("[2001:db8:1:2:ffff::2]:4000", workerToken); code != 200 {
		t.Fatalf("a right token from the /64 = %d; want 200", code)
	}
	if code := send("[2001:db8:1:3::1]:4000", "guess-other-00000000"); code != 401 {
		t.Fatalf("a wrong token from another /64 = %d; want 401", code)
	}
}

// TestFloodOfAddressesDoesNotFreeAGuesser: the table of failing
// addresses was begun again when full, so a guesser with 10,000
// addresses (a /48 holds 65,536 /64s) wiped its own count, and every
// other guesser's, whenever it liked. Full, the table keeps what it
// counts, and new addresses share one count.
func TestFloodOfAddressesDoesNotFreeAGuesser(t *testing.T) {
	send := guardOnly(t)
	for i := range 20 {
		if code := send("192.0.2.1:4000", fmt.Sprintf("guess-%020d", i)); code != 401 {
			t.Fatalf("guess %d = %d; want 401", i+1, code)
		}
	}
	if code := send("192.0.2.1:4000", "guess-21-000000000000"); code != 429 {
		t.Fatalf("the 21st guess = %d; want 429", code)
	}
	for i := range 10000 {
		addr := fmt.Sprintf("[2001:db8:%x:%x::1]:4000", i>>8, i&0xff)
		if code := send(addr, "flood-000000000000000"); code != 401 {
			t.Fatalf("flood %d from %s = %d; want 401", i+1, addr, code)
		}
	}
	if code := send("192.0.2.1:4000", "guess-22-000000000000"); code != 429 {
		t.Fatalf("the guesser after a flood from 10,000 addresses = %d; want 429", code)
	}
	if code := send("192.0.2.1:4000", workerToken); code != 200 {
		t.Fatalf("a right token from the guesser's address = %d; want 200", code)
	}
}

// TestBearerSchemeInAnyCase: the scheme of an Authorization header is
// case-insensitive (RFC 9110 §11.1), so "bearer TOKEN" is the token.
func TestBearerSchemeInAnyCase(t *testing.T) {
	p := workersOnly(t)
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	for _, scheme := range []string{"Bearer", "bearer", "BEARER"} {
		req, _ := http.NewRequest("POST", srv.URL+"/v1/keys", strings.NewReader(`{"intent":{"run":"r","step":1,"kind":"k"}}`))
		req.Header.Set("Authorization", scheme+" "+workerToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("Authorization: %s TOKEN = %d, want 200", scheme, resp.StatusCode)
		}
	}
}

// workersOnly is /v1 over a fresh SQLite store, for workerToken alone.
func workersOnly(t *testing.T) *protocol.Server {
	t.Helper()
	store := stores(t)["sqlite"](t)
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	c, err := once.New(once.Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	p, err := protocol.New(protocol.Config{Client: c, Workers: []string{workerToken}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}
