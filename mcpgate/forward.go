package mcpgate

import (
	"context"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Everything but tools/call passes through: the upstream's prompts,
// resources and resource templates are served as the upstream lists
// them, read from it on each request, and listed again when it says
// they changed. Only a tool call is an effect worth claiming.

// maxMirrored bounds what one list may hold, so an upstream cannot make
// the gateway hold without limit.
const maxMirrored = 10000

// mirrorRest lists the upstream's prompts, resources and templates and
// serves them. An upstream that offers none is not asked.
func (g *Gateway) mirrorRest(ctx context.Context) error {
	s, err := g.up.live(ctx)
	if err != nil {
		return err
	}
	caps := s.InitializeResult()
	var hasPrompts, hasResources bool
	if caps != nil && caps.Capabilities != nil {
		hasPrompts = caps.Capabilities.Prompts != nil
		hasResources = caps.Capabilities.Resources != nil
	}
	if hasPrompts {
		if err := g.mirrorPrompts(ctx, s); err != nil {
			return err
		}
	}
	if hasResources {
		if err := g.mirrorResources(ctx, s); err != nil {
			return err
		}
	}
	return nil
}

func (g *Gateway) mirrorPrompts(ctx context.Context, s *mcp.ClientSession) error {
	var names []string
	seen := map[string]bool{}
	for p, err := range s.Prompts(ctx, nil) {
		if err != nil {
			return fmt.Errorf("listing the upstream's prompts: %w", err)
		}
		if len(names) >= maxMirrored {
			return fmt.Errorf("the upstream lists over %d prompts", maxMirrored)
		}
		names = append(names, p.Name)
		seen[p.Name] = true
		safely(g, "prompt "+p.Name, func() {
			g.server.AddPrompt(p, func(ctx context.Context, req *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
				up, err := g.up.live(ctx)
				if err != nil {
					return nil, err
				}
				return up.GetPrompt(ctx, req.Params)
			})
		})
	}
	g.mu.Lock()
	var gone []string
	for name := range g.prompts {
		if !seen[name] {
			gone = append(gone, name)
		}
	}
	g.prompts = seen
	g.mu.Unlock()
	if len(gone) > 0 {
		g.server.RemovePrompts(gone...)
	}
	return nil
}

func (g *Gateway) mirrorResources(ctx context.Context, s *mcp.ClientSession) error {
	read := func(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		up, err := g.up.live(ctx)
		if err != nil {
			return nil, err
		}
		return up.ReadResource(ctx, req.Params)
	}
	seen := map[string]bool{}
	n := 0
	for r, err := range s.Resources(ctx, nil) {
		if err != nil {
			return fmt.Errorf("listing the upstream's resources: %w", err)
		}
		if n++; n > maxMirrored {
			return fmt.Errorf("the upstream lists over %d resources", maxMirrored)
		}
		seen[r.URI] = true
		safely(g, "resource "+r.URI, func() { g.server.AddResource(r, read) })
	}
	seenT := map[string]bool{}
	for rt, err := range s.ResourceTemplates(ctx, nil) {
		if err != nil {
			return fmt.Errorf("listing the upstream's resource templates: %w", err)
		}
		if n++; n > maxMirrored {
			return fmt.Errorf("the upstream lists over %d resources", maxMirrored)
		}
		seenT[rt.URITemplate] = true
		safely(g, "resource template "+rt.URITemplate, func() { g.server.AddResourceTemplate(rt, read) })
	}
	g.mu.Lock()
	var gone, goneT []string
	for u := range g.resources {
		if !seen[u] {
			gone = append(gone, u)
		}
	}
	for u := range g.templates {
		if !seenT[u] {
			goneT = append(goneT, u)
		}
	}
	g.resources, g.templates = seen, seenT
	g.mu.Unlock()
	if len(gone) > 0 {
		g.server.RemoveResources(gone...)
	}
	if len(goneT) > 0 {
		g.server.RemoveResourceTemplates(goneT...)
	}
	return nil
}

// complete forwards a completion request.
func (g *Gateway) complete(ctx context.Context, req *mcp.CompleteRequest) (*mcp.CompleteResult, error) {
	up, err := g.up.live(ctx)
	if err != nil {
		return nil, err
	}
	return up.Complete(ctx, req.Params)
}

// refreshRest lists the prompts and resources again on the upstream's
// word that they changed.
func (g *Gateway) refreshRest() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := g.mirrorRest(ctx); err != nil {
		g.log.Warn("once mcp: listing the upstream's changed prompts or resources", "err", err)
	}
}

// safely adds what an upstream listed: the SDK panics on what it finds
// malformed (a tool's schema that is not an object, say), and one bad
// entry must not take the gateway down or hide the rest.
func safely(g *Gateway, what string, add func()) (ok bool) {
	defer func() {
		if r := recover(); r != nil {
			g.log.Warn("once mcp: not serving the upstream's "+what, "err", r)
			ok = false
		}
	}()
	add()
	return true
}
