package mcpgate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/oncehq/once"
	"github.com/oncehq/once/protocol"
)

// File is a tool-policy file: how the gateway keys and recovers each
// tool of one upstream server.
//
//	{
//	  "server": "mail",
//	  "scope": "acme-support",
//	  "trust_annotations": true,
//	  "tools": {
//	    "send_message": {"key": ["/to"], "recovery": "verify_then_decide",
//	                     "verifier": {"tool": "find_message",
//	                                  "arguments": {"to": "/to", "subject": "/subject"},
//	                                  "landed": "/found"}},
//	    "charge":       {"key": ["/customer"], "provider_key": "idempotency_key"},
//	    "wire":         {"approval": {"always": true, "expiry": "1h"}},
//	    "search":       {"read_only": true}
//	  }
//	}
//
// A tool the file does not name takes "default", then its annotations:
// read-only passes through unclaimed when the file trusts the server's
// annotations; idempotent is retried with the provider key; anything
// else asks a person. Annotations are hints a server gives about itself,
// so they only ever supply defaults.
type File struct {
	// Server names the upstream in every kind: mcp:<server>/<tool>.
	// Required, so that two upstreams' tools of one name are two kinds.
	Server string `json:"server"`
	// Scope is the run of a call whose caller names none. The key then
	// means "once per key arguments within retention": the same email to
	// the same recipient a month later is a replay, not a second send.
	Scope string `json:"scope,omitempty"`
	// TrustAnnotations lets a tool annotated read-only pass through
	// unclaimed when the file does not say otherwise.
	TrustAnnotations bool                `json:"trust_annotations,omitempty"`
	Default          *ToolSpec           `json:"default,omitempty"`
	Tools            map[string]ToolSpec `json:"tools,omitempty"`
}

// ToolSpec is one tool's policy.
type ToolSpec struct {
	// Key are JSON pointers (RFC 6901) into the arguments whose values
	// are the action's target: "/to" for an email. The rest of the
	// arguments are the fingerprint, so a reworded email to the same
	// recipient is refused as a changed duplicate. With no key, the
	// whole arguments are in the key: identical arguments are one action.
	Key []string `json:"key,omitempty"`
	// ReadOnly passes the tool through unclaimed (true), or claims it
	// whatever its annotations say (false).
	ReadOnly *bool `json:"read_only,omitempty"`
	// Recovery is what a call whose gateway died does next:
	// ask_person, retry_with_provider_key or verify_then_decide.
	Recovery string `json:"recovery,omitempty"`
	// ProviderKey names the top-level argument the gateway fills with
	// the attempt's provider key (the same on every attempt), for a tool
	// that honours one. It is left out of the fingerprint. Naming one
	// makes retry_with_provider_key the default recovery.
	ProviderKey string `json:"provider_key,omitempty"`
	// Verifier is the read-only upstream tool verify_then_decide asks.
	Verifier     *VerifierSpec `json:"verifier,omitempty"`
	Lease        string        `json:"lease,omitempty"`
	MaxExecution string        `json:"max_execution,omitempty"`
	Retention    string        `json:"retention,omitempty"`
	// Wait is how long a duplicate of a call still running waits for
	// its outcome before it is told when to call again.
	Wait     string        `json:"wait,omitempty"`
	Approval *ApprovalSpec `json:"approval,omitempty"`
	// OnError is what a result with isError true records: "succeed" (the
	// default: the tool ran and told the model, and a retry replays it)
	// or "release" (nothing happened; a retry runs the tool again).
	OnError           string `json:"on_error,omitempty"`
	MaxVerifyFailures int    `json:"max_verify_failures,omitempty"`
	VerifyBackoff     string `json:"verify_backoff,omitempty"`
}

// VerifierSpec names the upstream tool that tells whether a call landed.
type VerifierSpec struct {
	Tool string `json:"tool"`
	// Arguments maps each of the verifier's arguments to a JSON pointer
	// into the verified call's arguments, or to "$provider_key".
	Arguments map[string]string `json:"arguments,omitempty"`
	// Landed is a JSON pointer into the verifier's structured result
	// whose value true means the call landed and false that it did not.
	// Anything else, or a result with isError, is "cannot tell".
	Landed string `json:"landed"`
}

// ApprovalSpec makes every call of a tool wait for a person: the
// approval gate of a kinds file, written the same way.
type ApprovalSpec = protocol.ApprovalSpec

// Bounds of a policy file and of what it names.
const (
	MaxPolicyFile   = 1 << 20
	maxToolsInFile  = 10000
	maxKeyPointers  = 16
	maxNameBytes    = 128
	defaultWait     = 30 * time.Second
	maxWait         = 10 * time.Minute
	onErrorSucceed  = "succeed"
	onErrorRelease  = "release"
	providerKeyWord = "$provider_key"
)

// ParsePolicy reads a tool-policy file. Every mistake is refused, naming
// the tool and the field, before the gateway starts: a policy read
// wrongly would claim, or fail to claim, real side effects.
func ParsePolicy(r io.Reader) (*File, error) {
	raw, err := io.ReadAll(io.LimitReader(r, MaxPolicyFile+1))
	if err != nil {
		return nil, err
	}
	if len(raw) > MaxPolicyFile {
		return nil, fmt.Errorf("the policy file is over %d bytes", MaxPolicyFile)
	}
	if err := noDuplicateNames(raw); err != nil {
		return nil, err
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.DisallowUnknownFields()
	var f File
	if err := d.Decode(&f); err != nil {
		return nil, fmt.Errorf("the policy file: %w", err)
	}
	if d.More() {
		return nil, errors.New("the policy file: more than one JSON value")
	}
	if f.Server == "" {
		return nil, errors.New(`the policy file: "server" is required: it names the upstream in each kind (mcp:<server>/<tool>)`)
	}
	if len(f.Server) > maxNameBytes || strings.ContainsAny(f.Server, "/\x00") {
		return nil, fmt.Errorf(`the policy file: "server" %q must be at most %d bytes, with no "/"`, f.Server, maxNameBytes)
	}
	if len(f.Tools) > maxToolsInFile {
		return nil, fmt.Errorf("the policy file names %d tools; at most %d", len(f.Tools), maxToolsInFile)
	}
	if f.Default != nil {
		if err := f.Default.check("default", true); err != nil {
			return nil, err
		}
	}
	names := make([]string, 0, len(f.Tools))
	for name := range f.Tools {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if name == "" || len(name) > maxNameBytes {
			return nil, fmt.Errorf("the policy file: tool name %q must be 1 to %d bytes", name, maxNameBytes)
		}
		s := f.Tools[name]
		if err := s.check("tool "+name, false); err != nil {
			return nil, err
		}
		// The verifier is called upstream unclaimed, whenever a call is
		// checked: it must not be the tool itself, nor one the file says
		// has effects.
		if v := s.Verifier; v != nil {
			if v.Tool == name {
				return nil, fmt.Errorf("the policy file: tool %s: \"verifier\" is the tool itself: asking it whether a call landed would perform the call again; name a read-only tool", name)
			}
			if vs, ok := f.Tools[v.Tool]; ok && vs.ReadOnly != nil && !*vs.ReadOnly {
				return nil, fmt.Errorf("the policy file: tool %s: \"verifier\" %s is read_only false in this file: a verifier is called unclaimed, so it must have no effects", name, v.Tool)
			}
		}
	}
	return &f, nil
}

// noDuplicateNames refuses a file that names a tool twice: JSON
// decoding would keep the last and drop the first without a word.
func noDuplicateNames(raw []byte) error {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil {
		return fmt.Errorf("the policy file: %w", err)
	}
	tools, ok := top["tools"]
	if !ok {
		return nil
	}
	d := json.NewDecoder(bytes.NewReader(tools))
	if t, err := d.Token(); err != nil || t != json.Delim('{') {
		return errors.New(`the policy file: "tools" must be an object of tool names`)
	}
	seen := map[string]bool{}
	for d.More() {
		t, err := d.Token()
		if err != nil {
			return fmt.Errorf("the policy file: %w", err)
		}
		name, _ := t.(string)
		if seen[name] {
			return fmt.Errorf("the policy file names tool %q twice", name)
		}
		seen[name] = true
		var skip json.RawMessage
		if err := d.Decode(&skip); err != nil {
			return fmt.Errorf("the policy file: %w", err)
		}
	}
	return nil
}

func (s ToolSpec) check(where string, isDefault bool) error {
	bad := func(field, format string, a ...any) error {
		return fmt.Errorf("the policy file: %s: %q %s", where, field, fmt.Sprintf(format, a...))
	}
	if len(s.Key) > maxKeyPointers {
		return bad("key", "has %d pointers; at most %d", len(s.Key), maxKeyPointers)
	}
	if isDefault && len(s.Key) > 0 {
		return bad("key", "is a tool's own: each tool's arguments differ")
	}
	for _, p := range s.Key {
		ptr, err := parsePointer(p)
		if err != nil {
			return bad("key", "%v", err)
		}
		if len(ptr.tokens) == 0 {
			return bad("key", `"" names the whole arguments; leave "key" out to key the call by its whole arguments`)
		}
		if s.ProviderKey != "" && ptr.tokens[0] == s.ProviderKey {
			// The gateway writes that argument: keyed by what the model
			// wrote there, a retry that wrote another would be a new
			// action with a new provider key.
			return bad("key", "%s points into provider_key %q, which the gateway fills; key the call by the arguments the model writes", p, s.ProviderKey)
		}
	}
	for _, d := range []struct{ field, v string }{
		{"lease", s.Lease}, {"max_execution", s.MaxExecution}, {"retention", s.Retention},
		{"wait", s.Wait}, {"verify_backoff", s.VerifyBackoff},
	} {
		if d.v == "" {
			continue
		}
		v, err := time.ParseDuration(d.v)
		if err != nil || v <= 0 {
			return bad(d.field, "must be a positive duration such as 90s or 5m, not %q", d.v)
		}
		if d.field == "wait" && v > maxWait {
			return bad(d.field, "is over %s: a caller waiting that long has given up", maxWait)
		}
	}
	switch s.Recovery {
	case "", "ask_person", "retry_with_provider_key":
	case "verify_then_decide":
		if s.Verifier == nil {
			return bad("recovery", "verify_then_decide needs a \"verifier\": the read-only tool to ask")
		}
	default:
		return bad("recovery", "must be ask_person, retry_with_provider_key or verify_then_decide, not %q", s.Recovery)
	}
	if s.Verifier != nil {
		if isDefault {
			return bad("verifier", "is a tool's own: each verifier's arguments differ")
		}
		if s.Recovery != "verify_then_decide" {
			return bad("verifier", "is asked only with recovery verify_then_decide")
		}
		if s.Verifier.Tool == "" {
			return bad("verifier", "needs \"tool\": the read-only upstream tool to ask")
		}
		if _, err := parsePointer(s.Verifier.Landed); err != nil || s.Verifier.Landed == "" {
			return bad("verifier", "needs \"landed\": a JSON pointer into its structured result, such as /found")
		}
		for arg, p := range s.Verifier.Arguments {
			if p == providerKeyWord {
				continue
			}
			ptr, err := parsePointer(p)
			if err != nil {
				return bad("verifier", "argument %q: %v", arg, err)
			}
			if s.ProviderKey != "" && len(ptr.tokens) > 0 && ptr.tokens[0] == s.ProviderKey {
				return bad("verifier", "argument %q points into provider_key %q, which the stored arguments leave out; give %q", arg, s.ProviderKey, providerKeyWord)
			}
		}
	}
	if s.ProviderKey != "" && (len(s.ProviderKey) > maxNameBytes || strings.HasPrefix(s.ProviderKey, "/")) {
		return bad("provider_key", "names a top-level argument (idempotency_key), not a pointer, at most %d bytes", maxNameBytes)
	}
	if s.ReadOnly != nil && *s.ReadOnly && (s.Recovery != "" || s.ProviderKey != "" || s.Approval != nil || len(s.Key) > 0) {
		return bad("read_only", "passes the tool through unclaimed; drop key, recovery, provider_key and approval, or read_only")
	}
	switch s.OnError {
	case "", onErrorSucceed, onErrorRelease:
	default:
		return bad("on_error", "must be succeed or release, not %q", s.OnError)
	}
	if s.MaxVerifyFailures < 0 {
		return bad("max_verify_failures", "must not be negative")
	}
	if a := s.Approval; a != nil {
		if !a.Always {
			return bad("approval", `needs "always": true (a file cannot say which calls wait)`)
		}
		if a.Expiry != "" {
			if v, err := time.ParseDuration(a.Expiry); err != nil || v <= 0 {
				return bad("approval", "expiry must be a positive duration, not %q", a.Expiry)
			}
		}
		switch a.OnExpiry {
		case "", "failed", "review":
		default:
			return bad("approval", "on_expiry must be failed or review, not %q", a.OnExpiry)
		}
	}
	return nil
}

// toolPolicy is a tool's policy resolved: the file's word first, then
// the default's, then the annotations'.
type toolPolicy struct {
	pass        bool
	key         []pointer
	providerKey string
	onError     string
	wait        time.Duration
	kind        once.KindPolicy
	verifier    *VerifierSpec
	// pinned says the policy needs this process (a verifier or an
	// approval): the kind goes in the Client's Config, not carried.
	pinned bool
}

// resolve works out a tool's policy from the file and the tool's
// annotations.
func (f *File) resolve(t *mcp.Tool) toolPolicy {
	var def ToolSpec
	if f.Default != nil {
		def = *f.Default
	}
	s, named := f.Tools[t.Name]
	pick := func(a, b string) string {
		if a != "" {
			return a
		}
		return b
	}
	var p toolPolicy
	ann := t.Annotations
	readOnly := s.ReadOnly
	if readOnly == nil && !named {
		readOnly = def.ReadOnly
	}
	switch {
	case readOnly != nil:
		p.pass = *readOnly
	case f.TrustAnnotations && ann != nil && ann.ReadOnlyHint && !named:
		p.pass = true
	}
	if p.pass {
		return p
	}
	for _, k := range s.Key {
		ptr, _ := parsePointer(k) // checked by ParsePolicy
		p.key = append(p.key, ptr)
	}
	p.providerKey = s.ProviderKey
	p.onError = pick(s.OnError, pick(def.OnError, onErrorSucceed))
	p.wait = duration(pick(s.Wait, def.Wait), defaultWait)
	rec := pick(s.Recovery, "")
	if rec == "" && p.providerKey != "" {
		rec = "retry_with_provider_key"
	}
	rec = pick(rec, def.Recovery)
	if rec == "" {
		// Only a tool that says its repeats have no further effect is
		// retried by default; a hint cannot make anything riskier.
		if ann != nil && ann.IdempotentHint && !ann.ReadOnlyHint {
			rec = "retry_with_provider_key"
		} else {
			rec = "ask_person"
		}
	}
	p.kind = once.KindPolicy{
		Lease:             duration(pick(s.Lease, def.Lease), 0),
		MaxExecution:      duration(pick(s.MaxExecution, def.MaxExecution), 0),
		Retention:         duration(pick(s.Retention, def.Retention), 0),
		Recovery:          once.ParseRecovery(rec),
		MaxVerifyFailures: s.MaxVerifyFailures,
		VerifyBackoff:     duration(s.VerifyBackoff, 0),
	}
	if p.kind.MaxVerifyFailures == 0 {
		p.kind.MaxVerifyFailures = def.MaxVerifyFailures
	}
	a := s.Approval
	if a == nil {
		a = def.Approval
	}
	if a != nil {
		p.kind.Approval = once.ApprovalPolicy{Always: true, Expiry: duration(a.Expiry, 0)}
		switch a.OnExpiry {
		case "review":
			p.kind.Approval.OnExpiry = once.StatusReview
		case "failed":
			p.kind.Approval.OnExpiry = once.StatusFailed
		}
		p.pinned = true
	}
	if rec == "verify_then_decide" {
		p.verifier = s.Verifier
		p.pinned = true
	}
	return p
}

func duration(s string, def time.Duration) time.Duration {
	if s == "" {
		return def
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return def
	}
	return d
}

// Kind is the kind of a tool's calls: mcp:<server>/<tool>.
func (f *File) Kind(tool string) string { return "mcp:" + f.Server + "/" + tool }
