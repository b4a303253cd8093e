package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/oncehq/once"
)

// Kinds is a kinds file: the policies a server pins for the kinds its
// protocol clients claim. A client of the protocol cannot change them,
// as a Go worker's Config would: the server applies every rule.
//
//	{
//	  "default": {"lease": "1m", "recovery": "ask_person"},
//	  "kinds": {
//	    "charge_card": {"recovery": "retry_with_provider_key", "max_execution": "2m"},
//	    "send_email":  {"recovery": "verify_then_decide", "verifier": "client"},
//	    "wire_money":  {"approval": {"always": true, "expiry": "24h", "on_expiry": "review"}}
//	  }
//	}
//
// Durations are Go's ("90s", "5m", "24h"). "verifier": "client" makes a
// client of the protocol the kind's verifier (Verifiers); it is the only
// verifier a file can name, and verify_then_decide needs it.
type Kinds struct {
	Default *KindSpec           `json:"default,omitempty"`
	Kinds   map[string]KindSpec `json:"kinds,omitempty"`
}

// KindSpec is one kind's policy in a kinds file.
type KindSpec struct {
	Lease             string `json:"lease,omitempty"`
	MaxExecution      string `json:"max_execution,omitempty"`
	Retention         string `json:"retention,omitempty"`
	Recovery          string `json:"recovery,omitempty"`
	Verifier          string `json:"verifier,omitempty"`
	MaxVerifyFailures int    `json:"max_verify_failures,omitempty"`
	VerifyBackoff     string `json:"verify_backoff,omitempty"`
	// RedriveAfter is refused: a re-drive calls KindPolicy.Redrive, a
	// Go function a kinds file cannot give, so once serve would never
	// re-drive.
	RedriveAfter string        `json:"redrive_after,omitempty"`
	Approval     *ApprovalSpec `json:"approval,omitempty"`
}

// ApprovalSpec is a kind's approval gate in a kinds file: every action
// of the kind waits for a person (a When is Go's alone).
type ApprovalSpec struct {
	Always   bool   `json:"always"`
	Expiry   string `json:"expiry,omitempty"`
	OnExpiry string `json:"on_expiry,omitempty"`
}

// Bounds of a kinds file.
const (
	MaxKindsFile   = 1 << 20
	maxKindsInFile = 10000
)

// ParseKinds reads a kinds file into the policies of a once.Config:
// Default and Kinds. Kinds verified by clients get v's verifier (v may
// be nil when none is). Every mistake is refused, naming the kind and
// the field: an unknown field, a duration that is not one, a recovery
// that is not, a verifier with nothing to verify.
func ParseKinds(r io.Reader, v *Verifiers) (def once.KindPolicy, kinds map[string]once.KindPolicy, err error) {
	raw, err := io.ReadAll(io.LimitReader(r, MaxKindsFile+1))
	if err != nil {
		return def, nil, err
	}
	if len(raw) > MaxKindsFile {
		return def, nil, fmt.Errorf("the kinds file is over %d bytes", MaxKindsFile)
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.DisallowUnknownFields()
	var f Kinds
	if err := d.Decode(&f); err != nil {
		return def, nil, fmt.Errorf("the kinds file is not the JSON it takes%s: %w", lineOf(raw, d.InputOffset()), err)
	}
	if _, err := d.Token(); err != io.EOF {
		return def, nil, errors.New("the kinds file has text after its JSON object")
	}
	if err := exact(raw); err != nil {
		return def, nil, err
	}
	if len(f.Kinds) > maxKindsInFile {
		return def, nil, fmt.Errorf("the kinds file names %d kinds; at most %d", len(f.Kinds), maxKindsInFile)
	}
	if f.Default != nil {
		if f.Default.Verifier != "" {
			return def, nil, errors.New(`default: "verifier" is for a named kind: a client verifier takes questions of the kinds it names`)
		}
		if def, err = f.Default.policy("", v); err != nil {
			return def, nil, fmt.Errorf("default: %w", err)
		}
	}
	names := make([]string, 0, len(f.Kinds))
	for k := range f.Kinds {
		names = append(names, k)
	}
	sort.Strings(names)
	kinds = make(map[string]once.KindPolicy, len(names))
	for _, k := range names {
		if strings.TrimSpace(k) == "" || len(k) > 128 || strings.ContainsFunc(k, func(r rune) bool { return r < ' ' || r == 0x7f }) {
			return def, nil, fmt.Errorf("kind %.40q: a kind's name is 1 to 128 printable bytes", k)
		}
		p, err := f.Kinds[k].policy(k, v)
		if err != nil {
			return def, nil, fmt.Errorf("kind %q: %w", k, err)
		}
		kinds[k] = p
	}
	return def, kinds, nil
}

func (s KindSpec) policy(kind string, v *Verifiers) (once.KindPolicy, error) {
	var p once.KindPolicy
	durations := []struct {
		name string
		in   string
		out  *time.Duration
	}{
		{"lease", s.Lease, &p.Lease}, {"max_execution", s.MaxExecution, &p.MaxExecution}, {"retention", s.Retention, &p.Retention},
		{"verify_backoff", s.VerifyBackoff, &p.VerifyBackoff},
	}
	if s.Approval != nil {
		durations = append(durations, struct {
			name string
			in   string
			out  *time.Duration
		}{"approval.expiry", s.Approval.Expiry, &p.Approval.Expiry})
	}
	for _, d := range durations {
		if d.in == "" {
			continue
		}
		got, err := time.ParseDuration(d.in)
		if err != nil || got <= 0 {
			return p, fmt.Errorf("%s is %.40q; give a positive duration such as \"90s\", \"5m\" or \"24h\"", d.name, d.in)
		}
		*d.out = got
	}
	if s.Recovery != "" {
		p.Recovery = once.ParseRecovery(s.Recovery)
		if p.Recovery == once.RecoveryDefault {
			return p, fmt.Errorf("recovery is %.40q; it is one of ask_person, retry_with_provider_key, verify_then_decide", s.Recovery)
		}
	}
	switch {
	case s.Verifier != "" && s.Verifier != "client":
		return p, fmt.Errorf(`verifier is %.40q; the only verifier a kinds file names is "client" (a client of the protocol, docs/protocol.md)`, s.Verifier)
	case s.Verifier == "client" && p.Recovery != once.VerifyThenDecide:
		return p, errors.New(`verifier "client" asks a verifier that nothing would ask: set "recovery": "verify_then_decide"`)
	case p.Recovery == once.VerifyThenDecide && s.Verifier == "":
		return p, errors.New(`verify_then_decide needs a verifier: set "verifier": "client", and run one (POST /v1/verify/take)`)
	case s.Verifier == "client" && v == nil:
		return p, errors.New(`verifier "client" needs the server to serve client verifiers`)
	case s.Verifier == "client":
		p.Verifier = v.For(kind)
	}
	if s.MaxVerifyFailures < 0 {
		return p, fmt.Errorf("max_verify_failures is %d; give 1 or more, or leave it out for the default", s.MaxVerifyFailures)
	}
	p.MaxVerifyFailures = s.MaxVerifyFailures
	if a := s.Approval; a != nil {
		if !a.Always {
			return p, errors.New(`approval: set "always": true (an approval that asks for some actions only is Go's When), or leave approval out`)
		}
		p.Approval.Always = true
		switch a.OnExpiry {
		case "":
		case "failed":
			p.Approval.OnExpiry = once.StatusFailed
		case "review":
			p.Approval.OnExpiry = once.StatusReview
		default:
			return p, fmt.Errorf("approval.on_expiry is %.40q; it is failed or review", a.OnExpiry)
		}
	}
	return p, nil
}

// shape is the names a kinds file's object takes: fields, exactly
// spelt, with the shape of each's value; or any name (each), a kind's.
type shape struct {
	fields map[string]*shape
	each   *shape
}

var (
	approvalShape = &shape{fields: map[string]*shape{"always": nil, "expiry": nil, "on_expiry": nil}}
	specShape     = &shape{fields: map[string]*shape{"lease": nil, "max_execution": nil, "retention": nil, "recovery": nil, "verifier": nil,
		"max_verify_failures": nil, "verify_backoff": nil, "redrive_after": nil, "approval": approvalShape}}
	fileShape = &shape{fields: map[string]*shape{"default": specShape, "kinds": {each: specShape}}}
)

// exact refuses what encoding/json takes silently from raw, a kinds
// file it decoded: a name given twice (the last would win), a field's
// name in another case (it matches any), null (taken as nothing), and
// redrive_after, which once serve cannot honour. Each is named with its
// line.
func exact(raw []byte) error {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	return exactValue(d, raw, "", fileShape)
}

func exactValue(d *json.Decoder, raw []byte, path string, sh *shape) error {
	tok, err := d.Token()
	if err != nil {
		return fmt.Errorf("the kinds file is not the JSON it takes%s: %w", lineOf(raw, d.InputOffset()), err)
	}
	at := func() string {
		return "line " + strings.TrimSuffix(strings.TrimPrefix(lineOf(raw, d.InputOffset()), " (line "), ")")
	}
	switch tok {
	case nil:
		if path == "" {
			return fmt.Errorf("%s: the kinds file is null; give an object: {\"default\": {...}, \"kinds\": {...}}", at())
		}
		return fmt.Errorf("%s: %s is null; give its value, or leave it out", at(), path)
	case json.Delim('['):
		for d.More() {
			if err := exactValue(d, raw, path+"[]", nil); err != nil {
				return err
			}
		}
		_, err := d.Token()
		return err
	case json.Delim('{'):
	default:
		return nil
	}
	in := ""
	if path != "" {
		in = path + ": "
	}
	seen := map[string]bool{}
	for d.More() {
		tok, err := d.Token()
		if err != nil {
			return err
		}
		name, _ := tok.(string)
		if seen[name] {
			return fmt.Errorf("%s: %s%q is given twice; only its last would count: give it once", at(), in, name)
		}
		seen[name] = true
		var next *shape
		switch {
		case sh == nil:
		case sh.each != nil:
			next = sh.each
		default:
			c, ok := sh.fields[name]
			if !ok {
				for f := range sh.fields {
					if strings.EqualFold(f, name) {
						return fmt.Errorf("%s: %s%q is not a field; names are exact: write %q", at(), in, name, f)
					}
				}
			}
			if name == "redrive_after" {
				return fmt.Errorf("%s: %sredrive_after re-drives through KindPolicy.Redrive, a Go function a kinds file cannot give, so once serve cannot honour it: leave it out (a released action waits for its next delivery)", at(), in)
			}
			next = c
		}
		sub := name
		if path != "" {
			sub = path + "." + name
		}
		if err := exactValue(d, raw, sub, next); err != nil {
			return err
		}
	}
	_, err = d.Token()
	return err
}

// lineOf is " (line N)" for offset in raw.
func lineOf(raw []byte, offset int64) string {
	if offset <= 0 || offset > int64(len(raw)) {
		return ""
	}
	return fmt.Sprintf(" (line %d)", bytes.Count(raw[:offset], []byte("\n"))+1)
}
