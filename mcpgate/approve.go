package mcpgate

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/oncehq/once"
)

// elicit asks the caller for the approval a call waits for, when the
// caller declared it can be asked (form elicitation). It reports whether
// the caller decided (approved or declined, recorded as the approval
// gate's decision); the call then claims again, and runs once or is
// told of the rejection. Without elicitation, or dismissed, the call is
// answered with where a person approves it.
func (g *Gateway) elicit(ctx context.Context, req *mcp.CallToolRequest, c *call, w *once.AwaitingApprovalError) bool {
	if !canElicit(req) {
		return false
	}
	// The person approves what will run: the arguments are shown, and
	// the decision is fenced by their fingerprint, so it cannot apply to
	// other arguments under the same key.
	_, fp, _ := once.KeyOf(c.intent)
	raw, _ := c.intent.Payload.(json.RawMessage)
	shown := string(raw)
	if len(shown) > maxShownArguments {
		shown = strings.ToValidUTF8(shown[:maxShownArguments], "") + "…"
	}
	res, err := req.Session.Elicit(ctx, &mcp.ElicitParams{
		Message: fmt.Sprintf("Approve %s for %s with the arguments %s? It will be performed once (key %s).", c.intent.Kind, c.intent.Target, shown, w.Key),
		RequestedSchema: map[string]any{
			"type": "object",
			"properties": map[string]any{
				"by": map[string]any{"type": "string", "description": "who approves"},
			},
			"required": []string{"by"},
		},
	})
	if err != nil {
		return false
	}
	switch res.Action {
	case "accept":
	case "decline":
		// The person said no: the call fails without running, and
		// every duplicate is told so. (Cancel dismissed the question
		// and decides nothing.)
		if _, err := g.client.Reject(ctx, w.Key, once.Approval{By: "mcp client", Note: "declined when the MCP client asked", Attempt: w.Attempt, Fingerprint: fp, Since: w.Since, Via: "mcp"}); err != nil {
			g.log.Info("once mcp: a rejection given by elicitation was not recorded", "key", w.Key, "err", err)
		}
		return true
	default:
		return false
	}
	by, _ := res.Content["by"].(string)
	if by == "" {
		by = "mcp client"
	}
	if _, err := g.client.Approve(ctx, w.Key, once.Approval{By: by, Attempt: w.Attempt, Fingerprint: fp, Since: w.Since, Via: "mcp"}); err != nil {
		g.log.Info("once mcp: an approval given by elicitation was not recorded", "key", w.Key, "err", err)
	}
	return true
}

// maxShownArguments bounds the arguments an elicitation shows.
const maxShownArguments = 2000

// canElicit says whether the caller declared that it can be asked
// (elicitation, protocol 2025-11-25 on a session of its own).
func canElicit(req *mcp.CallToolRequest) bool {
	if req.Session == nil {
		return false
	}
	ip := req.Session.InitializeParams()
	return ip != nil && ip.Capabilities != nil && ip.Capabilities.Elicitation != nil
}
