package cli_test

import (
	"testing"
	"time"
)

// The elicitation must come when the call is made, not after the
// policy's wait (default 30 s) for a decision nobody else will make.
func TestMCPGatewayElicitationPrompt(t *testing.T) {
	db := t.TempDir() + "/once.db"
	mustRun(t, "migrate", "--db", db)
	// The wait is the longest a policy may give: asked only after it,
	// the call would outlast the test.
	r := newGatewayRig(t, db, `{"server": "counter", "tools": {"send_message": {"key": ["/to"], "wait": "10m", "approval": {"always": true}}}}`)
	e := &elicitor{action: "accept", by: "ann"}
	g := r.elicitingGateway(t, e)
	began := time.Now()
	res := g.call(t, "prompt", 0, "send_message", map[string]any{"to": "jo@example.com", "subject": "s"})
	took := time.Since(began)
	if res.IsError || e.asked.Load() != 1 {
		t.Fatalf("%q asked %d", resultText(res), e.asked.Load())
	}
	if took > 2*time.Minute {
		t.Fatalf("the call took %s: the client was asked only after the policy's wait", took.Round(time.Second))
	}
}
