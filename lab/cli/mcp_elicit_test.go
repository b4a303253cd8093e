package cli_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Approval by elicitation: a client that declared elicitation (protocol
// 2025-11-25) is asked for the approval a call waits for, and its
// answer decides, in the real gateway process over stdio.

// elicitor is a client's elicitation handler that answers action (and
// by, when it accepts), counting what it was asked.
type elicitor struct {
	action, by string
	asked      atomic.Int32
	mu         sync.Mutex
	messages   []string
}

func (e *elicitor) handle(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
	e.asked.Add(1)
	e.mu.Lock()
	e.messages = append(e.messages, req.Params.Message)
	e.mu.Unlock()
	res := &mcp.ElicitResult{Action: e.action}
	if e.action == "accept" {
		res.Content = map[string]any{"by": e.by}
	}
	return res, nil
}

func (e *elicitor) message() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return strings.Join(e.messages, "\n")
}

// elicitingGateway spawns a gateway over stdio and connects a client
// that answers elicitations with e, at protocol 2025-11-25.
func (r *gatewayRig) elicitingGateway(t *testing.T, e *elicitor) *gatewayProc {
	t.Helper()
	return r.connectStdio(t, &mcp.ClientOptions{ElicitationHandler: e.handle}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
}

func TestMCPGatewayElicitation(t *testing.T) {
	for store, newDB := range databases(t) {
		t.Run(store, func(t *testing.T) {
			db := newDB(t)
			mustRun(t, "migrate", "--db", db)
			t.Run("accepted", func(t *testing.T) { elicitAccepted(t, db) })
			t.Run("declined", func(t *testing.T) { elicitDeclined(t, db) })
			t.Run("raced", func(t *testing.T) { elicitRaced(t, db) })
		})
	}
}

func elicitAccepted(t *testing.T, db string) {
	r := newGatewayRig(t, db, e2eApprovalPolicy)
	e := &elicitor{action: "accept", by: "ann"}
	g := r.elicitingGateway(t, e)
	if v := g.session.InitializeResult().ProtocolVersion; v != "2025-11-25" {
		t.Fatalf("negotiated %s, want 2025-11-25", v)
	}
	args := map[string]any{"to": "gus@example.com", "subject": "wire"}
	res := g.call(t, "elicit", 0, "send_message", args)
	if res.IsError {
		t.Fatalf("approved by elicitation: %q\n%s", resultText(res), g.stderr.String())
	}
	if n := e.asked.Load(); n != 1 {
		t.Fatalf("asked %d times, want 1", n)
	}
	key, _ := res.Meta["oncehq.dev/key"].(string)
	if m := e.message(); !strings.Contains(m, "mcp:counter/send_message") || !strings.Contains(m, "gus@example.com") || !strings.Contains(m, key) ||
		!strings.Contains(m, `"subject":"wire"`) {
		t.Errorf("the elicitation does not name the kind, the target, the arguments and the key %s: %q", key, m)
	}
	// The approval is fenced by what the person saw: the arguments.
	if out := mustRun(t, "show", key, "--db", db, "--json"); !strings.Contains(out, "approved") {
		t.Errorf("once show has no approval:\n%s", out)
	}
	if n := r.count(t, "send_message"); n != 1 {
		t.Fatalf("sent %d, want 1", n)
	}
	// The approval was consumed by the call: the next one is a replay,
	// and nobody is asked again.
	again := g.call(t, "elicit", 0, "send_message", args)
	if again.IsError || !replayed(again) || e.asked.Load() != 1 {
		t.Fatalf("the call again: %v %q, asked %d", again.Meta, resultText(again), e.asked.Load())
	}
	if n := r.count(t, "send_message"); n != 1 {
		t.Fatalf("sent %d, want 1", n)
	}
	show := mustRun(t, "show", key, "--db", db)
	if !strings.Contains(show, "approved via mcp") || !strings.Contains(show, "ann") {
		t.Fatalf("once show does not show the approval by ann via mcp:\n%s", show)
	}
}

func elicitDeclined(t *testing.T, db string) {
	r := newGatewayRig(t, db, e2eApprovalPolicy)
	// A person who declines says no: the call is rejected, and every
	// duplicate is told so without asking again. One who dismisses the
	// question (cancel) has not decided: the call still waits.
	for action, want := range map[string]string{"decline": "rejected this call", "cancel": "needs a person's approval"} {
		e := &elicitor{action: action}
		g := r.elicitingGateway(t, e)
		for range 2 {
			res := g.call(t, "elicit-"+action, 0, "send_message", map[string]any{"to": "hal@example.com", "subject": "wire"})
			if !res.IsError || !strings.Contains(resultText(res), want) {
				t.Fatalf("%s: isError %v %q; want %q", action, res.IsError, resultText(res), want)
			}
		}
		if n, want := e.asked.Load(), map[string]int32{"decline": 1, "cancel": 2}[action]; n != want {
			t.Fatalf("%s: asked %d times, want %d", action, n, want)
		}
	}
	if n := r.count(t, "send_message"); n != 0 {
		t.Fatalf("declined calls sent %d", n)
	}
}

func elicitRaced(t *testing.T, db string) {
	r := newGatewayRig(t, db, e2eApprovalPolicy)
	ea, eb := &elicitor{action: "accept", by: "ann"}, &elicitor{action: "accept", by: "bob"}
	a, b := r.elicitingGateway(t, ea), r.elicitingGateway(t, eb)
	args := map[string]any{"to": "ivy@example.com", "subject": "wire", "after_ms": 500}
	out := make(chan *mcp.CallToolResult, 2)
	for _, g := range []*gatewayProc{a, b} {
		go func() { out <- g.call(t, "elicit-race", 0, "send_message", args) }()
	}
	var results []*mcp.CallToolResult
	for range 2 {
		results = append(results, <-out)
	}
	if n := r.count(t, "send_message"); n != 1 {
		t.Fatalf("two approving clients raced: sent %d, want 1", n)
	}
	// One call ran. The other got its result, or (when its wait was
	// spent waiting for the approval) was told the call is still
	// running; called again, it gets the replay.
	var id any
	for i, res := range results {
		g := []*gatewayProc{a, b}[i]
		if res.IsError {
			if !strings.Contains(resultText(res), "still running") {
				t.Fatalf("a racing call: %q\n%s", resultText(res), g.stderr.String())
			}
			continue
		}
		if id == nil {
			id = structured(res)["id"]
		}
		if structured(res)["id"] != id {
			t.Fatalf("the two calls got %v and %v, want the same message", results[0].StructuredContent, results[1].StructuredContent)
		}
	}
	if id == nil {
		t.Fatalf("neither racing call ran: %q / %q", resultText(results[0]), resultText(results[1]))
	}
	for _, g := range []*gatewayProc{a, b} {
		var res *mcp.CallToolResult
		eventually(t, "the replay", func() bool {
			res = g.call(t, "elicit-race", 0, "send_message", args)
			return !res.IsError
		})
		if !replayed(res) || structured(res)["id"] != id {
			t.Fatalf("the call again: %v %v, want the replay of %v", res.Meta, res.StructuredContent, id)
		}
	}
	if n := r.count(t, "send_message"); n != 1 {
		t.Fatalf("sent %d, want 1", n)
	}
	if n := ea.asked.Load() + eb.asked.Load(); n < 1 || n > 2 {
		t.Fatalf("asked %d times, want 1 or 2", n)
	}
}
