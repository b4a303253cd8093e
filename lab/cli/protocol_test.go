package cli_test

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
