package cli_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/lab/cli"
)

// syncBuffer is an output a running command writes while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startServe runs `once serve` with args in the background and waits
// for the address it serves on, failing the test if it exits first.
// It waits for the exit, not for a line on stderr: serve logs there
// as it starts (the webhook's line came before the address on CI).
func startServe(t *testing.T, args ...string) (base string, stdout, stderr *syncBuffer, stop func() int) {
	t.Helper()
	var exited func() bool
	stdout, stderr, stop, exited = runCommand(t, append([]string{"serve"}, args...)...)
	eventually(t, "console address", func() bool {
		m := servingOn.FindStringSubmatch(stdout.String())
		if m != nil {
			base = m[1]
		}
		return m != nil || exited()
	})
	if base == "" {
		t.Fatalf("serve exited %d before it served: %s", stop(), stderr)
	}
	return base, stdout, stderr, stop
}

// background runs a command that runs until stopped; stop ends it and
// returns its exit code.
func background(t *testing.T, args ...string) (stdout, stderr *syncBuffer, stop func() int) {
	t.Helper()
	stdout, stderr, stop, _ = runCommand(t, args...)
	return stdout, stderr, stop
}

// runCommand is background that also says whether the command has exited on
// its own.
func runCommand(t *testing.T, args ...string) (stdout, stderr *syncBuffer, stop func() int, exited func() bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stdout, stderr = new(syncBuffer), new(syncBuffer)
	done := make(chan struct{})
	var code int
	go func() { code = cli.Run(ctx, args, stdout, stderr); close(done) }()
	stop = func() int {
		cancel()
		<-done
		return code
	}
	exited = func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	}
	t.Cleanup(func() { stop() })
	return stdout, stderr, stop, exited
}

// eventually polls until cond holds, failing after a minute.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within a minute", what)
		}
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

var servingOn = regexp.MustCompile(`once console on (http://127\.0\.0\.1:\d+/) `)

// TestServe runs `once serve` over loopback against a database holding a
// claim whose worker died: the library's reaper puts it up for review and
// the overview shows that pass, /metrics counts through the client, and
// the command ends cleanly when stopped.
func TestServe(t *testing.T) {
	db := filepath.Join(t.TempDir(), "once.db")
	mustRun(t, "migrate", "--db", db)
	_, review, dead := fill(t, db)
	time.Sleep(20 * time.Millisecond) // past the dead claim's lease

	base, _, errOut, stop := startServe(t, "--addr", "127.0.0.1:0", "--reap-every", "1h", "--db", db)
	if code, body := get(t, base+"healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	var overview string
	eventually(t, "reaper pass on the overview", func() bool {
		_, overview = get(t, base)
		return strings.Contains(overview, `<tbody><tr><td class="num">1</td><td class="num">1</td>`)
	})
	if !strings.Contains(overview, "Last reaper pass") || !strings.Contains(overview, "<strong>2</strong>") {
		t.Errorf("the overview after the pass:\n%s", overview)
	}
	code, page := get(t, base+"review")
	if code != 200 || !strings.Contains(page, string(dead)[:12]) || !strings.Contains(page, string(review)[:12]) {
		t.Errorf("/review: %d, want both actions in review:\n%s", code, page)
	}
	code, metrics := get(t, base+"metrics")
	for _, want := range []string{`once_actions{kind="post_message",status="review"} 1`, `once_actions{kind="send_email",status="review"} 1`, "once_store_scrape_error 0"} {
		if code != 200 || !strings.Contains(metrics, want) {
			t.Errorf("/metrics: %d, lacks %q", code, want)
		}
	}
	if code := stop(); code != 0 {
		t.Errorf("serve exited %d after the stop: %s", code, errOut)
	}
	if _, err := http.Get(base + "healthz"); err == nil {
		t.Errorf("the console still answers after serve returned")
	}
}

// TestReapEvery runs `once reap --every` as the library's reaper loop:
// the first pass recovers the dead claim and is printed, and a stop ends
// the command cleanly.
func TestReapEvery(t *testing.T) {
	db := filepath.Join(t.TempDir(), "once.db")
	mustRun(t, "migrate", "--db", db)
	_, _, dead := fill(t, db)
	time.Sleep(20 * time.Millisecond) // past the dead claim's lease

	out, errOut, stop := background(t, "reap", "--every", "1h", "--json", "--db", db)
	var rep once.ReapReport
	eventually(t, "reaper pass", func() bool {
		return json.NewDecoder(strings.NewReader(out.String())).Decode(&rep) == nil
	})
	if rep.Examined != 1 || rep.Review != 1 || rep.ByKind["post_message"] != 1 {
		t.Errorf("the first pass: %+v", rep)
	}
	if code := stop(); code != 0 {
		t.Errorf("reap --every exited %d after the stop: %s", code, errOut)
	}
	if show := mustRun(t, "show", string(dead), "--db", db); !strings.Contains(show, "review") {
		t.Errorf("after the pass, show said:\n%s", show)
	}
}

// hostGet loads base+path with the Host header set to host and, if
// token is not empty, the bearer token.
func hostGet(t *testing.T, base, path, host, token string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestServeAllowedHosts: with a token, `once serve` on loopback still
// answers only its loopback names and those given with --allow-host. A
// page on a name rebound to 127.0.0.1 gets 421 even when the request
// carries the token (a proxy or a script that holds it).
func TestServeAllowedHosts(t *testing.T) {
	db := filepath.Join(t.TempDir(), "once.db")
	mustRun(t, "migrate", "--db", db)
	const token = "t0ken-for-hosts"
	base, _, _, _ := startServe(t, "--addr", "127.0.0.1:0", "--reap-every", "0", "--token", token,
		"--allow-host", "console.test", "--allow-host", "Ops.Example", "--db", db)
	port := base[strings.LastIndex(base, ":")+1 : len(base)-1]
	for host, want := range map[string]int{
		"127.0.0.1:" + port:               http.StatusOK,
		"localhost:" + port:               http.StatusOK,
		"[::1]:" + port:                   http.StatusOK,
		"console.test:" + port:            http.StatusOK,
		"ops.example":                     http.StatusOK,
		"rebind.attacker.example:" + port: http.StatusMisdirectedRequest,
		"console.test.attacker.example":   http.StatusMisdirectedRequest,
	} {
		if got := hostGet(t, base, "review", host, token); got != want {
			t.Errorf("GET /review with Host %s and the token: %d, want %d", host, got, want)
		}
	}
	// /healthz needs no token but still only answers the console's names.
	if got := hostGet(t, base, "healthz", "rebind.attacker.example:"+port, ""); got != http.StatusMisdirectedRequest {
		t.Errorf("GET /healthz with a foreign Host: %d, want 421", got)
	}
}

// TestServeConnectionLimits: connections that say nothing, or made a
// request and went quiet, cannot hold `once serve` forever. With its
// connection cap lowered to 4 and its timeouts to a second, sixteen
// such connections are all closed by the server, and an authenticated
// request made behind them is answered.
func TestServeConnectionLimits(t *testing.T) {
	db := filepath.Join(t.TempDir(), "once.db")
	mustRun(t, "migrate", "--db", db)
	t.Cleanup(cli.SetServeLimits(4, time.Second))
	const token = "t0ken-for-limits"
	base, _, _, _ := startServe(t, "--addr", "127.0.0.1:0", "--reap-every", "0", "--token", token, "--db", db)
	addr := strings.TrimSuffix(strings.TrimPrefix(base, "http://"), "/")

	var quiet []net.Conn
	t.Cleanup(func() {
		for _, c := range quiet {
			c.Close()
		}
	})
	for i := range 16 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		quiet = append(quiet, c)
		if i >= 4 {
			continue // says nothing at all
		}
		// One request on a keep-alive connection, then silence.
		fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Close {
			t.Fatalf("keep-alive /healthz: %d, close %v", resp.StatusCode, resp.Close)
		}
	}
	if code := hostGet(t, base, "review", "127.0.0.1", token); code != http.StatusOK {
		t.Errorf("GET /review with the token behind 16 quiet connections: %d, want 200", code)
	}
	deadline := time.Now().Add(30 * time.Second)
	for i, c := range quiet {
		c.SetReadDeadline(deadline)
		if _, err := io.Copy(io.Discard, c); err != nil {
			t.Errorf("quiet connection %d: %v; the server did not close it", i, err)
		}
	}
}

// TestServeRefusesHugeHeaders: a request whose headers run past 64 KiB
// is answered 431 before the console reads it; Go's default let 1 MiB of
// headers through to every request's handler.
func TestServeRefusesHugeHeaders(t *testing.T) {
	base, _, _ := servingWithToken(t, "t0ken-for-the-headers")
	req, _ := http.NewRequest(http.MethodGet, base+"healthz", nil)
	req.Header.Set("X-Padding", strings.Repeat("a", 100<<10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("100 KiB of headers: %s; want 431", resp.Status)
	}
}
