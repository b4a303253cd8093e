package mcpgate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// errNotSent says a call never reached the upstream: there was no
// connection and none could be made. Nothing ran, so the call is
// released for a retry rather than left unknown.
var errNotSent = errors.New("the upstream server could not be reached; the call was not sent")

// connectTimeout bounds making a connection to the upstream (starting
// its command or reaching its URL, and initialize): an upstream that
// hangs there holds every call that waits for the connection.
var connectTimeout = 30 * time.Second

// upstream is the gateway's connection to the MCP server it fronts,
// made again when it breaks (an upstream command that exited is started
// again on the next call).
type upstream struct {
	dial   func(ctx context.Context) (mcp.Transport, error)
	client *mcp.Client
	// connecting is held while a connection is made, so one is made at
	// a time; a call waits for it only as long as its own context.
	connecting chan struct{}

	mu      sync.Mutex
	session *mcp.ClientSession
	// closed: the gateway closed; no connection is made again.
	closed bool
}

func newUpstream(dial func(ctx context.Context) (mcp.Transport, error), tools, rest func()) *upstream {
	u := &upstream{dial: dial, connecting: make(chan struct{}, 1)}
	u.client = mcp.NewClient(implementation, &mcp.ClientOptions{
		ToolListChangedHandler:     func(context.Context, *mcp.ToolListChangedRequest) { go tools() },
		PromptListChangedHandler:   func(context.Context, *mcp.PromptListChangedRequest) { go rest() },
		ResourceListChangedHandler: func(context.Context, *mcp.ResourceListChangedRequest) { go rest() },
	})
	return u
}

func (u *upstream) current() *mcp.ClientSession {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.session
}

// live returns the current session, connecting when there is none.
func (u *upstream) live(ctx context.Context) (*mcp.ClientSession, error) {
	if s := u.current(); s != nil {
		return s, nil
	}
	select {
	case u.connecting <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: waiting for the connection: %v", errNotSent, ctx.Err())
	}
	defer func() { <-u.connecting }()
	u.mu.Lock()
	s, closed := u.session, u.closed
	u.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("%w: the gateway has closed", errNotSent)
	}
	if s != nil {
		return s, nil
	}
	cctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	t, err := u.dial(cctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errNotSent, err)
	}
	s, err = u.client.Connect(cctx, t, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errNotSent, err)
	}
	u.mu.Lock()
	u.session = s
	u.mu.Unlock()
	go func() {
		_ = s.Wait()
		u.mu.Lock()
		if u.session == s {
			u.session = nil
		}
		u.mu.Unlock()
	}()
	return s, nil
}

// call sends one tools/call upstream. An HTTP upstream that keeps
// sessions forgets them when it restarts, and answers a call on a
// forgotten one "session not found" before anything runs; but a call
// already under way when its session was lost ends with the same error,
// and may have run, so that error is an unknown outcome. So a session
// is first asked a ping, which has no effect: one the upstream forgot
// is dropped, and the call goes on a new one.
func (u *upstream) call(ctx context.Context, p *mcp.CallToolParams) (*mcp.CallToolResult, error) {
	s, err := u.live(ctx)
	if err != nil {
		return nil, err
	}
	if s.ID() != "" {
		if err := s.Ping(ctx, nil); errors.Is(err, mcp.ErrSessionMissing) {
			u.drop(s)
			if s, err = u.live(ctx); err != nil {
				return nil, err
			}
		}
	}
	return s.CallTool(ctx, p)
}

// drop forgets s, if it is still the current session, and closes it.
func (u *upstream) drop(s *mcp.ClientSession) {
	u.mu.Lock()
	if u.session == s {
		u.session = nil
	}
	u.mu.Unlock()
	_ = s.Close()
}

// tools lists every tool the upstream offers, page by page.
func (u *upstream) tools(ctx context.Context) ([]*mcp.Tool, error) {
	s, err := u.live(ctx)
	if err != nil {
		return nil, err
	}
	var out []*mcp.Tool
	for t, err := range s.Tools(ctx, nil) {
		if err != nil {
			return nil, err
		}
		out = append(out, t)
		if len(out) > maxToolsInFile {
			return nil, fmt.Errorf("the upstream lists over %d tools", maxToolsInFile)
		}
	}
	return out, nil
}

func (u *upstream) close() {
	u.mu.Lock()
	s := u.session
	u.session, u.closed = nil, true
	u.mu.Unlock()
	if s != nil {
		_ = s.Close()
	}
}

// forwardMeta is the call's _meta as the upstream should see it: the
// caller's own members, without the gateway's (which name the run for
// the gateway alone) or the protocol's (which describe the caller's
// connection, not the gateway's; the SDK writes the upstream's own).
func forwardMeta(m mcp.Meta) mcp.Meta {
	var out mcp.Meta
	for k, v := range m {
		if strings.HasPrefix(k, "oncehq.dev/") || strings.HasPrefix(k, "io.modelcontextprotocol/") || k == "progressToken" {
			continue
		}
		if out == nil {
			out = mcp.Meta{}
		}
		out[k] = v
	}
	return out
}
