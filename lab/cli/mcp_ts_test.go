package cli_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestMCPGatewayTypeScript calls once mcp from the TypeScript MCP
// clients a real host uses, in real Node processes: the 2026-07-28
// client (@modelcontextprotocol/client) and the 2025-11-25 one
// (@modelcontextprotocol/sdk), each over stdio (it spawns the gateway)
// and over HTTP, through mcpgate/test/ts/call.mjs.
func TestMCPGatewayTypeScript(t *testing.T) {
	npm := need(t, "npm")
	node := need(t, "node")
	dir, err := filepath.Abs("../../mcpgate/test/ts")
	if err != nil {
		t.Fatal(err)
	}
	npmCI(t, npm, dir)
	want := map[string]string{"new": "2026-07-28", "old": "2025-11-25"}
	for _, sdk := range []string{"new", "old"} {
		for _, mode := range []string{"stdio", "http"} {
			t.Run(sdk+"/"+mode, func(t *testing.T) {
				db := filepath.Join(t.TempDir(), "once.db")
				mustRun(t, "migrate", "--db", db)
				h := &tsHost{node: node, script: filepath.Join(dir, "call.mjs"), sdk: sdk, mode: mode, version: want[sdk]}
				t.Run("caller killed after the effect", func(t *testing.T) { tsCallerKilled(t, h, db) })
				t.Run("identical calls race", func(t *testing.T) { tsRace(t, h, db) })
				t.Run("changed arguments", func(t *testing.T) { tsChanged(t, h, db) })
				t.Run("gateway killed: ask a person", func(t *testing.T) { tsKilledAskPerson(t, h, db) })
				t.Run("gateway killed: provider key", func(t *testing.T) { tsKilledProviderKey(t, h, db) })
				t.Run("gateway killed: verifier", func(t *testing.T) { tsKilledVerified(t, h, db) })
				t.Run("approval raced", func(t *testing.T) { tsApproval(t, h, db) })
			})
		}
	}
}

// tsHost runs call.mjs as a host would run its MCP client.
type tsHost struct {
	node, script, sdk, mode, version string
}

// tsGateway is where a host reaches a gateway: a launcher script the
// client spawns (stdio), or a gateway listening (HTTP).
type tsGateway struct {
	r      *gatewayRig
	mode   string
	url    string
	proc   *gatewayProc
	pids   string
	script string
}

// gateway makes a way to reach a gateway over r. Over stdio the client
// spawns it through a script that records its pid (the 2026-07-28
// client may spawn it twice: a probe, then the session) and passes the
// environment the test binary needs to be once.
func (h *tsHost) gateway(t *testing.T, r *gatewayRig) *tsGateway {
	t.Helper()
	g := &tsGateway{r: r, mode: h.mode}
	if h.mode == "http" {
		g.proc, g.url = r.listen(t)
		return g
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	g.pids = filepath.Join(dir, "pids")
	g.script = filepath.Join(dir, "gateway.sh")
	var quoted []string
	for _, a := range append([]string{self}, r.args()...) {
		quoted = append(quoted, "'"+strings.ReplaceAll(a, "'", `'\''`)+"'")
	}
	sh := fmt.Sprintf("#!/bin/sh\necho $$ >> '%s'\n%s=1 exec %s\n", g.pids, scenarioServeEnv, strings.Join(quoted, " "))
	if err := os.WriteFile(g.script, []byte(sh), 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.killAll() })
	return g
}

// kill SIGKILLs the gateway (over stdio: every one the script started).
func (g *tsGateway) kill(t *testing.T) {
	t.Helper()
	if g.mode == "http" {
		g.proc.cmd.Process.Signal(syscall.SIGKILL)
		g.proc.cmd.Wait()
		return
	}
	g.killAll()
}

func (g *tsGateway) killAll() {
	if g.pids == "" {
		return
	}
	b, _ := os.ReadFile(g.pids)
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// gone waits until every gateway the script started has exited.
func (g *tsGateway) gone(t *testing.T) {
	t.Helper()
	eventually(t, "the gateway's exit", func() bool {
		b, _ := os.ReadFile(g.pids)
		for _, f := range strings.Fields(string(b)) {
			pid, _ := strconv.Atoi(f)
			if pid > 0 && syscall.Kill(pid, 0) == nil {
				if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && !bytes.Contains(st, []byte(") Z ")) {
					return false
				}
			}
		}
		return true
	})
}

// tsCall is one run of call.mjs: its process and its output lines.
type tsCall struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan struct{}
}

func (h *tsHost) start(t *testing.T, g *tsGateway, tool string, args map[string]any, run string, extra ...string) *tsCall {
	t.Helper()
	a, _ := json.Marshal(args)
	meta, _ := json.Marshal(map[string]any{"oncehq.dev/run": run, "oncehq.dev/step": 0})
	argv := []string{h.script, "--sdk", h.sdk, "--tool", tool, "--args", string(a), "--meta", string(meta)}
	if h.sdk == "new" {
		argv = append(argv, "--negotiate", "auto")
	}
	if g.mode == "http" {
		argv = append(argv, "--http", g.url)
	} else {
		argv = append(argv, "--stdio", g.script)
	}
	argv = append(argv, extra...)
	c := &tsCall{cmd: exec.Command(h.node, argv...), done: make(chan struct{})}
	c.cmd.Stderr = &syncBuffer{}
	// The gateway it spawns, and the gateway's upstream, share its
	// stderr and may outlive it (a killed gateway's upstream finishes
	// its call): do not wait for them.
	c.cmd.WaitDelay = 2 * time.Second
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			c.mu.Lock()
			c.out.WriteString(sc.Text() + "\n")
			c.mu.Unlock()
		}
		c.cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() { c.cmd.Process.Kill(); <-c.done })
	return c
}

// tsResult is a call's result as the client printed it.
type tsResult struct {
	IsError           bool            `json:"isError"`
	Content           []tsContent     `json:"content"`
	StructuredContent map[string]any  `json:"structuredContent"`
	Meta              map[string]any  `json:"_meta"`
	Raw               json.RawMessage `json:"-"`
}

type tsContent struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

func (r tsResult) text() string {
	var b strings.Builder
	for _, c := range r.Content {
		b.WriteString(c.Text + "\n")
	}
	return b.String()
}

// results waits for the run to end and returns its results, failing on
// a connect or protocol error and on a negotiated version other than
// the one the client speaks.
func (c *tsCall) results(t *testing.T, h *tsHost) []tsResult {
	t.Helper()
	select {
	case <-c.done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("call.mjs did not end:\n%s", c.output())
	}
	var out []tsResult
	connected := false
	for _, line := range strings.Split(strings.TrimSpace(c.output()), "\n") {
		var l struct {
			Connected *struct {
				ProtocolVersion string `json:"protocolVersion"`
			} `json:"connected"`
			OK     bool            `json:"ok"`
			Result json.RawMessage `json:"result"`
			Error  json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("call.mjs printed %q", line)
		}
		switch {
		case l.Connected != nil:
			connected = true
			if l.Connected.ProtocolVersion != h.version {
				t.Fatalf("the %s client negotiated %s with once mcp; want %s", h.sdk, l.Connected.ProtocolVersion, h.version)
			}
		case l.Error != nil:
			t.Fatalf("the call failed: %s\nstderr:\n%s", l.Error, c.cmd.Stderr)
		case l.OK:
			var r tsResult
			if err := json.Unmarshal(l.Result, &r); err != nil {
				t.Fatal(err)
			}
			r.Raw = l.Result
			out = append(out, r)
		}
	}
	if !connected {
		t.Fatalf("call.mjs never connected:\n%s\nstderr:\n%s", c.output(), c.cmd.Stderr)
	}
	return out
}

func (c *tsCall) output() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.String()
}

// call runs call.mjs to its end and returns its one result.
func (h *tsHost) call(t *testing.T, g *tsGateway, tool string, args map[string]any, run string) tsResult {
	t.Helper()
	rs := h.start(t, g, tool, args, run).results(t, h)
	if len(rs) != 1 {
		t.Fatalf("%d results, want 1", len(rs))
	}
	return rs[0]
}

func tsCallerKilled(t *testing.T, h *tsHost, db string) {
	r := newGatewayRig(t, db, e2ePolicy)
	g := h.gateway(t, r)
	args := map[string]any{"to": "ann@example.com", "subject": "hi", "after_ms": 1500}
	c := h.start(t, g, "send_message", args, "ts-killed")
	eventually(t, "the effect", func() bool { return r.count(t, "send_message") == 1 })
	// The host dies after the upstream acted and before it answered.
	c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
	if g.mode == "stdio" {
		// Its gateway finishes the call, records it, and exits.
		g.gone(t)
	}
	var res tsResult
	eventually(t, "the replay", func() bool {
		res = h.call(t, g, "send_message", args, "ts-killed")
		return !res.IsError
	})
	if res.Meta["oncehq.dev/replayed"] != true || !strings.Contains(res.text(), "already performed") {
		t.Fatalf("the re-issued call is not a marked replay: %s", res.Raw)
	}
	if n := r.count(t, "send_message"); n != 1 {
		t.Fatalf("the upstream sent %d messages, want 1", n)
	}
}

func tsRace(t *testing.T, h *tsHost, db string) {
	r := newGatewayRig(t, db, e2ePolicy)
	g := h.gateway(t, r)
	c := h.start(t, g, "send_message", map[string]any{"to": "bob@example.com", "subject": "race", "after_ms": 800}, "ts-race",
		"--concurrent", "2", "--progress")
	rs := c.results(t, h)
	if len(rs) != 2 || rs[0].IsError || rs[1].IsError {
		t.Fatalf("two concurrent calls: %+v", rs)
	}
	if rs[0].StructuredContent["id"] == nil || rs[0].StructuredContent["id"] != rs[1].StructuredContent["id"] {
		t.Fatalf("the two calls got %v and %v, want the same message", rs[0].StructuredContent, rs[1].StructuredContent)
	}
	if n := r.count(t, "send_message"); n != 1 {
		t.Fatalf("the upstream sent %d messages, want 1", n)
	}
	// The call that waited was told, while it waited, that it was
	// alive: a client's request timeout resets on progress.
	if !strings.Contains(c.output(), `"message":"once: `) {
		t.Fatalf("no progress from the gateway while a call waited:\n%s", c.output())
	}
}

func tsChanged(t *testing.T, h *tsHost, db string) {
	r := newGatewayRig(t, db, e2ePolicy)
	g := h.gateway(t, r)
	first := h.call(t, g, "send_message", map[string]any{"to": "cy@example.com", "subject": "s", "body": "first"}, "ts-changed")
	res := h.call(t, g, "send_message", map[string]any{"to": "cy@example.com", "subject": "s", "body": "reworded"}, "ts-changed")
	if first.IsError || !res.IsError || !strings.Contains(res.text(), "different arguments") {
		t.Fatalf("changed body: %s then %s", first.Raw, res.Raw)
	}
	if res.StructuredContent["id"] != first.StructuredContent["id"] {
		t.Fatalf("the refusal carries %v, want the stored %v", res.StructuredContent, first.StructuredContent)
	}
	if n := r.count(t, "send_message"); n != 1 {
		t.Fatalf("the upstream sent %d messages, want 1", n)
	}
}

// killMidCall starts a call whose upstream acts and then holds its
// reply, and SIGKILLs the gateway (and the host) once it acted.
func killMidCall(t *testing.T, h *tsHost, r *gatewayRig, g *tsGateway, tool string, args map[string]any, run string) {
	t.Helper()
	c := h.start(t, g, tool, args, run)
	eventually(t, "the effect", func() bool { return r.count(t, tool) == 1 })
	g.kill(t)
	c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
}

func tsKilledAskPerson(t *testing.T, h *tsHost, db string) {
	r := newGatewayRig(t, db, e2ePolicy)
	g := h.gateway(t, r)
	args := map[string]any{"to": "dee@example.com", "subject": "s", "after_ms": 30000}
	killMidCall(t, h, r, g, "send_message", args, "ts-asked")
	again := h.gateway(t, r)
	res := h.call(t, again, "send_message", args, "ts-asked")
	if !res.IsError || !strings.Contains(res.text(), "a person is checking") {
		t.Fatalf("after the kill: %s", res.Raw)
	}
	key, _ := res.Meta["oncehq.dev/key"].(string)
	mustRun(t, "resolve", key, "--db", db, "--done", "--note", "checked the outbox", "--by", "ops",
		"--result", `{"content":[{"type":"text","text":"sent (checked by ops)"}],"structuredContent":{"id":"msg_checked"}}`)
	res = h.call(t, again, "send_message", args, "ts-asked")
	if res.IsError || res.StructuredContent["id"] != "msg_checked" {
		t.Fatalf("after the person's decision: %s", res.Raw)
	}
	if n := r.count(t, "send_message"); n != 1 {
		t.Fatalf("the upstream sent %d messages, want 1", n)
	}
}

func tsKilledProviderKey(t *testing.T, h *tsHost, db string) {
	r := newGatewayRig(t, db, e2ePolicy)
	g := h.gateway(t, r)
	args := map[string]any{"customer": "cus_ts", "amount": 700, "after_ms": 30000}
	killMidCall(t, h, r, g, "charge", args, "ts-charged")
	again := h.gateway(t, r)
	res := h.call(t, again, "charge", args, "ts-charged")
	es := r.effectsOf(t, "charge")
	if res.IsError || len(es) != 1 {
		t.Fatalf("after the kill: %s; %d charges", res.Raw, len(es))
	}
	if res.StructuredContent["id"] != es[0]["result"].(map[string]any)["id"] {
		t.Fatalf("the re-sent charge answered %v; the provider made %v", res.StructuredContent, es[0]["result"])
	}
}

func tsKilledVerified(t *testing.T, h *tsHost, db string) {
	r := newGatewayRig(t, db, e2eVerifiedPolicy)
	g := h.gateway(t, r)
	args := map[string]any{"to": "eve@example.com", "subject": "verified", "after_ms": 30000}
	killMidCall(t, h, r, g, "send_message", args, "ts-verified")
	again := h.gateway(t, r)
	var res tsResult
	eventually(t, "the verifier's decision", func() bool {
		res = h.call(t, again, "send_message", args, "ts-verified")
		return !res.IsError
	})
	if !strings.Contains(res.text(), "find_message confirmed") {
		t.Fatalf("after the kill: %s", res.Raw)
	}
	if n := r.count(t, "send_message"); n != 1 {
		t.Fatalf("the upstream sent %d messages, want 1", n)
	}
}

func tsApproval(t *testing.T, h *tsHost, db string) {
	r := newGatewayRig(t, db, e2eApprovalPolicy)
	a, b := h.gateway(t, r), h.gateway(t, r)
	args := map[string]any{"to": "fay@example.com", "subject": "wire", "after_ms": 500}
	res := h.call(t, a, "send_message", args, "ts-approve")
	if !res.IsError || !strings.Contains(res.text(), "approval") || r.count(t, "send_message") != 0 {
		t.Fatalf("before approval: %s", res.Raw)
	}
	key, _ := res.Meta["oncehq.dev/key"].(string)
	mustRun(t, "approve", key, "--db", db, "--by", "ops")
	ca, cb := h.start(t, a, "send_message", args, "ts-approve"), h.start(t, b, "send_message", args, "ts-approve")
	ra, rb := ca.results(t, h), cb.results(t, h)
	if len(ra) != 1 || len(rb) != 1 || ra[0].IsError || rb[0].IsError {
		t.Fatalf("after approval: %+v / %+v", ra, rb)
	}
	if n := r.count(t, "send_message"); n != 1 {
		t.Fatalf("sent %d times after one approval, want 1", n)
	}
}
