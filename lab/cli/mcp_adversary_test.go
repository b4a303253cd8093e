package cli_test

import (
	"bufio"
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// An adversary's tests of once mcp with real processes.

// startCounterHTTP runs the counter over Streamable HTTP with sessions
// on addr and returns its URL.
func startCounterHTTP(t *testing.T, r *gatewayRig, addr string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(r.counter, "--effects", r.effects, "--http", addr, "--stateful")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("the counter did not say where it listens: %v", err)
	}
	return cmd, strings.TrimSpace(line)
}

// An upstream over HTTP with sessions that restarts has forgotten the
// gateway's session: the next call was answered "session not found"
// before anything ran, and the gateway put it up for review, telling
// the model a person was checking.
func TestMCPAdversaryUpstreamRestartedForgetsItsSession(t *testing.T) {
	db := filepath.Join(t.TempDir(), "once.db")
	mustRun(t, "migrate", "--db", db)
	r := newGatewayRig(t, db, e2ePolicy)
	counter, endpoint := startCounterHTTP(t, r, "127.0.0.1:0")
	u, err := url.Parse(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "mcp", "--db", db, "--policy", r.policy, "--reap-every", "0", "--upstream", endpoint)
	cmd.Env = append(os.Environ(), scenarioServeEnv+"=1")
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	g := &gatewayProc{cmd: cmd, stderr: stderr}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g.session, err = mcp.NewClient(&mcp.Implementation{Name: "adversary", Version: "1"}, nil).
		Connect(ctx, &mcp.CommandTransport{Command: cmd, TerminateDuration: 10 * time.Second}, nil)
	if err != nil {
		t.Fatalf("connect to once mcp: %v\n%s", err, stderr.String())
	}
	t.Cleanup(func() { g.session.Close() })

	res := g.call(t, "restarted", 0, "send_message", map[string]any{"to": "ann@example.com", "subject": "one"})
	if res.IsError {
		t.Fatalf("first call: %q", resultText(res))
	}
	counter.Process.Kill()
	counter.Wait()
	startCounterHTTP(t, r, u.Host)
	res = g.call(t, "restarted", 1, "send_message", map[string]any{"to": "bob@example.com", "subject": "two"})
	if res.IsError {
		t.Fatalf("the call after the upstream restarted: %q\n%s", resultText(res), stderr.String())
	}
	if n := r.count(t, "send_message"); n != 2 {
		t.Fatalf("the upstream sent %d messages, want 2", n)
	}
}
