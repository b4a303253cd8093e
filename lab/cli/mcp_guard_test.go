package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The HTTP face of once mcp as a caller off the happy path meets it:
// the guard in front of the SDK's handler (bearer token, host names,
// cross-origin pages, body size), the run taken from the Once-Run
// header or --run, and what an operator sees of a gateway's actions.
// Every test runs the real gateway process and the real counter.

const guardToken = "0123456789abcdef0123456789abcdef" // 32 characters

// headerTransport adds headers to every request, and sets the Host a
// request names when host is set.
type headerTransport struct {
	header http.Header
	host   string
}

func (h *headerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	for k, vs := range h.header {
		req.Header[k] = vs
	}
	if h.host != "" {
		req.Host = h.host
	}
	return http.DefaultTransport.RoundTrip(req)
}

// connectHTTP connects a Go SDK client to url, its requests carrying
// header (and Host, if host is set).
func connectHTTP(t *testing.T, url string, header http.Header, host string) (*mcp.ClientSession, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tr := &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: &headerTransport{header: header, host: host}}}
	s, err := mcp.NewClient(&mcp.Implementation{Name: "guard", Version: "1"}, nil).Connect(ctx, tr, nil)
	if err == nil {
		t.Cleanup(func() { s.Close() })
	}
	return s, err
}

func mustConnectHTTP(t *testing.T, g *gatewayProc, url string, header http.Header, host string) *mcp.ClientSession {
	t.Helper()
	s, err := connectHTTP(t, url, header, host)
	if err != nil {
		t.Fatalf("connect to once mcp: %v\n%s", err, g.stderr.String())
	}
	return s
}

func bearer(tok string) http.Header {
	return http.Header{"Authorization": {"Bearer " + tok}}
}

// callBody is a tools/call of send_message as JSON-RPC, with _meta
// naming the run: what a client POSTs.
func callBody(run, to string, extra map[string]any) []byte {
	args := map[string]any{"to": to, "subject": "guard"}
	for k, v := range extra {
		args[k] = v
	}
	b, _ := json.Marshal(map[string]any{
		"jsonrpc": "2.0", "id": 1, "method": "tools/call",
		"params": map[string]any{"name": "send_message", "arguments": args, "_meta": map[string]any{"oncehq.dev/run": run, "oncehq.dev/step": 0}},
	})
	return b
}

// post sends body to url as an MCP client would (stateless, protocol
// 2025-11-25), with header on top, and returns the response, its body
// read.
func post(t *testing.T, url string, body []byte, header http.Header, host string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest("POST", url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	for k, vs := range header {
		req.Header[k] = vs
	}
	if host != "" {
		req.Host = host
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// freePort is a loopback port nothing listens on (as of now).
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return port
}

// TestMCPGatewayHTTPGuard: what once mcp --http refuses, and that a
// refused request never reaches the upstream.
func TestMCPGatewayHTTPGuard(t *testing.T) {
	db := filepath.Join(t.TempDir(), "once.db")
	mustRun(t, "migrate", "--db", db)

	t.Run("off loopback needs a token", func(t *testing.T) {
		r := newGatewayRig(t, db, e2ePolicy)
		for name, extra := range map[string][]string{
			"no token":    nil,
			"short token": {"--token", "fifteen-chars.."},
		} {
			t.Run(name, func(t *testing.T) {
				port := freePort(t)
				cmd := r.command(t, append([]string{"--http", fmt.Sprintf("0.0.0.0:%d", port)}, extra...)...)
				var stderr syncBuffer
				cmd.Stderr = &stderr
				done := make(chan error, 1)
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				go func() { done <- cmd.Wait() }()
				select {
				case <-done:
				case <-time.After(30 * time.Second):
					cmd.Process.Kill()
					<-done
					t.Fatalf("once mcp --http 0.0.0.0 %v did not refuse to start:\n%s", extra, stderr.String())
				}
				if code := cmd.ProcessState.ExitCode(); code != 1 {
					t.Errorf("exit %d, want 1", code)
				}
				msg := stderr.String()
				if !strings.Contains(msg, "--token") || !strings.Contains(msg, "at least 16") || !strings.Contains(msg, "usage: once mcp") {
					t.Errorf("the refusal does not say to set --token of at least 16 characters:\n%s", msg)
				}
				if strings.Contains(msg, "once mcp on http") {
					t.Errorf("it said it listens:\n%s", msg)
				}
				if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second); err == nil {
					c.Close()
					t.Errorf("something listens on port %d", port)
				}
				if n := r.count(t, "send_message"); n != 0 {
					t.Errorf("sent %d", n)
				}
			})
		}
	})

	t.Run("bearer token", func(t *testing.T) {
		r := newGatewayRig(t, db, e2ePolicy)
		g, url := r.listen(t, "--token", guardToken)
		for name, h := range map[string]http.Header{
			"none":              nil,
			"wrong":             bearer(strings.Repeat("x", len(guardToken))),
			"prefix":            bearer(guardToken[:16]),
			"not bearer":        {"Authorization": {"Basic " + guardToken}},
			"token, no scheme":  {"Authorization": {guardToken}},
			"right token, more": bearer(guardToken + "x"),
		} {
			resp, body := post(t, url, callBody("guard-"+name, "tok@example.com", nil), h, "")
			if resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("%s: status %d, want 401: %s", name, resp.StatusCode, body)
			}
			if w := resp.Header.Get("WWW-Authenticate"); !strings.HasPrefix(w, "Bearer") {
				t.Errorf("%s: WWW-Authenticate %q, want a Bearer challenge", name, w)
			}
			if !strings.Contains(body, "Authorization: Bearer") {
				t.Errorf("%s: the 401 does not say what to send: %q", name, body)
			}
		}
		if n := r.count(t, "send_message"); n != 0 {
			t.Fatalf("requests without the token sent %d messages", n)
		}
		// The same request with the token is a call: the refusals above
		// were the token's, not a malformed request's.
		resp, body := post(t, url, callBody("guard-raw", "tok@example.com", nil), bearer(guardToken), "")
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, "sent to tok@example.com") {
			t.Fatalf("with the token: status %d %s\n%s", resp.StatusCode, body, g.stderr.String())
		}
		// The scheme is case-insensitive (RFC 9110 §11.1).
		for _, scheme := range []string{"bearer", "BEARER"} {
			resp, body := post(t, url, callBody("guard-raw", "tok@example.com", nil), http.Header{"Authorization": {scheme + " " + guardToken}}, "")
			if resp.StatusCode != http.StatusOK || !strings.Contains(body, "already performed") {
				t.Errorf("Authorization: %s TOKEN: status %d %s", scheme, resp.StatusCode, body)
			}
		}
		if _, err := connectHTTP(t, url, nil, ""); err == nil {
			t.Fatal("the Go SDK client connected without the token")
		}
		s := mustConnectHTTP(t, g, url, bearer(guardToken), "")
		res, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: "send_message",
			Arguments: map[string]any{"to": "sdk@example.com", "subject": "guard"}, Meta: mcp.Meta{"oncehq.dev/run": "guard-sdk"}})
		if err != nil || res.IsError {
			t.Fatalf("the SDK client with the token: %v %v\n%s", err, res, g.stderr.String())
		}
		if n := r.count(t, "send_message"); n != 2 {
			t.Fatalf("sent %d, want 2 (the raw call and the SDK's)", n)
		}
	})

	t.Run("host names", func(t *testing.T) {
		r := newGatewayRig(t, db, e2ePolicy)
		_, url := r.listen(t)
		for _, host := range []string{"evil.example", "evil.example:7071", "name.example"} {
			resp, body := post(t, url, callBody("host", "host@example.com", nil), nil, host)
			if resp.StatusCode != http.StatusMisdirectedRequest {
				t.Errorf("Host %s: status %d, want 421: %s", host, resp.StatusCode, body)
			}
			if want := "--allow-host " + hostOf(host); !strings.Contains(body, want) {
				t.Errorf("Host %s: the refusal does not name %q: %q", host, want, body)
			}
		}
		if _, err := connectHTTP(t, url, nil, "name.example"); err == nil {
			t.Error("the SDK client connected under a host name not served")
		}
		// The loopback names are served.
		for _, host := range []string{"localhost", "127.0.0.1", "LOCALHOST:1234"} {
			s, err := connectHTTP(t, url, nil, host)
			if err == nil {
				_, err = s.ListTools(context.Background(), nil)
			}
			if err != nil {
				t.Errorf("Host %s: %v", host, err)
			}
		}
		if n := r.count(t, "send_message"); n != 0 {
			t.Fatalf("requests for hosts not served sent %d", n)
		}

		// --allow-host makes a name answered: a proxy on this machine
		// that forwards name.example's requests to the gateway.
		g, url := r.listen(t, "--allow-host", "name.example")
		s := mustConnectHTTP(t, g, url, nil, "name.example")
		res, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: "send_message",
			Arguments: map[string]any{"to": "host@example.com", "subject": "guard"}, Meta: mcp.Meta{"oncehq.dev/run": "host-allowed"}})
		if err != nil || res.IsError {
			t.Fatalf("Host name.example with --allow-host name.example: %v %v\n%s", err, res, g.stderr.String())
		}
		resp, body := post(t, url, callBody("host", "host@example.com", nil), nil, "other.example")
		if resp.StatusCode != http.StatusMisdirectedRequest {
			t.Errorf("Host other.example with --allow-host name.example: status %d, want 421: %s", resp.StatusCode, body)
		}
		if n := r.count(t, "send_message"); n != 1 {
			t.Fatalf("sent %d, want 1", n)
		}
	})

	t.Run("cross-origin page", func(t *testing.T) {
		r := newGatewayRig(t, db, e2ePolicy)
		_, url := r.listen(t, "--token", guardToken)
		for name, h := range map[string]http.Header{
			"origin and fetch site": {"Origin": {"http://evil.example"}, "Sec-Fetch-Site": {"cross-site"}},
			"fetch site":            {"Sec-Fetch-Site": {"cross-site"}},
			"origin":                {"Origin": {"http://evil.example"}},
		} {
			// The page has the token (the worst case): the browser's own
			// headers still give it away.
			h.Set("Authorization", "Bearer "+guardToken)
			resp, body := post(t, url, callBody("cross", "cross@example.com", nil), h, "")
			if resp.StatusCode != http.StatusForbidden {
				t.Errorf("%s: status %d, want 403: %s", name, resp.StatusCode, body)
			}
		}
		if n := r.count(t, "send_message"); n != 0 {
			t.Fatalf("cross-origin requests sent %d", n)
		}
	})

	t.Run("body over 8 MiB", func(t *testing.T) {
		r := newGatewayRig(t, db, e2ePolicy)
		g, url := r.listen(t, "--token", guardToken)
		big := callBody("big", "big@example.com", map[string]any{"body": strings.Repeat("a", 9<<20)})
		resp, body := post(t, url, big, bearer(guardToken), "")
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("a %d-byte body: status %d, want 413: %.200s", len(big), resp.StatusCode, body)
		}
		if n := r.count(t, "send_message"); n != 0 {
			t.Fatalf("a body over the limit sent %d", n)
		}
		// Under the limit, a body the SDK alone would refuse (over its
		// 4 MiB default) is served: a read-only call passed through.
		find, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 2, "method": "tools/call",
			"params": map[string]any{"name": "find_message", "arguments": map[string]any{"to": "big@example.com", "subject": strings.Repeat("s", 6<<20)}}})
		resp, body = post(t, url, find, bearer(guardToken), "")
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"found":false`) {
			t.Errorf("a %d-byte read-only call: status %d %.300s", len(find), resp.StatusCode, body)
		}
		// The gateway still serves.
		resp, body = post(t, url, callBody("big", "big@example.com", nil), bearer(guardToken), "")
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, "sent to big@example.com") {
			t.Fatalf("after the big body: status %d %s\n%s", resp.StatusCode, body, g.stderr.String())
		}
	})
}

func hostOf(h string) string {
	if host, _, err := net.SplitHostPort(h); err == nil {
		return host
	}
	return h
}

// connectStdio spawns a gateway with extra flags, over stdio as a
// desktop host does, and connects a Go SDK client with opts to it.
func (r *gatewayRig) connectStdio(t *testing.T, opts *mcp.ClientOptions, sopts *mcp.ClientSessionOptions, extra ...string) *gatewayProc {
	t.Helper()
	cmd := r.command(t, extra...)
	p := &gatewayProc{cmd: cmd, stderr: &syncBuffer{}}
	cmd.Stderr = p.stderr
	t.Cleanup(func() {
		if p.session != nil {
			p.session.Close()
		}
		if p.cmd.ProcessState == nil && p.cmd.Process != nil {
			p.cmd.Process.Kill()
			p.cmd.Wait()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, opts).Connect(ctx,
		&mcp.CommandTransport{Command: cmd, TerminateDuration: 40 * time.Second}, sopts)
	if err != nil {
		t.Fatalf("connect to once mcp: %v\n%s", err, p.stderr.String())
	}
	p.session = s
	return p
}

// callNoMeta calls tool with no _meta at all.
func callNoMeta(t *testing.T, s *mcp.ClientSession, tool string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	res, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("call %s: %v", tool, err)
	}
	return res
}

// actions lists db's actions as `once ls --json` prints them.
func actions(t *testing.T, db string, filter ...string) []map[string]any {
	t.Helper()
	out := mustRun(t, append([]string{"ls", "--db", db, "--json"}, filter...)...)
	var acts []map[string]any
	if err := json.Unmarshal([]byte(out), &acts); err != nil {
		t.Fatalf("once ls --json: %v\n%s", err, out)
	}
	return acts
}

func replayed(res *mcp.CallToolResult) bool { return res.Meta["oncehq.dev/replayed"] == true }

// TestMCPGatewayRunHeader: a call whose _meta names no run takes it
// from the Once-Run header (its step from Once-Step), then from --run;
// one with none anywhere is refused, and nothing is sent.
func TestMCPGatewayRunHeader(t *testing.T) {
	db := filepath.Join(t.TempDir(), "once.db")
	mustRun(t, "migrate", "--db", db)
	args := map[string]any{"to": "hdr@example.com", "subject": "header"}

	t.Run("header", func(t *testing.T) {
		r := newGatewayRig(t, db, e2ePolicy)
		g, url := r.listen(t)
		a := mustConnectHTTP(t, g, url, http.Header{"Once-Run": {"hdr-1"}}, "")
		first, again := callNoMeta(t, a, "send_message", args), callNoMeta(t, a, "send_message", args)
		if first.IsError || replayed(first) || again.IsError || !replayed(again) {
			t.Fatalf("two calls under Once-Run hdr-1: %v %q / %v %q", first.Meta, resultText(first), again.Meta, resultText(again))
		}
		if n := r.count(t, "send_message"); n != 1 {
			t.Fatalf("sent %d, want 1", n)
		}
		// Another client, the same header: the same action.
		if res := callNoMeta(t, mustConnectHTTP(t, g, url, http.Header{"Once-Run": {"hdr-1"}}, ""), "send_message", args); !replayed(res) {
			t.Fatalf("another client under Once-Run hdr-1: %v %q", res.Meta, resultText(res))
		}
		b := mustConnectHTTP(t, g, url, http.Header{"Once-Run": {"hdr-2"}}, "")
		if res := callNoMeta(t, b, "send_message", args); res.IsError || replayed(res) {
			t.Fatalf("under Once-Run hdr-2: %v %q", res.Meta, resultText(res))
		}
		if n := r.count(t, "send_message"); n != 2 {
			t.Fatalf("sent %d, want 2 (a new run is a new action)", n)
		}
		c := mustConnectHTTP(t, g, url, http.Header{"Once-Run": {"hdr-1"}, "Once-Step": {"1"}}, "")
		if res := callNoMeta(t, c, "send_message", args); res.IsError || replayed(res) {
			t.Fatalf("under Once-Run hdr-1, Once-Step 1: %v %q", res.Meta, resultText(res))
		}
		if res := callNoMeta(t, c, "send_message", args); !replayed(res) {
			t.Fatalf("again under Once-Run hdr-1, Once-Step 1: %v %q", res.Meta, resultText(res))
		}
		if n := r.count(t, "send_message"); n != 3 {
			t.Fatalf("sent %d, want 3 (a new step is a new action)", n)
		}
		steps := map[float64]bool{}
		for _, a := range actions(t, db, "--run", "hdr-1") {
			steps[a["step"].(float64)] = true
		}
		if len(steps) != 2 || !steps[0] || !steps[1] {
			t.Fatalf("run hdr-1 has steps %v, want 0 and 1", steps)
		}
		// _meta wins over the header.
		res, err := a.CallTool(context.Background(), &mcp.CallToolParams{Name: "send_message", Arguments: args, Meta: mcp.Meta{"oncehq.dev/run": "hdr-meta"}})
		if err != nil || res.IsError || replayed(res) || len(actions(t, db, "--run", "hdr-meta")) != 1 {
			t.Fatalf("_meta naming run hdr-meta under Once-Run hdr-1: %v %v", err, res)
		}
		// A step header that is not a number is refused, not read as 0.
		for _, step := range []string{"-1", "one", "1.5"} {
			s := mustConnectHTTP(t, g, url, http.Header{"Once-Run": {"hdr-3"}, "Once-Step": {step}}, "")
			res := callNoMeta(t, s, "send_message", args)
			if !res.IsError || !strings.Contains(resultText(res), "Once-Step") {
				t.Errorf("Once-Step %q: isError %v %q", step, res.IsError, resultText(res))
			}
		}
		if n := r.count(t, "send_message"); n != 4 {
			t.Fatalf("sent %d, want 4", n)
		}
		// No run anywhere: no _meta, no header, no --run, no scope.
		before := len(actions(t, db))
		res = callNoMeta(t, mustConnectHTTP(t, g, url, nil, ""), "send_message", args)
		if !res.IsError || !strings.Contains(resultText(res), "oncehq.dev/run") || !strings.Contains(resultText(res), "Once-Run") {
			t.Fatalf("a call naming no run: isError %v %q", res.IsError, resultText(res))
		}
		if n := r.count(t, "send_message"); n != 4 {
			t.Fatalf("a call naming no run sent: %d, want 4", n)
		}
		if n := len(actions(t, db)); n != before {
			t.Fatalf("a call naming no run left an action: %d, want %d", n, before)
		}
	})

	t.Run("--run", func(t *testing.T) {
		for _, mode := range []string{"stdio", "http"} {
			t.Run(mode, func(t *testing.T) {
				r := newGatewayRig(t, db, e2ePolicy)
				run := "flag-" + mode
				var s *mcp.ClientSession
				var g *gatewayProc
				var url string
				if mode == "stdio" {
					s = r.connectStdio(t, nil, nil, "--run", run).session
				} else {
					g, url = r.listen(t, "--run", run)
					s = mustConnectHTTP(t, g, url, nil, "")
				}
				first, again := callNoMeta(t, s, "send_message", args), callNoMeta(t, s, "send_message", args)
				if first.IsError || replayed(first) || !replayed(again) {
					t.Fatalf("two calls under --run: %q / %v %q", resultText(first), again.Meta, resultText(again))
				}
				if acts := actions(t, db, "--run", run); len(acts) != 1 || acts[0]["target"] != "hdr@example.com" {
					t.Fatalf("run %s has %v, want the one call", run, acts)
				}
				if mode == "http" {
					// The header wins over --run.
					h := mustConnectHTTP(t, g, url, http.Header{"Once-Run": {"hdr-over-flag"}}, "")
					if res := callNoMeta(t, h, "send_message", args); res.IsError || replayed(res) || len(actions(t, db, "--run", "hdr-over-flag")) != 1 {
						t.Fatalf("Once-Run under --run: %v %q", res.Meta, resultText(res))
					}
				}
				want := map[string]int{"stdio": 1, "http": 2}[mode]
				if n := r.count(t, "send_message"); n != want {
					t.Fatalf("sent %d, want %d", n, want)
				}
			})
		}
	})
}

// TestMCPGatewayOperators: an operator finds a gateway's actions with
// once ls and reads what was sent with once show.
func TestMCPGatewayOperators(t *testing.T) {
	db := filepath.Join(t.TempDir(), "once.db")
	mustRun(t, "migrate", "--db", db)
	r := newGatewayRig(t, db, e2ePolicy)
	g := r.start(t, "stdio")
	sent := g.call(t, "ops", 0, "send_message", map[string]any{"to": "ann@example.com", "subject": "invoice", "body": "attached"})
	charged := g.call(t, "ops", 1, "charge", map[string]any{"customer": "cus_ops", "amount": 700, "idempotency_key": "the-model-wrote-this"})
	if sent.IsError || charged.IsError {
		t.Fatalf("calls: %q / %q", resultText(sent), resultText(charged))
	}
	for _, c := range []struct {
		kind, target string
		res          *mcp.CallToolResult
		payload      map[string]any
	}{
		{"mcp:counter/send_message", "ann@example.com", sent, map[string]any{"to": "ann@example.com", "subject": "invoice", "body": "attached"}},
		{"mcp:counter/charge", "cus_ops", charged, map[string]any{"customer": "cus_ops", "amount": float64(700)}},
	} {
		acts := actions(t, db, "--kind", c.kind)
		if len(acts) != 1 {
			t.Fatalf("once ls --kind %s: %d actions, want 1: %v", c.kind, len(acts), acts)
		}
		a := acts[0]
		key, _ := c.res.Meta["oncehq.dev/key"].(string)
		if a["key"] != key || a["target"] != c.target || a["run"] != "ops" || a["status"] != "succeeded" {
			t.Errorf("once ls --kind %s: %v; want key %s, target %s, run ops, succeeded", c.kind, a, key, c.target)
		}
		out := mustRun(t, "show", key, "--db", db, "--payload")
		var p map[string]any
		if err := json.Unmarshal([]byte(out), &p); err != nil {
			t.Fatalf("once show --payload: %v\n%s", err, out)
		}
		if fmt.Sprint(p) != fmt.Sprint(c.payload) {
			t.Errorf("once show %s --payload: %v, want %v", c.kind, p, c.payload)
		}
		text := mustRun(t, "show", key, "--db", db)
		if !strings.Contains(text, c.kind) || !strings.Contains(text, c.target) {
			t.Errorf("once show %s does not name its kind and target:\n%s", key, text)
		}
	}
	// The provider got the attempt's key, not the model's.
	es := r.effectsOf(t, "charge")
	if len(es) != 1 || es[0]["key"] == "" || es[0]["key"] == "the-model-wrote-this" {
		t.Fatalf("the provider's charge: %v; want the gateway's provider key", es)
	}
}
