package cli_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestServeProtocol: `once serve --worker-tokens-file` serves /v1 beside
// the console: a worker's token claims, no token is refused, and the
// console is still the console. A file of tokens too short is refused
// before anything opens.
func TestServeProtocol(t *testing.T) {
	db := filepath.Join(t.TempDir(), "once.db")
	mustRun(t, "migrate", "--db", db)
	tokens := filepath.Join(t.TempDir(), "workers")
	const tok = "worker-token-0123456789abcdef"
	if err := os.WriteFile(tokens, []byte("# workers\n"+tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base, _, _, stop := startServe(t, "--addr", "127.0.0.1:0", "--reap-every", "0", "--worker-tokens-file", tokens, "--db", db)
	claim := func(token string) (int, map[string]any) {
		body := `{"intent":{"run":"r-1","step":0,"kind":"send_email","target":"ada@example.com"},"write":"0123456789abcdef0123"}`
		req, _ := http.NewRequest("POST", base+"v1/claim", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v map[string]any
		json.NewDecoder(resp.Body).Decode(&v)
		return resp.StatusCode, v
	}
	if code, v := claim(""); code != 401 || v["code"] != "unauthorized" {
		t.Fatalf("a claim without a token = %d %v; want 401", code, v)
	}
	if code, v := claim(tok); code != 200 || v["answer"] != "claimed" {
		t.Fatalf("a worker's claim = %d %v; want claimed", code, v)
	}
	if code, page := get(t, base); code != 200 || !strings.Contains(page, "once") {
		t.Fatalf("the console beside the protocol: %d", code)
	}
	if code := stop(); code != 0 {
		t.Fatalf("serve exited %d", code)
	}
	short := filepath.Join(t.TempDir(), "short")
	os.WriteFile(short, []byte("short\n"), 0o600)
	code, _, errOut := run(t, "serve", "--addr", "127.0.0.1:0", "--worker-tokens-file", short, "--db", db)
	if code == 0 || !strings.Contains(errOut, "line 1") {
		t.Fatalf("serve with a short token = %d: %s; want a refusal naming the line", code, errOut)
	}
}

// TestServeProtocolWorkersAreNotGuests: a protocol connection that shows
// a worker's token stops counting as a guest of `once serve`'s
// connection limit, as a console one that shows the token does: a pool
// of twenty workers on one host keeps its twenty connections open. A
// connection that shows a wrong token stays a guest.
func TestServeProtocolWorkersAreNotGuests(t *testing.T) {
	db := filepath.Join(t.TempDir(), "once.db")
	mustRun(t, "migrate", "--db", db)
	tokens := filepath.Join(t.TempDir(), "workers")
	const tok = "worker-token-0123456789abcdef"
	if err := os.WriteFile(tokens, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base, _, _, stop := startServe(t, "--addr", "127.0.0.1:0", "--reap-every", "0", "--worker-tokens-file", tokens, "--db", db)
	defer stop()
	u, _ := url.Parse(base)
	keys := func(c net.Conn, token string) (int, error) {
		body := `{"intent":{"run":"r-1","step":0,"kind":"send_email"}}`
		fmt.Fprintf(c, "POST /v1/keys HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", u.Host, token, len(body), body)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return 0, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range 20 {
		c, err := net.Dial("tcp", u.Host)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		if code, err := keys(c, tok); err != nil || code != 200 {
			t.Fatalf("worker connection %d: %d, %v; want each of twenty answered and kept", i+1, code, err)
		}
	}
	// Each is still open and answers again.
	for i, c := range conns {
		if code, err := keys(c, tok); err != nil || code != 200 {
			t.Fatalf("worker connection %d again: %d, %v", i+1, code, err)
		}
	}
	// Wrong tokens do not authorize: the guests from this address are
	// capped again.
	refused := false
	for range 20 {
		c, err := net.Dial("tcp", u.Host)
		if err != nil {
			refused = true
			break
		}
		conns = append(conns, c)
		if code, err := keys(c, "wrong-token-0123456789abcdef"); err != nil || code != 401 {
			refused = true
			break
		}
	}
	if !refused {
		t.Fatal("twenty connections with a wrong token were all served and kept; want guests capped per address")
	}
}

// TestServeKinds: `once serve --kinds FILE` pins the kinds' policies
// for the protocol's claims (a worker's carried policy is refused), and
// a kind verified by clients is served to a client verifier. A file
// with a mistake is refused before anything opens, naming the kind and
// the field.
func TestServeKinds(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "once.db")
	mustRun(t, "migrate", "--db", db)
	tokens := filepath.Join(dir, "workers")
	const tok = "worker-token-0123456789abcdef"
	os.WriteFile(tokens, []byte(tok+"\n"), 0o600)
	kinds := filepath.Join(dir, "kinds.json")
	os.WriteFile(kinds, []byte(`{"kinds": {
  "charge_card": {"lease": "5s", "recovery": "retry_with_provider_key"},
  "send_email": {"recovery": "verify_then_decide", "verifier": "client"}
}}`), 0o600)
	base, _, _, stop := startServe(t, "--addr", "127.0.0.1:0", "--reap-every", "0", "--worker-tokens-file", tokens, "--kinds", kinds, "--db", db)
	post := func(path, body string) (int, map[string]any) {
		req, _ := http.NewRequest("POST", base+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v map[string]any
		json.NewDecoder(resp.Body).Decode(&v)
		return resp.StatusCode, v
	}
	code, v := post("v1/claim", `{"intent":{"run":"r-1","step":0,"kind":"charge_card","target":"acct"},"write":"0123456789abcdef0123"}`)
	if code != 200 || v["stop_after_ms"].(float64) > 5000 {
		t.Fatalf("a charge_card claim = %d %v; want the file's 5 s lease", code, v)
	}
	code, v = post("v1/claim", `{"intent":{"run":"r-1","step":1,"kind":"charge_card","target":"acct"},"write":"0123456789abcdef0124","policy":{"lease_ms":60000}}`)
	if code != 409 || v["code"] != "policy_pinned" {
		t.Fatalf("a claim carrying another policy for a pinned kind = %d %v; want 409 policy_pinned", code, v)
	}
	code, v = post("v1/verify/take", `{"kinds":["send_email"]}`)
	if code != 200 {
		t.Fatalf("a client verifier's take of send_email = %d %v; want 200", code, v)
	}
	if code := stop(); code != 0 {
		t.Fatalf("serve exited %d", code)
	}
	os.WriteFile(kinds, []byte(`{"kinds": {"charge_card": {"lease": "soon"}}}`), 0o600)
	code, _, errOut := run(t, "serve", "--addr", "127.0.0.1:0", "--worker-tokens-file", tokens, "--kinds", kinds, "--db", db)
	if code == 0 || !strings.Contains(errOut, `kind "charge_card": lease is "soon"`) {
		t.Fatalf("serve with a bad kinds file = %d: %s; want a refusal naming the kind and field", code, errOut)
	}
}
