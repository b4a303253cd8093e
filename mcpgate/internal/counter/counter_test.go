package counter_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/oncehq/once/mcpgate/internal/counter"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// counterBin builds the command once per test binary.
func counterBin(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "counter-bin")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "counter")
		out, err := exec.Command("go", "build", "-o", binPath, "./cmd/counter").CombinedOutput()
		if err != nil {
			buildErr = errors.New(string(out))
		}
	})
	if buildErr != nil {
		t.Fatalf("build counter: %v", buildErr)
	}
	return binPath
}

func connectStdio(t *testing.T, effects string) *mcp.ClientSession {
	t.Helper()
	cmd := exec.Command(counterBin(t), "--effects", effects)
	cmd.Stderr = os.Stderr
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "0"}, nil)
	cs, err := c.Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// startHTTP starts the command on a free loopback port and returns its URL.
func startHTTP(t *testing.T, effects string, extra ...string) (string, *exec.Cmd) {
	t.Helper()
	cmd := exec.Command(counterBin(t), append([]string{"--effects", effects, "--http", "127.0.0.1:0"}, extra...)...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	url, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("read URL: %v", err)
	}
	return strings.TrimSpace(url), cmd
}

func call(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	return res
}

func wantCount(t *testing.T, effects, tool string, want int) {
	t.Helper()
	n, err := counter.Count(effects, tool)
	if err != nil {
		t.Fatal(err)
	}
	if n != want {
		t.Errorf("Count(%s) = %d, want %d", tool, n, want)
	}
}

func structured(t *testing.T, res *mcp.CallToolResult, v any) {
	t.Helper()
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("structured content %s: %v", b, err)
	}
}

// exercise calls every tool once or more and checks the counts.
func exercise(t *testing.T, cs *mcp.ClientSession, effects string) {
	lt, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ann := map[string]*mcp.ToolAnnotations{}
	for _, tool := range lt.Tools {
		ann[tool.Name] = tool.Annotations
	}
	if a := ann["send_message"]; a == nil || a.DestructiveHint == nil || !*a.DestructiveHint || a.IdempotentHint || a.ReadOnlyHint {
		t.Errorf("send_message annotations = %+v", a)
	}
	if a := ann["charge"]; a == nil || !a.IdempotentHint {
		t.Errorf("charge annotations = %+v", a)
	}
	if a := ann["find_message"]; a == nil || !a.ReadOnlyHint {
		t.Errorf("find_message annotations = %+v", a)
	}

	msg := map[string]any{"to": "ann@example.com", "subject": "hello", "body": "hi"}
	res := call(t, cs, "send_message", msg)
	if res.IsError || res.Content[0].(*mcp.TextContent).Text != "sent to ann@example.com" {
		t.Errorf("send_message = %+v", res)
	}
	var sent counter.Sent
	structured(t, res, &sent)
	if sent.ID == "" {
		t.Error("send_message gave no id")
	}
	call(t, cs, "send_message", msg)
	wantCount(t, effects, "send_message", 2)

	var found counter.Found
	structured(t, call(t, cs, "find_message", map[string]any{"to": "ann@example.com", "subject": "hello"}), &found)
	if !found.Found {
		t.Error("find_message did not find the message sent")
	}
	structured(t, call(t, cs, "find_message", map[string]any{"to": "bob@example.com", "subject": "hello"}), &found)
	if found.Found {
		t.Error("find_message found a message never sent")
	}

	var first, again, other counter.Charged
	structured(t, call(t, cs, "charge", map[string]any{"customer": "c1", "amount": 500, "idempotency_key": "k1"}), &first)
	structured(t, call(t, cs, "charge", map[string]any{"customer": "c1", "amount": 500, "idempotency_key": "k1"}), &again)
	if first != again {
		t.Errorf("repeated charge = %+v, first was %+v", again, first)
	}
	structured(t, call(t, cs, "charge", map[string]any{"customer": "c1", "amount": 500, "idempotency_key": "k2"}), &other)
	if other.ID == first.ID {
		t.Error("a new key returned the old charge")
	}
	wantCount(t, effects, "charge", 2)

	if res := call(t, cs, "fail_tool", nil); !res.IsError {
		t.Errorf("fail_tool = %+v, want isError", res)
	}
	wantCount(t, effects, "fail_tool", 0)

	var counts counter.Counts
	structured(t, call(t, cs, "list_effects", nil), &counts)
	if counts.Counts["send_message"] != 2 || counts.Counts["charge"] != 2 {
		t.Errorf("list_effects = %v", counts.Counts)
	}

	// An unknown tool is a JSON-RPC error, not a tool error.
	_, err = cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "nope"})
	var rpcErr *jsonrpc.Error
	if !errors.As(err, &rpcErr) || rpcErr.Code != jsonrpc.CodeInvalidParams {
		t.Errorf("unknown tool: err = %#v, want a *jsonrpc.Error with code %d", err, jsonrpc.CodeInvalidParams)
	}
}

func TestStdio(t *testing.T) {
	effects := filepath.Join(t.TempDir(), "effects.jsonl")
	exercise(t, connectStdio(t, effects), effects)
}

func TestHTTP(t *testing.T) {
	for _, mode := range []string{"stateless", "stateful"} {
		t.Run(mode, func(t *testing.T) {
			effects := filepath.Join(t.TempDir(), "effects.jsonl")
			var extra []string
			if mode == "stateful" {
				extra = append(extra, "--stateful")
			}
			url, _ := startHTTP(t, effects, extra...)
			c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "0"}, nil)
			cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()
			exercise(t, cs, effects)
		})
	}
}

// TestCancelledBeforeEffect shows that a call cancelled during sleep_ms
// has no effect: the client's context ends, the SDK sends
// notifications/cancelled, and the handler's context is cancelled.
func TestCancelledBeforeEffect(t *testing.T) {
	effects := filepath.Join(t.TempDir(), "effects.jsonl")
	cs := connectStdio(t, effects)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "send_message", Arguments: map[string]any{"to": "a", "subject": "s", "sleep_ms": 1500}})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want deadline exceeded", err)
	}
	time.Sleep(1700 * time.Millisecond)
	wantCount(t, effects, "send_message", 0)
}

// TestKilledAfterEffect kills the server during after_ms: the effect is
// on disk, and the caller gets an error, not a result. The error has no
// one shape: over stdio it wraps io.EOF; over HTTP it may wrap a
// *jsonrpc.Error that no server sent (code -32005, "rejected by
// transport"), or be a plain string from the SSE stream's retries. So
// transportFailure works the other way round: any error but a real
// JSON-RPC answer is a transport failure.
func TestKilledAfterEffect(t *testing.T) {
	for _, mode := range []string{"stdio", "http"} {
		t.Run(mode, func(t *testing.T) {
			effects := filepath.Join(t.TempDir(), "effects.jsonl")
			var (
				cmd *exec.Cmd
				tr  mcp.Transport
			)
			if mode == "stdio" {
				cmd = exec.Command(counterBin(t), "--effects", effects)
				tr = &mcp.CommandTransport{Command: cmd}
			} else {
				var url string
				url, cmd = startHTTP(t, effects, "--stateful")
				tr = &mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1}
			}
			c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "0"}, nil)
			cs, err := c.Connect(context.Background(), tr, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()
			go func() {
				time.Sleep(400 * time.Millisecond)
				cmd.Process.Signal(syscall.SIGKILL)
			}()
			_, err = cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "send_message", Arguments: map[string]any{"to": "a", "subject": "s", "after_ms": 5000}})
			if !transportFailure(err) {
				t.Errorf("err = %#v, want a transport failure", err)
			}
			t.Logf("CallTool after SIGKILL: %v", err)
			wantCount(t, effects, "send_message", 1)
		})
	}
}

// transportFailure tells a broken connection from an answer. The SDK
// makes its own failures *jsonrpc.Error with codes -32003 (client
// closing), -32004 (server closing) and -32005 (rejected by transport);
// those are not answers.
func transportFailure(err error) bool {
	if err == nil {
		return false
	}
	var rpcErr *jsonrpc.Error
	if errors.As(err, &rpcErr) {
		return rpcErr.Code >= -32005 && rpcErr.Code <= -32003
	}
	return true
}
