package mcpgate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/oncehq/once"
)

// handler serves one mirrored tool's calls.
func (g *Gateway) handler(name string) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		m := g.tool(name)
		if m == nil {
			return says(true, "tool %s is no longer offered by the upstream server. Nothing was sent.", name), nil
		}
		if m.policy.pass {
			res, err := g.up.call(ctx, forwardParams(req.Params, nil))
			return unclaimed(res), err
		}
		if m.refused != "" {
			return says(true, "%s. Nothing was sent.", m.refused), nil
		}
		var h http.Header
		if req.Extra != nil {
			h = req.Extra.Header
		}
		c, err := g.intentOf(name, &m.policy, req.Params, h)
		if err != nil {
			return says(true, "%v", err), nil
		}
		if g.closing.Load() {
			return says(true, "the gateway is shutting down; call again in a few seconds. Nothing was sent."), nil
		}
		select {
		case g.slots <- struct{}{}:
		default:
			return says(true, "the gateway is already running %d calls; call again in a few seconds. Nothing was sent.", cap(g.slots)), nil
		}
		// The call runs on a context of its own: a caller that leaves
		// (its connection closed, its request cancelled) does not
		// cancel an effect under way. Its outcome is recorded, and the
		// re-issued call gets it.
		type answered struct {
			res *mcp.CallToolResult
			err error
		}
		done := make(chan answered, 1)
		g.calls.Add(1)
		go func() {
			defer g.calls.Done()
			defer func() { <-g.slots }()
			res, err := g.perform(context.WithoutCancel(ctx), ctx, m, c, req)
			done <- answered{res, err}
		}()
		var tick <-chan time.Time
		token := req.Params.GetProgressToken()
		if token != nil {
			t := time.NewTicker(g.opts.Progress)
			defer t.Stop()
			tick = t.C
		}
		for n := 1; ; n++ {
			select {
			case a := <-done:
				return a.res, a.err
			case <-tick:
				_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
					ProgressToken: token, Progress: float64(n),
					Message: "once: the call is running or waiting for the same call's outcome",
				})
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
}

// perform claims the call and runs it upstream once, or answers it from
// the store. ctx is the call's own (not cancelled by the caller);
// caller is the caller's, for asking it (an elicitation). The error is
// the upstream's own request of the caller (URL elicitation required),
// passed on as the protocol error it was.
func (g *Gateway) perform(ctx, caller context.Context, m *mirrored, c *call, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	// Until the effect starts, the call is only claiming or waiting (for
	// the same call's outcome, or an approval): a caller that leaves
	// then ends it, and frees its slot. Once the effect starts, nothing
	// the caller does cancels it.
	claim, unclaim := context.WithCancel(ctx)
	defer unclaim()
	var mu sync.Mutex
	started := false
	stop := context.AfterFunc(caller, func() {
		mu.Lock()
		defer mu.Unlock()
		if !started {
			unclaim()
		}
	})
	defer stop()
	var live *mcp.CallToolResult
	// asks is the upstream's answer that the caller must do something
	// first (visit a URL): nothing ran, and the caller's host acts on it.
	var asks *jsonrpc.Error
	fn := func(ctx context.Context, a once.Attempt) (json.RawMessage, error) {
		mu.Lock()
		if err := claim.Err(); err != nil {
			mu.Unlock()
			return nil, once.RetryLater(fmt.Errorf("the caller left before the call was sent: %w", err))
		}
		started = true
		mu.Unlock()
		args := c.args
		if pk := m.policy.providerKey; pk != "" {
			args = make(map[string]json.RawMessage, len(c.args)+1)
			for k, v := range c.args {
				args[k] = v
			}
			b, _ := json.Marshal(a.ProviderKey)
			args[pk] = b
		}
		res, err := g.up.call(ctx, forwardParams(req.Params, args))
		var rpc *jsonrpc.Error
		if errors.As(err, &rpc) && rpc.Code == mcp.CodeURLElicitationRequired {
			// The server asks the user to visit a URL before it
			// processes the call: not an outcome. The call is
			// released, and the caller's host is told.
			asks = rpc
			return nil, once.RetryLater(fmt.Errorf("the upstream asked the user to visit a URL first: %s", rpc.Message))
		}
		if err != nil {
			return nil, classify(err)
		}
		live = res
		if res.NeedsInput() {
			// Not an outcome: the upstream asks the caller for more.
			// The call is released, and the caller's next call (with
			// its answers) claims it again.
			return nil, once.RetryLater(errors.New("the upstream asked for input"))
		}
		if res.IsError && m.policy.onError == onErrorRelease {
			return nil, once.RetryLater(fmt.Errorf("the tool answered isError: %s", textOf(res)))
		}
		b, err := json.Marshal(res)
		if err != nil {
			return nil, err
		}
		return g.keepable(res, b), nil
	}
	wait := []once.DoOption{once.WaitFor(m.policy.wait)}
	// A caller that can be asked is asked now: its first claim answers
	// at once instead of waiting for a decision nobody else may make.
	// Every claim after that waits as the policy says.
	canAsk := canElicit(req)
	first := wait
	if canAsk {
		first = nil
	}
	for tries, asked := 0, false; ; tries++ {
		opts := wait
		if tries == 0 {
			opts = first
		}
		r, err := once.Do(claim, m.client, c.intent, fn, opts...)
		var waiting *once.AwaitingApprovalError
		var inFlight *once.InFlightError
		if canAsk && !asked && errors.As(err, &waiting) && !waiting.Expired {
			asked = true
			if g.elicit(caller, req, c, waiting) {
				// Claim again whatever the approval's own answer was:
				// another caller may have approved it first, and the
				// claim says how the action stands now.
				continue
			}
		}
		if tries == 0 && canAsk && errors.As(err, &inFlight) {
			continue // not asked for an approval: wait as any call would
		}
		if asks != nil && errors.Is(err, once.ErrRetryLater) {
			return nil, asks
		}
		res := g.answer(ctx, r, err, live, c)
		// Every answer names its action, so a program (or a person
		// reading a transcript) can find it in the console.
		if res.Meta == nil {
			res.Meta = mcp.Meta{}
		}
		if _, ok := res.Meta[MetaKey]; !ok {
			key := r.Key
			if key == "" {
				key, _, _ = once.KeyOf(c.intent)
			}
			res.Meta[MetaKey] = string(key)
		}
		return res, nil
	}
}

// classify turns an upstream call's error into what Do records.
func classify(err error) error {
	var rpc *jsonrpc.Error
	switch {
	case errors.Is(err, errNotSent):
		return once.RetryLater(err)
	case errors.As(err, &rpc) && (rpc.Code == jsonrpc.CodeInvalidParams || rpc.Code == jsonrpc.CodeMethodNotFound):
		// The server refused the call as written: it did not run, and
		// the same call would be refused again.
		return once.Permanent(fmt.Errorf("the upstream refused the call: %s", rpc.Message))
	case errors.As(err, &rpc) && (rpc.Code == mcp.CodeMissingRequiredClientCapabilities || rpc.Code == mcp.CodeUnsupportedProtocolVersion):
		// The server will not process the call from this client at all
		// (a capability it lacks, a protocol version it does not speak):
		// nothing ran, and nothing is kept against the call, which runs
		// once the two agree.
		return once.RetryLater(fmt.Errorf("the upstream refused the gateway's protocol: %s", rpc.Message))
	default:
		// Written, and then the connection broke, timed out or the
		// server failed: whether it ran is not known, so the tool's
		// recovery decides.
		return err
	}
}

// forwardParams is the call as the upstream gets it.
func forwardParams(p *mcp.CallToolParamsRaw, args map[string]json.RawMessage) *mcp.CallToolParams {
	out := &mcp.CallToolParams{
		Meta:           forwardMeta(p.Meta),
		Name:           p.Name,
		InputResponses: p.InputResponses,
		RequestState:   p.RequestState,
	}
	if args != nil {
		out.Arguments = args
	} else if len(p.Arguments) > 0 {
		out.Arguments = json.RawMessage(p.Arguments)
	}
	return out
}

// answer is what the model reads: the result, a replay marked as one,
// or, for a call that was not performed, why and what to do, as an
// isError result. Never an opaque error.
func (g *Gateway) answer(ctx context.Context, r once.Result[json.RawMessage], err error, live *mcp.CallToolResult, c *call) *mcp.CallToolResult {
	key := r.Key
	if key == "" {
		key, _, _ = once.KeyOf(c.intent)
	}
	var (
		fp       *once.FingerprintError
		inFlight *once.InFlightError
		review   *once.ReviewError
		failed   *once.FailedError
		unknown  *once.UnknownOutcomeError
		waiting  *once.AwaitingApprovalError
		invalid  *once.IntentError
	)
	switch {
	case err == nil && r.Replayed:
		res := stored(r.Value)
		if res == nil {
			return says(true, "once: the call was already performed (key %s) but its stored result could not be read. Nothing was sent again.", key)
		}
		mark(res, key, r.Attempt, true)
		res.Content = append([]mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(
			"once: this call was already performed (key %s); this is its result, replayed. Nothing was sent again.", key)}}, res.Content...)
		return res
	case err == nil || live != nil && isRecordError(err):
		// The effect ran in this call. A record error means its outcome
		// is not stored yet; the result is still the upstream's.
		res := live
		if res == nil {
			res = stored(r.Value)
		}
		if res == nil {
			return says(true, "once: the call ran (key %s) but its result could not be read.", key)
		}
		mark(res, key, r.Attempt, false)
		return res
	case live != nil && (live.NeedsInput() || live.IsError):
		// Released: the upstream's own answer, for the model to act on.
		mark(live, key, r.Attempt, false)
		return live
	case errors.As(err, &fp):
		res := says(true, "once: a call with the same key arguments (key %s) was already performed with different arguments; this one was not sent.", key)
		if a, gerr := g.client.Get(ctx, key); gerr == nil && a.Status == once.StatusSucceeded {
			if prev := stored(a.Result); prev != nil {
				res.Content = append(res.Content, &mcp.TextContent{Text: "The call already performed answered:"})
				res.Content = append(res.Content, prev.Content...)
				res.StructuredContent = prev.StructuredContent
			}
		}
		mark(res, key, 0, true)
		return res
	case errors.As(err, &inFlight):
		// When it will end is not known: its lease says only how long
		// its claim holds without a heartbeat.
		return says(true, "once: the same call (key %s) is still running; it was not sent again. Call again in a few seconds to get its result.", key)
	case errors.As(err, &review):
		return says(true, "once: the outcome of this call is unknown; a person is checking (key %s%s). Call again after it is resolved: you will get their answer. Nothing was sent again.", key, g.page(key))
	case errors.As(err, &waiting):
		if waiting.Expired {
			return says(true, "once: this call waited for a person's approval past its expiry (key %s); it was not performed.", key)
		}
		return says(true, "once: this call needs a person's approval before it is performed (key %s%s). Call again after approval; it will be performed once.", key, g.page(key))
	case errors.As(err, &failed):
		if failed.RejectedBy != "" {
			return says(true, "once: a person (%s) rejected this call (key %s): %s. It was not performed.", failed.RejectedBy, key, failed.Reason)
		}
		return says(true, "once: this call failed and will not be sent again (key %s): %s", key, failed.Message)
	case errors.As(err, &unknown):
		return says(true, "once: the outcome of this call is unknown (key %s): %v. The tool's recovery decides what happens next; call again later to get the outcome.", key, unknown)
	case errors.As(err, &invalid):
		return says(true, "once: the call cannot be keyed: %v. Nothing was sent.", invalid)
	case live != nil:
		mark(live, key, r.Attempt, false)
		return live
	default:
		var rl interface{ RetryAfter() time.Duration }
		if errors.As(err, &rl) {
			return says(true, "once: the call was not performed (key %s): %v. Call again.", key, err)
		}
		return says(true, "once: the call was not performed (key %s): %v. Call again; it will be performed once.", key, err)
	}
}

// keepable is what the store keeps of a result the tool answered: the
// result itself, or, when the store could not hold it (over
// MaxResultBytes, or nested too deep), a stand-in saying the tool ran.
// The effect happened: stored as it is, the action would go to review,
// and every repeat would be told its outcome is unknown. The caller of
// this call gets the whole result all the same.
func (g *Gateway) keepable(res *mcp.CallToolResult, b []byte) json.RawMessage {
	if len(b) <= g.opts.MaxResultBytes && once.CheckResult(b) == nil {
		return b
	}
	stub := &mcp.CallToolResult{IsError: res.IsError, Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(
		"once: the tool ran; its result (%d bytes) was too large or deep for the gateway to keep (at most %d bytes, %d levels), so only this note was kept.",
		len(b), g.opts.MaxResultBytes, once.MaxResultDepth)}}}
	if res.StructuredContent != nil {
		with := *stub
		with.StructuredContent = res.StructuredContent
		if wb, err := json.Marshal(&with); err == nil && len(wb) <= g.opts.MaxResultBytes && once.CheckResult(wb) == nil {
			return wb
		}
	}
	sb, _ := json.Marshal(stub)
	return sb
}

func isRecordError(err error) bool {
	var rec *once.RecordError
	var fenced *once.FencedError
	return errors.As(err, &rec) || errors.As(err, &fenced) || errors.Is(err, once.ErrResultTooLarge)
}

func (g *Gateway) page(key once.Key) string {
	if g.opts.ConsoleURL == "" {
		return ""
	}
	return "; see " + strings.TrimRight(g.opts.ConsoleURL, "/") + "/actions/" + string(key)
}

// stored decodes a stored result. What the gateway stored is a whole
// tool result; what a person gave when resolving an action (once
// resolve --result) may be any JSON, which the model gets as text and
// as the structured result.
func stored(b json.RawMessage) *mcp.CallToolResult {
	if len(b) == 0 {
		return nil
	}
	var probe map[string]json.RawMessage
	if json.Unmarshal(b, &probe) == nil {
		if _, ok := probe["content"]; ok {
			var res mcp.CallToolResult
			if err := json.Unmarshal(b, &res); err == nil {
				return &res
			}
		}
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return nil
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(b)}}, StructuredContent: v}
}

// mark tells the caller the action's key and whether the result is a
// replay, in _meta, where a program reads it.
func mark(res *mcp.CallToolResult, key once.Key, attempt int, replayed bool) {
	// The protocol's own members describe the upstream's connection
	// (its serverInfo, say), not the gateway's; the SDK writes the
	// gateway's own where none is.
	for k := range res.Meta {
		if strings.HasPrefix(k, "io.modelcontextprotocol/") {
			delete(res.Meta, k)
		}
	}
	unclaimed(res)
	if res.Meta == nil {
		res.Meta = mcp.Meta{}
	}
	res.Meta[MetaKey] = string(key)
	if replayed {
		res.Meta[MetaReplayed] = true
	}
	_ = attempt
}

// unclaimed drops from an upstream's result the members of _meta only
// the gateway may write (MetaReplayed, MetaKey): an upstream that wrote
// them would tell the caller a call that ran was a replay.
func unclaimed(res *mcp.CallToolResult) *mcp.CallToolResult {
	if res == nil {
		return nil
	}
	for k := range res.Meta {
		if strings.HasPrefix(k, "oncehq.dev/") {
			delete(res.Meta, k)
		}
	}
	return res
}

func says(isError bool, format string, a ...any) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: isError, Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(format, a...)}}}
}

// textOf joins a result's text items, cut to what a note may hold.
func textOf(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			if b.Len() > 0 {
				b.WriteString(" ")
			}
			b.WriteString(t.Text)
		}
		if b.Len() > 1024 {
			break
		}
	}
	s := b.String()
	if len(s) > 1024 {
		s = s[:1024]
	}
	return strings.ToValidUTF8(s, "")
}
