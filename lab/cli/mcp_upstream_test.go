package cli_test

import (
	"bufio"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestMCPGatewayUpstreamHTTP fronts an upstream reached by URL
// (--upstream): the counter serving Streamable HTTP in a process of its
// own, which outlives the gateways in front of it, over each transport
// downstream.
func TestMCPGatewayUpstreamHTTP(t *testing.T) {
	for _, mode := range []string{"stdio", "http"} {
		t.Run(mode, func(t *testing.T) {
			db := t.TempDir() + "/once.db"
			mustRun(t, "migrate", "--db", db)
			r := newGatewayRig(t, db, e2ePolicy)
			r.upstream = serveCounter(t, r)

			g := r.start(t, mode)
			args := map[string]any{"to": "kim@example.com", "subject": "by url"}
			first := g.call(t, "by-url", 0, "send_message", args)
			again := g.call(t, "by-url", 0, "send_message", args)
			if first.IsError || again.IsError || again.Meta["oncehq.dev/replayed"] != true {
				t.Fatalf("through an upstream URL: %q then %q", resultText(first), resultText(again))
			}
			// The gateway dies mid-charge; the upstream lives on. The
			// next gateway sends it again with the same provider key.
			charge := map[string]any{"customer": "cus_url", "amount": 300, "after_ms": 30000}
			next := r.killedMidCall(t, mode, "charge", charge, "by-url-charge")
			res := next.call(t, "by-url-charge", 0, "charge", charge)
			es := r.effectsOf(t, "charge")
			if res.IsError || len(es) != 1 || structured(res)["id"] != es[0]["result"].(map[string]any)["id"] {
				t.Fatalf("after the kill: %q %v; %d charges", resultText(res), res.StructuredContent, len(es))
			}
			if n := r.count(t, "send_message"); n != 1 {
				t.Fatalf("the upstream sent %d messages, want 1", n)
			}
		})
	}
}

// serveCounter runs the counter over HTTP and returns its URL (its
// first line on stdout).
func serveCounter(t *testing.T, r *gatewayRig) string {
	t.Helper()
	cmd := exec.Command(r.counter, "--http", "127.0.0.1:0", "--effects", r.effects)
	cmd.WaitDelay = 2 * time.Second
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			line <- strings.TrimSpace(sc.Text())
		}
		for sc.Scan() {
		}
	}()
	select {
	case u := <-line:
		if !strings.HasPrefix(u, "http://") {
			t.Fatalf("the counter's first line is %q, not its URL", u)
		}
		return u
	case <-time.After(time.Minute):
		t.Fatal("the counter did not say where it listens")
	}
	return ""
}
