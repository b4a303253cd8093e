package mcpgate

import (
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/oncehq/once/sqlite"
)

// effects is an upstream for the tests, served in this process: it
// counts each tool's effects and can be held inside a call.
type effects struct {
	mu    sync.Mutex
	count map[string]int
	// hold, when set, is waited on inside send_message after the effect
	// is counted, before the reply: the effect has happened, its answer
	// has not left.
	hold chan struct{}
	keys map[string]bool
}

func (e *effects) n(tool string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.count[tool]
}

func (e *effects) server() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "effects", Version: "1"}, nil)
	yes := true
	type msg struct {
		To      string `json:"to"`
		Subject string `json:"subject,omitempty"`
		Body    string `json:"body,omitempty"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: "send_message", Annotations: &mcp.ToolAnnotations{DestructiveHint: &yes}},
		func(ctx context.Context, _ *mcp.CallToolRequest, in msg) (*mcp.CallToolResult, map[string]any, error) {
			e.mu.Lock()
			e.count["send_message"]++
			n := e.count["send_message"]
			hold := e.hold
			e.mu.Unlock()
			if hold != nil {
				<-hold
			}
			return nil, map[string]any{"id": n, "to": in.To}, nil
		})
	type charge struct {
		Customer string `json:"customer"`
		Amount   int    `json:"amount"`
		Key      string `json:"idempotency_key"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: "charge", Annotations: &mcp.ToolAnnotations{IdempotentHint: true}},
		func(ctx context.Context, _ *mcp.CallToolRequest, in charge) (*mcp.CallToolResult, map[string]any, error) {
			e.mu.Lock()
			defer e.mu.Unlock()
			if !e.keys[in.Key] {
				e.keys[in.Key] = true
				e.count["charge"]++
			}
			return nil, map[string]any{"charged": in.Amount, "key": in.Key}, nil
		})
	s.AddPrompt(&mcp.Prompt{Name: "greet", Description: "a greeting"}, func(ctx context.Context, req *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		return &mcp.GetPromptResult{Messages: []*mcp.PromptMessage{{Role: "user", Content: &mcp.TextContent{Text: "hello " + req.Params.Arguments["name"]}}}}, nil
	})
	s.AddResource(&mcp.Resource{URI: "mem://outbox", Name: "outbox", MIMEType: "text/plain"}, func(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		e.mu.Lock()
		n := e.count["send_message"]
		e.mu.Unlock()
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, Text: strconv.Itoa(n) + " sent"}}}, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "list_messages", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, map[string]any, error) {
			e.mu.Lock()
			defer e.mu.Unlock()
			e.count["list_messages"]++
			return nil, map[string]any{"sent": e.count["send_message"]}, nil
		})
	return s
}

// rig is a gateway in front of effects, with a client connected to it.
type rig struct {
	up      *effects
	srv     *mcp.Server
	gw      *Gateway
	connect func(t *testing.T) *mcp.ClientSession
}

func newRig(t *testing.T, policy string) *rig {
	t.Helper()
	store, f := storeAndPolicy(t, policy)
	up := &effects{count: map[string]int{}, keys: map[string]bool{}}
	srv := up.server()
	gw, err := New(t.Context(), Options{
		Store: store, Policy: f, Progress: 50 * time.Millisecond,
		Upstream: func(ctx context.Context) (mcp.Transport, error) {
			ct, st := mcp.NewInMemoryTransports()
			if _, err := srv.Connect(ctx, st, nil); err != nil {
				return nil, err
			}
			return ct, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	closeAtEnd(t, gw)
	r := &rig{up: up, srv: srv, gw: gw}
	r.connect = func(t *testing.T) *mcp.ClientSession { return clientOf(t, gw) }
	return r
}

// storeAndPolicy is a migrated SQLite store of the test's own and the
// policy file parsed.
func storeAndPolicy(t *testing.T, policy string) (*sqlite.Store, *File) {
	t.Helper()
	store, err := sqlite.Open(filepath.Join(t.TempDir(), "once.db"), sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	if err := store.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	f, err := ParsePolicy(strings.NewReader(policy))
	if err != nil {
		t.Fatal(err)
	}
	return store, f
}

// closeAtEnd closes the gateway when the test ends, waiting up to ten
// seconds for its calls.
func closeAtEnd(t *testing.T, gw *Gateway) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = gw.Close(ctx)
	})
}

// clientOf connects a client to the gateway, in memory.
func clientOf(t *testing.T, gw *Gateway) *mcp.ClientSession {
	t.Helper()
	ct, st := mcp.NewInMemoryTransports()
	if _, err := gw.Server().Connect(t.Context(), st, nil); err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(t.Context(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

const testPolicy = `{"server": "mail", "trust_annotations": true, "tools": {
  "send_message": {"key": ["/to"], "wait": "5s"},
  "charge": {"key": ["/customer"], "provider_key": "idempotency_key"}
}}`

func callArgs(run string, step int, tool string, args map[string]any) *mcp.CallToolParams {
	return &mcp.CallToolParams{Name: tool, Arguments: args, Meta: mcp.Meta{MetaRun: run, MetaStep: step}}
}

func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			b.WriteString(t.Text)
			b.WriteString("\n")
		}
	}
	return b.String()
}

func TestReissuedCallAfterTheCallerLeftIsReplayed(t *testing.T) {
	r := newRig(t, testPolicy)
	hold := make(chan struct{})
	r.up.hold = hold
	first := r.connect(t)
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := first.CallTool(ctx, callArgs("run-1", 0, "send_message", map[string]any{"to": "ann@example.com", "body": "hi"}))
		errc <- err
	}()
	waitFor(t, func() bool { return r.up.n("send_message") == 1 })
	// The caller leaves after the upstream performed the effect and
	// before its answer came back.
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("the cancelled call returned no error")
	}
	first.Close()
	close(hold)

	second := r.connect(t)
	var res *mcp.CallToolResult
	waitFor(t, func() bool {
		var err error
		res, err = second.CallTool(t.Context(), callArgs("run-1", 0, "send_message", map[string]any{"to": "ann@example.com", "body": "hi"}))
		if err != nil {
			t.Fatal(err)
		}
		return !res.IsError
	})
	if got := r.up.n("send_message"); got != 1 {
		t.Fatalf("upstream ran send_message %d times, want 1", got)
	}
	if res.Meta[MetaReplayed] != true || !strings.Contains(text(res), "already performed") {
		t.Fatalf("the re-issued call was not marked a replay: meta %v, text %q", res.Meta, text(res))
	}
	sc, _ := json.Marshal(res.StructuredContent)
	if !strings.Contains(string(sc), `"id":1`) {
		t.Fatalf("replayed structured content %s, want the first call's", sc)
	}
	// The stored result's protocol members were the upstream's: the
	// caller is told the gateway's.
	if info, ok := res.Meta[mcp.MetaKeyServerInfo].(map[string]any); ok && info["name"] != "once-mcp" {
		t.Fatalf("the replay names server %v, want the gateway", info)
	}
}

func TestConcurrentIdenticalCallsRunOnce(t *testing.T) {
	r := newRig(t, testPolicy)
	hold := make(chan struct{})
	r.up.hold = hold
	a, b := r.connect(t), r.connect(t)
	args := map[string]any{"to": "bob@example.com", "body": "hello"}
	type got struct {
		res *mcp.CallToolResult
		err error
	}
	out := make(chan got, 2)
	for _, cs := range []*mcp.ClientSession{a, b} {
		go func() {
			p := callArgs("run-2", 3, "send_message", args)
			p.Meta["progressToken"] = "p1"
			res, err := cs.CallTool(t.Context(), p)
			out <- got{res, err}
		}()
	}
	waitFor(t, func() bool { return r.up.n("send_message") == 1 })
	time.Sleep(200 * time.Millisecond) // the other call meets the claim and waits
	close(hold)
	var sc []string
	for range 2 {
		g := <-out
		if g.err != nil || g.res.IsError {
			t.Fatalf("call: %v %q", g.err, text(g.res))
		}
		b, _ := json.Marshal(g.res.StructuredContent)
		sc = append(sc, string(b))
	}
	if r.up.n("send_message") != 1 {
		t.Fatalf("upstream ran send_message %d times, want 1", r.up.n("send_message"))
	}
	if sc[0] != sc[1] {
		t.Fatalf("the two calls got different results: %s and %s", sc[0], sc[1])
	}
}

func TestChangedArgumentsUnderTheSameKeyAreRefusedWithTheStoredResult(t *testing.T) {
	r := newRig(t, testPolicy)
	cs := r.connect(t)
	res, err := cs.CallTool(t.Context(), callArgs("run-3", 0, "send_message", map[string]any{"to": "cy@example.com", "body": "first"}))
	if err != nil || res.IsError {
		t.Fatalf("first call: %v %q", err, text(res))
	}
	res, err = cs.CallTool(t.Context(), callArgs("run-3", 0, "send_message", map[string]any{"to": "cy@example.com", "body": "reworded"}))
	if err != nil {
		t.Fatal(err)
	}
	if !res.IsError || !strings.Contains(text(res), "different arguments") || !strings.Contains(text(res), "not sent") {
		t.Fatalf("changed body: isError %v, %q", res.IsError, text(res))
	}
	sc, _ := json.Marshal(res.StructuredContent)
	if !strings.Contains(string(sc), `"id":1`) {
		t.Fatalf("refusal carries %s, want the stored result", sc)
	}
	if r.up.n("send_message") != 1 {
		t.Fatalf("upstream ran send_message %d times, want 1", r.up.n("send_message"))
	}
}

func TestProviderKeyIsFilledAndKeptOutOfTheFingerprint(t *testing.T) {
	r := newRig(t, testPolicy)
	cs := r.connect(t)
	var keys []string
	for _, written := range []string{"model-wrote-this", "and-this-on-retry"} {
		res, err := cs.CallTool(t.Context(), callArgs("run-4", 1, "charge", map[string]any{"customer": "c1", "amount": 5, "idempotency_key": written}))
		if err != nil || res.IsError {
			t.Fatalf("charge: %v %q", err, text(res))
		}
		m, _ := res.StructuredContent.(map[string]any)
		keys = append(keys, m["key"].(string))
	}
	if keys[0] != keys[1] || strings.Contains(keys[0], "model") {
		t.Fatalf("provider keys %q: want the attempt's, the same both times", keys)
	}
	if r.up.n("charge") != 1 {
		t.Fatalf("charged %d times", r.up.n("charge"))
	}
}

func TestReadOnlyToolPassesThroughAndCallsWithoutARunAreRefused(t *testing.T) {
	r := newRig(t, testPolicy)
	cs := r.connect(t)
	for range 2 {
		res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "list_messages", Arguments: map[string]any{}})
		if err != nil || res.IsError {
			t.Fatalf("list_messages: %v %q", err, text(res))
		}
	}
	if r.up.n("list_messages") != 2 {
		t.Fatalf("list_messages ran %d times, want 2 (read-only is not claimed)", r.up.n("list_messages"))
	}
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "send_message", Arguments: map[string]any{"to": "x@example.com"}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.IsError || !strings.Contains(text(res), MetaRun) || r.up.n("send_message") != 0 {
		t.Fatalf("a call with no run: isError %v, %q, sent %d", res.IsError, text(res), r.up.n("send_message"))
	}
	res, _ = cs.CallTool(t.Context(), callArgs("run-5", 0, "send_message", map[string]any{"body": "no recipient"}))
	if !res.IsError || !strings.Contains(text(res), "/to") || r.up.n("send_message") != 0 {
		t.Fatalf("a call missing its key argument: isError %v, %q", res.IsError, text(res))
	}
}

var polls atomic.Int64

func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting")
		}
		polls.Add(1)
		time.Sleep(20 * time.Millisecond)
	}
}

func TestEverythingButToolCallsPassesThrough(t *testing.T) {
	r := newRig(t, testPolicy)
	cs := r.connect(t)
	p, err := cs.GetPrompt(t.Context(), &mcp.GetPromptParams{Name: "greet", Arguments: map[string]string{"name": "ann"}})
	if err != nil || len(p.Messages) != 1 || p.Messages[0].Content.(*mcp.TextContent).Text != "hello ann" {
		t.Fatalf("prompt through the gateway: %v %+v", err, p)
	}
	if _, err := cs.CallTool(t.Context(), callArgs("run-6", 0, "send_message", map[string]any{"to": "x@example.com"})); err != nil {
		t.Fatal(err)
	}
	res, err := cs.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: "mem://outbox"})
	if err != nil || len(res.Contents) != 1 || res.Contents[0].Text != "1 sent" {
		t.Fatalf("resource through the gateway, read afresh: %v %+v", err, res)
	}
}

func TestToolsAddedUpstreamAreMirrored(t *testing.T) {
	r := newRig(t, testPolicy)
	cs := r.connect(t)
	mcp.AddTool(r.srv, &mcp.Tool{Name: "post_note"}, func(ctx context.Context, _ *mcp.CallToolRequest, in struct {
		Text string `json:"text"`
	}) (*mcp.CallToolResult, map[string]any, error) {
		r.up.mu.Lock()
		r.up.count["post_note"]++
		r.up.mu.Unlock()
		return nil, map[string]any{"posted": in.Text}, nil
	})
	waitFor(t, func() bool {
		var names []string
		for tool, err := range cs.Tools(t.Context(), nil) {
			if err != nil {
				t.Fatal(err)
			}
			names = append(names, tool.Name)
		}
		return slices.Contains(names, "post_note")
	})
	for range 2 {
		res, err := cs.CallTool(t.Context(), callArgs("run-7", 0, "post_note", map[string]any{"text": "hi"}))
		if err != nil || res.IsError {
			t.Fatalf("post_note: %v %q", err, text(res))
		}
	}
	if n := r.up.n("post_note"); n != 1 {
		t.Fatalf("a tool added after start ran %d times for one intent, want 1", n)
	}
	r.srv.RemoveTools("post_note")
	waitFor(t, func() bool {
		for tool, err := range cs.Tools(t.Context(), nil) {
			if err != nil {
				t.Fatal(err)
			}
			if tool.Name == "post_note" {
				return false
			}
		}
		return true
	})
}

// TestKeyArgumentsOfDifferentTypesAreDifferentTargets: the string
// "[42]" and the number 42 are two recipients, not one written twice.
func TestKeyArgumentsOfDifferentTypesAreDifferentTargets(t *testing.T) {
	r := newRig(t, testPolicy)
	cs := r.connect(t)
	for _, to := range []any{"[42]", 42} {
		res, err := cs.CallTool(t.Context(), callArgs("run-types", 0, "send_message", map[string]any{"to": to}))
		if err != nil || strings.Contains(text(res), "different arguments") {
			t.Fatalf("to %v: %v %q", to, err, text(res))
		}
		// The upstream's schema takes a string: the number reached it,
		// and it said so, as a tool error the model reads.
		if to == 42 && !strings.Contains(text(res), "want \"string\"") {
			t.Fatalf("to 42 did not reach the upstream: %q", text(res))
		}
	}
}
