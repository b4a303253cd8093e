package mcpgate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"

	"github.com/gowebpki/jcs"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/oncehq/once"
)

// The _meta members and headers a caller names its run and step by. The
// prefix is the project's own, as the MCP specification asks of _meta
// keys, so no other party's member is mistaken for ours.
const (
	MetaRun      = "oncehq.dev/run"
	MetaStep     = "oncehq.dev/step"
	MetaReplayed = "oncehq.dev/replayed"
	MetaKey      = "oncehq.dev/key"
	HeaderRun    = "Once-Run"
	HeaderStep   = "Once-Step"
)

// badCall is a call refused before anything is claimed or sent: what
// was wrong and what to do, for the model to read.
type badCall struct{ msg string }

func (e *badCall) Error() string { return e.msg }

func refuse(format string, a ...any) error { return &badCall{fmt.Sprintf(format, a...)} }

// call is one tools/call as the gateway keys it.
type call struct {
	intent once.Intent
	// args are the arguments as sent upstream, the provider key not yet
	// filled in.
	args map[string]json.RawMessage
}

// intentOf keys a call: run and step from the caller, kind from the
// tool, target from the policy's key arguments, the rest of the
// arguments as the payload.
func (g *Gateway) intentOf(tool string, p *toolPolicy, params *mcp.CallToolParamsRaw, h http.Header) (*call, error) {
	raw := bytes.TrimSpace(params.Arguments)
	if len(raw) == 0 || string(raw) == "null" {
		raw = json.RawMessage("{}")
	}
	// The core's canonical form refuses what it could not tell apart
	// (duplicate members, invalid UTF-8, numbers a double cannot hold);
	// ask it before the arguments are taken apart below.
	if _, _, err := once.KeyOf(once.Intent{Run: "r", Kind: "k", Payload: json.RawMessage(raw)}); err != nil {
		return nil, refuse("the arguments of %s are not JSON the gateway can key: %v. Nothing was sent.", tool, err)
	}
	var args map[string]json.RawMessage
	if err := json.Unmarshal(raw, &args); err != nil || args == nil {
		return nil, refuse("the arguments of %s must be a JSON object. Nothing was sent.", tool)
	}
	run, step, err := g.runOf(params.Meta, h)
	if err != nil {
		return nil, err
	}
	in := once.Intent{Run: run, Step: step, Kind: g.policy.Kind(tool)}
	if len(p.key) == 0 {
		in.PayloadInKey = true
	} else {
		vals := make([]json.RawMessage, 0, len(p.key))
		for _, k := range p.key {
			v, ok := k.find(raw)
			if !ok {
				return nil, refuse("argument %s is missing: the gateway keys %s by it (the policy's key). Nothing was sent.", k.text, tool)
			}
			vals = append(vals, v)
		}
		in.Target = targetOf(vals)
	}
	payload := args
	if p.providerKey != "" {
		if _, ok := args[p.providerKey]; ok {
			// The attempt's provider key replaces whatever the model
			// wrote, so a retried call carries the same one.
			payload = make(map[string]json.RawMessage, len(args))
			for k, v := range args {
				if k != p.providerKey {
					payload[k] = v
				}
			}
		}
	}
	b, err := json.Marshal(payload)
	if err != nil {
		return nil, refuse("the arguments of %s: %v. Nothing was sent.", tool, err)
	}
	in.Payload = json.RawMessage(b)
	return &call{intent: in, args: args}, nil
}

// targetOf makes the key arguments' values a target: a single string
// as it is (readable in the console), anything else as canonical JSON
// (RFC 8785), as the fingerprint is: 42 and 42.0, an object's members in
// any order, a string escaped or not, are one value to every JSON reader
// upstream, so one target here.
func targetOf(vals []json.RawMessage) string {
	if len(vals) == 1 {
		// A lone string stands as it is, readable in the console,
		// unless it could be taken for the JSON form below: the string
		// "[42]" and the number 42 are two targets.
		var s string
		if json.Unmarshal(vals[0], &s) == nil && !strings.HasPrefix(s, "[") {
			return s
		}
	}
	var b strings.Builder
	b.WriteByte('[')
	for i, v := range vals {
		if i > 0 {
			b.WriteByte(',')
		}
		// The arguments passed the core's canonical check (intentOf):
		// every value has a canonical form.
		if c, err := jcs.Transform(v); err == nil {
			b.Write(c)
		}
	}
	b.WriteByte(']')
	return b.String()
}

// runOf finds the run and step: the call's _meta, then the HTTP
// request's headers, then the gateway's --run, then the policy's scope.
func (g *Gateway) runOf(meta mcp.Meta, h http.Header) (string, int64, error) {
	var run string
	var step int64
	if v, ok := meta[MetaRun]; ok {
		s, isString := v.(string)
		if !isString || s == "" {
			return "", 0, refuse("_meta %q must be a non-empty string naming the run. Nothing was sent.", MetaRun)
		}
		run = s
	} else if h != nil && h.Get(HeaderRun) != "" {
		run = h.Get(HeaderRun)
	} else if g.opts.Run != "" {
		run = g.opts.Run
	} else if g.policy.Scope != "" {
		run = g.policy.Scope
	} else {
		return "", 0, refuse("this call names no run: set _meta %q (and %q for each call's number), the %s header, once mcp --run, or \"scope\" in the policy file. Nothing was sent.", MetaRun, MetaStep, HeaderRun)
	}
	if v, ok := meta[MetaStep]; ok {
		f, isNumber := v.(float64)
		if !isNumber || f < 0 || f != math.Trunc(f) || f > 1<<53 {
			return "", 0, refuse("_meta %q must be a whole number, 0 or more. Nothing was sent.", MetaStep)
		}
		step = int64(f)
	} else if h != nil && h.Get(HeaderStep) != "" {
		n, err := strconv.ParseInt(h.Get(HeaderStep), 10, 64)
		if err != nil || n < 0 {
			return "", 0, refuse("the %s header must be a whole number, 0 or more. Nothing was sent.", HeaderStep)
		}
		step = n
	}
	return run, step, nil
}
