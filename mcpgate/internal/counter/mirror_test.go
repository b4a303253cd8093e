package counter_test

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestMirror shows how a gateway built on the Go SDK can serve another
// server's tools unchanged: the low-level Server.AddTool takes the
// listed Tool as it is, schemas as untyped JSON, and its handler gets
// the arguments raw. Nothing is validated on the way, so the
// upstream's own answers, errors included, reach the host.
func TestMirror(t *testing.T) {
	ctx := context.Background()
	effects := filepath.Join(t.TempDir(), "effects.jsonl")
	up := connectStdio(t, effects)
	lt, err := up.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}

	mirror := mcp.NewServer(&mcp.Implementation{Name: "mirror", Version: "0"}, nil)
	for _, tool := range lt.Tools {
		mirror.AddTool(tool, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return up.CallTool(ctx, &mcp.CallToolParams{Name: req.Params.Name, Arguments: req.Params.Arguments})
		})
	}
	st, ct := mcp.NewInMemoryTransports()
	if _, err := mirror.Connect(ctx, st, nil); err != nil {
		t.Fatal(err)
	}
	host, err := mcp.NewClient(&mcp.Implementation{Name: "host", Version: "0"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()

	mt, err := host.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := mustJSON(t, lt.Tools), mustJSON(t, mt.Tools); a != b {
		t.Errorf("mirrored tools differ:\nupstream %s\nmirror   %s", a, b)
	}

	res, err := host.CallTool(ctx, &mcp.CallToolParams{Name: "send_message", Arguments: map[string]any{"to": "a", "subject": "s"}})
	if err != nil || res.IsError {
		t.Fatalf("send_message through the mirror: %+v, %v", res, err)
	}
	wantCount(t, effects, "send_message", 1)

	if res, err := host.CallTool(ctx, &mcp.CallToolParams{Name: "fail_tool"}); err != nil || !res.IsError {
		t.Errorf("fail_tool through the mirror: %+v, %v", res, err)
	}
	// Arguments the upstream's schema rejects are a tool error, isError,
	// made by the upstream: the mirror checked nothing.
	res, err = host.CallTool(ctx, &mcp.CallToolParams{Name: "send_message", Arguments: map[string]any{"to": 1}})
	if err != nil || !res.IsError {
		t.Errorf("bad arguments through the mirror: %+v, %v", res, err)
	}
	// A JSON-RPC error from the upstream keeps its code through the
	// mirror, but the client wraps it ("calling \"tools/call\": ...") and
	// the wrapped text becomes the message; unwrap to pass it on as sent.
	forward := func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		res, err := up.CallTool(ctx, &mcp.CallToolParams{Name: req.Params.Name, Arguments: req.Params.Arguments})
		var rpcErr *jsonrpc.Error
		if errors.As(err, &rpcErr) {
			return nil, rpcErr
		}
		return res, err
	}
	mirror.AddTool(&mcp.Tool{Name: "ghost", InputSchema: json.RawMessage(`{"type":"object"}`)}, forward)
	_, err = host.CallTool(ctx, &mcp.CallToolParams{Name: "ghost"})
	var rpcErr *jsonrpc.Error
	if !errors.As(err, &rpcErr) || rpcErr.Code != jsonrpc.CodeInvalidParams || rpcErr.Message != `unknown tool "ghost"` {
		t.Errorf("upstream's JSON-RPC error through the mirror: %#v", err)
	}
	wantCount(t, effects, "send_message", 1)
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
