package mcpgate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/oncehq/once"
)

// Options configure a Gateway.
type Options struct {
	// Store arbitrates the calls' claims. Required.
	Store once.Store
	// Policy is the tool-policy file (ParsePolicy). Required.
	Policy *File
	// Upstream makes a transport to the MCP server the gateway fronts:
	// an mcp.CommandTransport for a command, an
	// mcp.StreamableClientTransport for a URL. It is called again
	// whenever the connection breaks. Required.
	Upstream func(ctx context.Context) (mcp.Transport, error)
	// Run is the run of a call whose caller names none (before the
	// policy's scope).
	Run string
	// ConsoleURL, if set, is where a person approves or resolves an
	// action: the model is given the action's page on it.
	ConsoleURL string
	// Origin names this gateway in every event it writes.
	Origin string
	// MaxCalls bounds the calls running or waiting at once. Zero means
	// 256. A call over it is refused before anything is claimed.
	MaxCalls int
	// MaxResultBytes bounds a stored result. Zero means 1 MiB.
	MaxResultBytes int
	// Progress is how often a call with a progress token is told it is
	// still running or waiting, so that a client's request timeout does
	// not fire. Zero means 5 seconds.
	Progress time.Duration
	// Logger receives the gateway's lines. Nil discards.
	Logger *slog.Logger
}

// Gateway fronts one upstream MCP server: its tools mirrored, each call
// of a tool that is not read-only an intent.
type Gateway struct {
	opts   Options
	policy *File
	up     *upstream
	client *once.Client
	server *mcp.Server
	log    *slog.Logger
	slots  chan struct{}
	calls  sync.WaitGroup
	// closing is set when Close begins: calls that come after it are
	// refused before anything is claimed.
	closing atomic.Bool

	mu        sync.Mutex
	tools     map[string]*mirrored
	prompts   map[string]bool
	resources map[string]bool
	templates map[string]bool
}

// mirrored is one upstream tool as the gateway serves it.
type mirrored struct {
	tool   *mcp.Tool
	policy toolPolicy
	// client claims the tool's calls: the gateway's own for a kind its
	// Config pins, a copy carrying the tool's policy otherwise.
	client *once.Client
	// refused, when set, is why calls of the tool are refused: a tool
	// that appeared after start and needs what only a start can give
	// (a verifier, an approval gate).
	refused string
}

// New connects to the upstream, lists its tools and makes the gateway
// that serves them.
func New(ctx context.Context, opts Options) (*Gateway, error) {
	if opts.Store == nil || opts.Policy == nil || opts.Upstream == nil {
		return nil, errors.New("mcpgate: Store, Policy and Upstream are required")
	}
	if opts.MaxCalls <= 0 {
		opts.MaxCalls = 256
	}
	if opts.MaxResultBytes <= 0 {
		opts.MaxResultBytes = 1 << 20
	}
	if opts.Progress <= 0 {
		opts.Progress = 5 * time.Second
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g := &Gateway{opts: opts, policy: opts.Policy, log: log, slots: make(chan struct{}, opts.MaxCalls), tools: map[string]*mirrored{}}
	g.up = newUpstream(opts.Upstream, coalesce(g.refresh), coalesce(g.refreshRest))
	tools, err := g.up.tools(ctx)
	if err != nil {
		return nil, fmt.Errorf("mcpgate: listing the upstream's tools: %w", err)
	}
	// A policy that names what the upstream does not offer is most
	// likely a typo, whose tool is then claimed by its annotations.
	offered := map[string]bool{}
	readOnly := map[string]bool{}
	for _, t := range tools {
		offered[t.Name] = true
		readOnly[t.Name] = t.Annotations != nil && t.Annotations.ReadOnlyHint
	}
	for name, spec := range g.policy.Tools {
		if !offered[name] {
			log.Warn("once mcp: the policy names a tool the upstream does not offer", "tool", name)
		}
		if spec.Verifier == nil {
			continue
		}
		if !offered[spec.Verifier.Tool] {
			log.Warn("once mcp: a tool's verifier is not a tool the upstream offers; its calls cannot be verified", "tool", name, "verifier", spec.Verifier.Tool)
		} else if vs := g.policy.Tools[spec.Verifier.Tool]; !readOnly[spec.Verifier.Tool] && (vs.ReadOnly == nil || !*vs.ReadOnly) {
			log.Warn("once mcp: a tool's verifier is called unclaimed, and neither the upstream nor the policy says it is read-only", "tool", name, "verifier", spec.Verifier.Tool)
		}
	}
	// Every tool known at start is pinned in the Config: its policy is
	// the file's, whoever else claims the kind.
	kinds := map[string]once.KindPolicy{}
	for _, t := range tools {
		p := g.policy.resolve(t)
		if p.pass {
			continue
		}
		k := p.kind
		if p.verifier != nil {
			k.Verifier = g.verifier(t.Name, p.verifier)
		}
		kinds[g.policy.Kind(t.Name)] = k
	}
	g.client, err = once.New(once.Config{
		Store:          opts.Store,
		Default:        once.KindPolicy{Recovery: once.AskPerson},
		Kinds:          kinds,
		MaxResultBytes: opts.MaxResultBytes,
		Origin:         opts.Origin,
		Logger:         opts.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("mcpgate: %w", err)
	}
	opt := &mcp.ServerOptions{
		Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{ListChanged: true}},
		Instructions: "once mcp: each call of a tool that changes something is performed once; a repeated call gets the first call's result.",
	}
	if s, err := g.up.live(ctx); err == nil {
		if ir := s.InitializeResult(); ir != nil && ir.Capabilities != nil {
			c := ir.Capabilities
			if c.Prompts != nil {
				opt.Capabilities.Prompts = &mcp.PromptCapabilities{ListChanged: true}
			}
			if c.Resources != nil {
				opt.Capabilities.Resources = &mcp.ResourceCapabilities{ListChanged: true}
			}
			if c.Completions != nil {
				opt.Capabilities.Completions = &mcp.CompletionCapabilities{}
				opt.CompletionHandler = g.complete
			}
		}
	}
	g.server = mcp.NewServer(implementation, opt)
	g.mirror(tools)
	if err := g.mirrorRest(ctx); err != nil {
		return nil, fmt.Errorf("mcpgate: %w", err)
	}
	return g, nil
}

// Server is the MCP server the gateway serves downstream: run it over
// stdio (Server.Run with an mcp.StdioTransport) or HTTP
// (mcp.NewStreamableHTTPHandler).
func (g *Gateway) Server() *mcp.Server { return g.server }

// Client is the once client the gateway claims with: a reaper over it
// recovers the calls of a gateway that died.
func (g *Gateway) Client() *once.Client { return g.client }

// Close waits for the calls still running (a caller that left does not
// cancel its call: its outcome is recorded for the re-issued one), up
// to ctx, then closes the upstream.
func (g *Gateway) Close(ctx context.Context) error {
	g.closing.Store(true)
	done := make(chan struct{})
	go func() { g.calls.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = fmt.Errorf("mcpgate: calls still running at close: %w", ctx.Err())
	}
	g.up.close()
	return err
}

// mirror serves tools as the upstream lists them, and drops the ones it
// no longer lists.
func (g *Gateway) mirror(tools []*mcp.Tool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	seen := map[string]bool{}
	for _, t := range tools {
		seen[t.Name] = true
		m := &mirrored{tool: t, policy: g.policy.resolve(t)}
		kind := g.policy.Kind(t.Name)
		switch {
		case m.policy.pass:
		case g.client.Configured(kind):
			m.client = g.client
		case m.policy.pinned:
			m.refused = fmt.Sprintf("tool %s appeared after the gateway started and its policy needs a verifier or an approval gate; restart once mcp to serve it", t.Name)
		default:
			c, err := g.client.Carrying(kind, m.policy.kind)
			if err != nil {
				m.refused = fmt.Sprintf("tool %s: %v", t.Name, err)
			}
			m.client = c
		}
		// The schema and annotations are the upstream's, as it wrote
		// them: the gateway keys calls, it does not change the tool.
		if safely(g, "tool "+t.Name, func() { g.server.AddTool(mirrorOf(t), g.handler(t.Name)) }) {
			g.tools[t.Name] = m
		}
	}
	var gone []string
	for name := range g.tools {
		if !seen[name] {
			gone = append(gone, name)
			delete(g.tools, name)
		}
	}
	if len(gone) > 0 {
		g.server.RemoveTools(gone...)
	}
}

func mirrorOf(t *mcp.Tool) *mcp.Tool {
	c := *t
	if c.InputSchema == nil {
		c.InputSchema = map[string]any{"type": "object"}
	}
	return &c
}

// refresh lists the upstream's tools again when it says they changed.
func (g *Gateway) refresh() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tools, err := g.up.tools(ctx)
	if err != nil {
		g.log.Warn("once mcp: listing the upstream's changed tools", "err", err)
		return
	}
	g.mirror(tools)
}

func (g *Gateway) tool(name string) *mirrored {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.tools[name]
}

// coalesce makes fn, called on each of the upstream's notifications, run
// once at a time: a call while it runs makes it run once more after,
// however many came meanwhile. An upstream that notifies faster than it
// answers has one listing open, not one per notification.
func coalesce(fn func()) func() {
	var mu sync.Mutex
	running, again := false, false
	return func() {
		mu.Lock()
		if running {
			again = true
			mu.Unlock()
			return
		}
		running = true
		mu.Unlock()
		for {
			fn()
			mu.Lock()
			if !again {
				running = false
				mu.Unlock()
				return
			}
			again = false
			mu.Unlock()
		}
	}
}
