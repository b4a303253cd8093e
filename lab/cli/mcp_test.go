package cli_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The gateway's end-to-end tests: `once mcp` as a real process (this
// test binary run as the command), in front of the counter, a real MCP
// server process that counts its side effects in a file, called by the
// Go SDK's client over stdio and over Streamable HTTP.

// counterBin builds the counter once per test binary.
var counterBin = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "once-mcp-counter-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "counter")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/oncehq/once/mcpgate/internal/counter/cmd/counter").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build counter: %v\n%s", err, out)
	}
	return bin, nil
})

// gatewayRig is one store, one effects file and one policy, shared by
// the gateways a test starts.
type gatewayRig struct {
	db, policy, effects string
	counter             string
	// upstream, when set, is a counter serving HTTP that the gateways
	// reach by URL (--upstream) instead of starting it.
	upstream string
	// upstreamFlags are the counter's own flags (--stubborn).
	upstreamFlags []string
}

func newGatewayRig(t *testing.T, db, policy string) *gatewayRig {
	t.Helper()
	bin, err := counterBin()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	r := &gatewayRig{db: db, policy: filepath.Join(dir, "tools.json"), effects: filepath.Join(dir, "effects.jsonl"), counter: bin}
	if err := os.WriteFile(r.policy, []byte(policy), 0o600); err != nil {
		t.Fatal(err)
	}
	return r
}

// gatewayProc is a running `once mcp`, and a client session to it.
type gatewayProc struct {
	cmd     *exec.Cmd
	session *mcp.ClientSession
	stderr  *syncBuffer
}

var mcpServing = regexp.MustCompile(`once mcp on (http://\S+)/`)

// args are once mcp's command line over this rig, with extra flags
// before the upstream command ("--http", "127.0.0.1:0" to serve HTTP).
func (r *gatewayRig) args(extra ...string) []string {
	a := append([]string{"mcp", "--db", r.db, "--policy", r.policy, "--reap-every", "1s", "--drain", "30s", "--progress-every", "200ms"}, extra...)
	if r.upstream != "" {
		return append(a, "--upstream", r.upstream)
	}
	return append(append(a, "--", r.counter, "--effects", r.effects), r.upstreamFlags...)
}

// command is the gateway's process, in an environment without
// ONCE_TOKEN, so that only the flags speak.
func (r *gatewayRig) command(t *testing.T, extra ...string) *exec.Cmd {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, r.args(extra...)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ONCE_TOKEN=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, scenarioServeEnv+"=1")
	// A killed gateway's upstream lives on, finishing its call, with
	// the gateway's stderr open: do not wait for it.
	cmd.WaitDelay = 2 * time.Second
	return cmd
}

// listen runs a gateway over HTTP on 127.0.0.1:0, with extra flags,
// and returns its URL.
func (r *gatewayRig) listen(t *testing.T, extra ...string) (*gatewayProc, string) {
	t.Helper()
	cmd := r.command(t, append([]string{"--http", "127.0.0.1:0"}, extra...)...)
	p := &gatewayProc{cmd: cmd, stderr: &syncBuffer{}}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if p.session != nil {
			p.session.Close()
		}
		if p.cmd.ProcessState == nil {
			p.cmd.Process.Kill()
			p.cmd.Wait()
		}
	})
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			p.stderr.Write([]byte(line + "\n"))
			if m := mcpServing.FindStringSubmatch(line); m != nil {
				addr <- m[1]
			}
		}
	}()
	select {
	case a := <-addr:
		return p, a + "/"
	case <-time.After(time.Minute):
		t.Fatalf("once mcp did not say where it listens:\n%s", p.stderr.String())
	}
	return nil, ""
}

// start runs a gateway over stdio (the client spawns it, as a desktop
// host does) or over HTTP (it listens; the client connects), with a Go
// SDK client connected to it.
func (r *gatewayRig) start(t *testing.T, mode string) *gatewayProc {
	t.Helper()
	var p *gatewayProc
	var transport mcp.Transport
	if mode == "stdio" {
		cmd := r.command(t)
		p = &gatewayProc{cmd: cmd, stderr: &syncBuffer{}}
		cmd.Stderr = p.stderr
		transport = &mcp.CommandTransport{Command: cmd, TerminateDuration: 40 * time.Second}
		t.Cleanup(func() {
			p.session.Close()
			if p.cmd.ProcessState == nil && p.cmd.Process != nil {
				p.cmd.Process.Kill()
				p.cmd.Wait()
			}
		})
	} else {
		var url string
		p, url = r.listen(t)
		transport = &mcp.StreamableClientTransport{Endpoint: url}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil).Connect(ctx, transport, nil)
	if err != nil {
		t.Fatalf("connect to once mcp: %v\n%s", err, p.stderr.String())
	}
	p.session = s
	return p
}

// kill SIGKILLs the gateway: no drain, no outcome recorded.
func (p *gatewayProc) kill(t *testing.T) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGKILL)
	p.session.Close()
	p.cmd.Wait()
}

func (p *gatewayProc) call(t *testing.T, run string, step int, tool string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	res, err := p.session.CallTool(context.Background(), &mcp.CallToolParams{
		Name: tool, Arguments: args, Meta: mcp.Meta{"oncehq.dev/run": run, "oncehq.dev/step": step},
	})
	if err != nil {
		t.Fatalf("call %s: %v\n%s", tool, err, p.stderr.String())
	}
	return res
}

// count is how many effects of tool the counter recorded.
func (r *gatewayRig) count(t *testing.T, tool string) int {
	t.Helper()
	return len(r.effectsOf(t, tool))
}

func (r *gatewayRig) effectsOf(t *testing.T, tool string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(r.effects)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, line := range strings.Split(string(b), "\n") {
		var e map[string]any
		if json.Unmarshal([]byte(line), &e) == nil && e["tool"] == tool {
			out = append(out, e)
		}
	}
	return out
}

func resultText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			b.WriteString(t.Text + "\n")
		}
	}
	return b.String()
}

func structured(res *mcp.CallToolResult) map[string]any {
	m, _ := res.StructuredContent.(map[string]any)
	return m
}

const e2ePolicy = `{"server": "counter", "trust_annotations": true, "tools": {
  "send_message": {"key": ["/to"], "lease": "2s", "wait": "20s"},
  "charge":       {"key": ["/customer"], "provider_key": "idempotency_key", "lease": "2s", "wait": "20s"},
  "fail_tool":    {"read_only": true}
}}`

const e2eVerifiedPolicy = `{"server": "counter", "tools": {
  "send_message": {"key": ["/to"], "lease": "2s", "wait": "20s", "recovery": "verify_then_decide",
                   "verifier": {"tool": "find_message", "arguments": {"to": "/to", "subject": "/subject"}, "landed": "/found"}}
}}`

const e2eApprovalPolicy = `{"server": "counter", "tools": {
  "send_message": {"key": ["/to"], "wait": "3s", "approval": {"always": true}}
}}`

// TestMCPGateway drives once mcp through the Go SDK's client, over each
// store and both transports.
func TestMCPGateway(t *testing.T) {
	for store, newDB := range databases(t) {
		for _, mode := range []string{"stdio", "http"} {
			t.Run(store+"/"+mode, func(t *testing.T) {
				db := newDB(t)
				mustRun(t, "migrate", "--db", db)
				t.Run("caller leaves after the effect", func(t *testing.T) { mcpCallerLeaves(t, db, mode) })
				t.Run("identical calls race", func(t *testing.T) { mcpRace(t, db, mode) })
				t.Run("changed arguments", func(t *testing.T) { mcpChanged(t, db, mode) })
				t.Run("killed: ask a person", func(t *testing.T) { mcpKilledAskPerson(t, db, mode) })
				t.Run("killed: provider key", func(t *testing.T) { mcpKilledProviderKey(t, db, mode) })
				t.Run("killed: verifier", func(t *testing.T) { mcpKilledVerified(t, db, mode) })
				t.Run("approval raced", func(t *testing.T) { mcpApproval(t, db, mode) })
			})
		}
	}
}

func mcpCallerLeaves(t *testing.T, db, mode string) {
	r := newGatewayRig(t, db, e2ePolicy)
	g := r.start(t, mode)
	args := map[string]any{"to": "ann@example.com", "subject": "hi", "body": "hello", "after_ms": 1500}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := g.session.CallTool(ctx, &mcp.CallToolParams{Name: "send_message", Arguments: args,
			Meta: mcp.Meta{"oncehq.dev/run": "leaves", "oncehq.dev/step": 0}})
		errc <- err
	}()
	eventually(t, "the effect", func() bool { return r.count(t, "send_message") == 1 })
	// The effect happened and its answer has not come back: the caller
	// goes (its request cancelled, its connection closed).
	cancel()
	<-errc
	g.session.Close()
	if mode == "stdio" {
		// The host is gone; the gateway finishes the call and exits.
		g.cmd.Wait()
	}
	again := r.start(t, mode)
	var res *mcp.CallToolResult
	eventually(t, "the replay", func() bool {
		res = again.call(t, "leaves", 0, "send_message", args)
		return !res.IsError
	})
	if res.Meta["oncehq.dev/replayed"] != true || !strings.Contains(resultText(res), "already performed") {
		t.Fatalf("the re-issued call is not a marked replay: %v %q", res.Meta, resultText(res))
	}
	if n := r.count(t, "send_message"); n != 1 {
		t.Fatalf("the upstream sent %d messages, want 1", n)
	}
}

func mcpRace(t *testing.T, db, mode string) {
	r := newGatewayRig(t, db, e2ePolicy)
	a, b := r.start(t, mode), r.start(t, mode)
	args := map[string]any{"to": "bob@example.com", "subject": "race", "after_ms": 1000}
	out := make(chan *mcp.CallToolResult, 2)
	for _, g := range []*gatewayProc{a, b} {
		go func() { out <- g.call(t, "race", 0, "send_message", args) }()
	}
	r1, r2 := <-out, <-out
	if r1.IsError || r2.IsError {
		t.Fatalf("racing calls: %q / %q", resultText(r1), resultText(r2))
	}
	if n := r.count(t, "send_message"); n != 1 {
		t.Fatalf("the upstream sent %d messages, want 1", n)
	}
	if structured(r1)["id"] != structured(r2)["id"] || structured(r1)["id"] == nil {
		t.Fatalf("the two calls got %v and %v, want the same message", r1.StructuredContent, r2.StructuredContent)
	}
}

func mcpChanged(t *testing.T, db, mode string) {
	r := newGatewayRig(t, db, e2ePolicy)
	g := r.start(t, mode)
	first := g.call(t, "changed", 0, "send_message", map[string]any{"to": "cy@example.com", "subject": "s", "body": "first"})
	if first.IsError {
		t.Fatalf("first call: %q", resultText(first))
	}
	res := g.call(t, "changed", 0, "send_message", map[string]any{"to": "cy@example.com", "subject": "s", "body": "reworded"})
	if !res.IsError || !strings.Contains(resultText(res), "different arguments") {
		t.Fatalf("changed body: isError %v %q", res.IsError, resultText(res))
	}
	if structured(res)["id"] != structured(first)["id"] {
		t.Fatalf("the refusal carries %v, want the stored result %v", res.StructuredContent, first.StructuredContent)
	}
	if n := r.count(t, "send_message"); n != 1 {
		t.Fatalf("the upstream sent %d messages, want 1", n)
	}
}

// killedMidCall starts a gateway and a call whose upstream acts and
// then holds its reply, SIGKILLs the gateway once the upstream acted,
// and returns a new gateway over the same store.
func (r *gatewayRig) killedMidCall(t *testing.T, mode, tool string, args map[string]any, run string) *gatewayProc {
	t.Helper()
	g := r.start(t, mode)
	go g.session.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args,
		Meta: mcp.Meta{"oncehq.dev/run": run, "oncehq.dev/step": 0}})
	eventually(t, "the effect", func() bool { return r.count(t, tool) == 1 })
	g.kill(t)
	return r.start(t, mode)
}

func mcpKilledAskPerson(t *testing.T, db, mode string) {
	r := newGatewayRig(t, db, e2ePolicy)
	args := map[string]any{"to": "dee@example.com", "subject": "s", "after_ms": 30000}
	again := r.killedMidCall(t, mode, "send_message", args, "asked")
	res := again.call(t, "asked", 0, "send_message", args)
	if !res.IsError || !strings.Contains(resultText(res), "a person is checking") {
		t.Fatalf("after the kill: isError %v %q", res.IsError, resultText(res))
	}
	key, _ := res.Meta["oncehq.dev/key"].(string)
	if key == "" {
		key = regexp.MustCompile(`key ([0-9a-f]{16,})`).FindStringSubmatch(resultText(res))[1]
	}
	mustRun(t, "resolve", key, "--db", db, "--done", "--note", "checked the outbox: it was sent", "--by", "ops",
		"--result", `{"content":[{"type":"text","text":"sent (checked by ops)"}],"structuredContent":{"id":"msg_checked"}}`)
	res = again.call(t, "asked", 0, "send_message", args)
	if res.IsError || structured(res)["id"] != "msg_checked" {
		t.Fatalf("after the person's decision: isError %v %q %v", res.IsError, resultText(res), res.StructuredContent)
	}
	if n := r.count(t, "send_message"); n != 1 {
		t.Fatalf("the upstream sent %d messages, want 1", n)
	}
}

func mcpKilledProviderKey(t *testing.T, db, mode string) {
	r := newGatewayRig(t, db, e2ePolicy)
	args := map[string]any{"customer": "cus_1", "amount": 500, "after_ms": 30000}
	again := r.killedMidCall(t, mode, "charge", args, "charged")
	res := again.call(t, "charged", 0, "charge", args)
	if res.IsError {
		t.Fatalf("after the kill: %q", resultText(res))
	}
	es := r.effectsOf(t, "charge")
	if len(es) != 1 {
		t.Fatalf("the provider made %d charges, want 1", len(es))
	}
	if structured(res)["id"] == nil || structured(res)["id"] != es[0]["result"].(map[string]any)["id"] {
		t.Fatalf("the re-sent charge answered %v; the provider made %v", res.StructuredContent, es[0]["result"])
	}
}

func mcpKilledVerified(t *testing.T, db, mode string) {
	r := newGatewayRig(t, db, e2eVerifiedPolicy)
	args := map[string]any{"to": "eve@example.com", "subject": "verified", "after_ms": 30000}
	again := r.killedMidCall(t, mode, "send_message", args, "verified")
	var res *mcp.CallToolResult
	eventually(t, "the verifier's decision", func() bool {
		res = again.call(t, "verified", 0, "send_message", args)
		return !res.IsError
	})
	if !strings.Contains(resultText(res), "find_message confirmed") {
		t.Fatalf("after the kill: %q", resultText(res))
	}
	if n := r.count(t, "send_message"); n != 1 {
		t.Fatalf("the upstream sent %d messages, want 1", n)
	}
}

func mcpApproval(t *testing.T, db, mode string) {
	r := newGatewayRig(t, db, e2eApprovalPolicy)
	a, b := r.start(t, mode), r.start(t, mode)
	args := map[string]any{"to": "fay@example.com", "subject": "wire", "after_ms": 500}
	res := a.call(t, "approve", 0, "send_message", args)
	if !res.IsError || !strings.Contains(resultText(res), "approval") {
		t.Fatalf("before approval: isError %v %q", res.IsError, resultText(res))
	}
	if n := r.count(t, "send_message"); n != 0 {
		t.Fatalf("sent %d before approval", n)
	}
	key := res.Meta["oncehq.dev/key"]
	if key == nil {
		key = regexp.MustCompile(`key ([0-9a-f]{16,})`).FindStringSubmatch(resultText(res))[1]
	}
	mustRun(t, "approve", fmt.Sprint(key), "--db", db, "--by", "ops")
	out := make(chan *mcp.CallToolResult, 2)
	for _, g := range []*gatewayProc{a, b} {
		go func() { out <- g.call(t, "approve", 0, "send_message", args) }()
	}
	r1, r2 := <-out, <-out
	if r1.IsError || r2.IsError {
		t.Fatalf("after approval: %q / %q", resultText(r1), resultText(r2))
	}
	if n := r.count(t, "send_message"); n != 1 {
		t.Fatalf("sent %d times after one approval, want 1", n)
	}
}
