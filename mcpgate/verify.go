package mcpgate

import (
	"context"
	"encoding/json"
	"fmt"

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
