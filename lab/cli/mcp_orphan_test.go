package cli_test

import (
	"context"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestMCPGatewayKilledTakesItsUpstreamCallWithIt: a gateway SIGKILLed
// while its upstream command holds a call must not leave that call to
// land later. The counter here is stubborn, as many servers are: it
// ignores cancellation and finishes its calls after its stdin closes.
// Left running, the orphan lands after the next gateway's verifier
// found no trace and sent the call again: the effect twice.
func TestMCPGatewayKilledTakesItsUpstreamCallWithIt(t *testing.T) {
	db := t.TempDir() + "/once.db"
	mustRun(t, "migrate", "--db", db)
	r := newGatewayRig(t, db, e2eVerifiedPolicy)
	r.upstreamFlags = []string{"--stubborn"}
	g := r.start(t, "stdio")
	// The effect comes 4 s after the call: after the lease (2 s) lapses
	// and the next gateway's verifier has asked.
	args := map[string]any{"to": "orphan@example.com", "subject": "late", "sleep_ms": 4000}
	go g.session.CallTool(context.Background(), &mcp.CallToolParams{Name: "send_message", Arguments: args,
		Meta: mcp.Meta{"oncehq.dev/run": "orphan", "oncehq.dev/step": 0}})
	eventually(t, "the call at the upstream", func() bool { return r.count(t, "received:send_message") == 1 })
	g.kill(t)
	again := r.start(t, "stdio")
	res := again.call(t, "orphan", 0, "send_message", args)
	if res.IsError {
		t.Fatalf("after the kill: %q", resultText(res))
	}
	// The call sent again has landed, 4 s after it was sent: by then the
	// orphan, had it lived, would have landed too.
	if n := r.count(t, "send_message"); n != 1 {
		t.Fatalf("the upstream sent %d messages, want 1: the killed gateway's call landed after all", n)
	}
}
