package mcpgate

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/oncehq/once"
)

// verifier asks the configured read-only upstream tool whether a call
// whose gateway died landed: its arguments are taken from the call's
// stored arguments by pointer, and the answer from its structured
// result. Anything but a plain true or false is "cannot tell", asked
// again later, and after the kind's MaxVerifyFailures put up for review.
func (g *Gateway) verifier(tool string, v *VerifierSpec) once.Verifier {
	landed, _ := parsePointer(v.Landed)
	return func(ctx context.Context, a once.Action) (bool, json.RawMessage, error) {
		args := map[string]json.RawMessage{}
		for name, p := range v.Arguments {
			if p == providerKeyWord {
				b, _ := json.Marshal(string(a.Key))
				args[name] = b
				continue
			}
			ptr, _ := parsePointer(p)
			val, ok := ptr.find(a.Payload)
			if !ok {
				return false, nil, fmt.Errorf("the call's arguments have no %s for verifier %s", p, v.Tool)
			}
			args[name] = val
		}
		res, err := g.up.call(ctx, &mcp.CallToolParams{Name: v.Tool, Arguments: args})
		if err != nil {
			return false, nil, fmt.Errorf("verifier %s: %w", v.Tool, err)
		}
		if res.IsError {
			return false, nil, fmt.Errorf("verifier %s answered isError: %s", v.Tool, textOf(res))
		}
		sc, err := json.Marshal(res.StructuredContent)
		if err != nil {
			return false, nil, err
		}
		// Only true or false decides: a null (which would decode into a
		// bool as false), a string or a number is "cannot tell".
		val, ok := landed.find(sc)
		var answer any
		if ok && json.Unmarshal(val, &answer) != nil {
			ok = false
		}
		yes, isBool := answer.(bool)
		if !ok || !isBool {
			return false, nil, fmt.Errorf("verifier %s's result has no true or false at %s", v.Tool, v.Landed)
		}
		if !yes {
			return false, nil, nil
		}
		// What the call would have answered is lost with its gateway;
		// the stored result says so, with the verifier's finding.
		out := &mcp.CallToolResult{
			Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(
				"%s was performed; its own answer was lost, and %s confirmed it landed.", tool, v.Tool)}},
			StructuredContent: res.StructuredContent,
		}
		b, err := json.Marshal(out)
		return true, b, err
	}
}

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
