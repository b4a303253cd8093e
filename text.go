package once

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxTextBytes bounds every message once stores: an effect's or a
// verifier's error, a panic's text, an event's note. Longer ones are cut
// and say so.
const MaxTextBytes = 8 << 10

// MaxResultDepth bounds how deeply a stored result may nest. SQLite's
// JSON functions refuse more than 1000 levels, and a result that deep is
// not an id a duplicate needs back.
const MaxResultDepth = 500

// storable makes s a text every store can hold: valid UTF-8 (invalid
// bytes become U+FFFD), no NUL (PostgreSQL refuses it; it becomes
// U+FFFD too), at most MaxTextBytes, cut at a rune boundary with a note
// of how long it was.
func storable(s string) string {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 && len(s) <= MaxTextBytes {
		return s
	}
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
	if len(s) <= MaxTextBytes {
		return s
	}
	note := fmt.Sprintf("… (truncated; %d bytes in all)", len(s))
	cut := MaxTextBytes - len(note)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + note
}

// storableTransition makes every text t writes storable.
func storableTransition(t Transition) Transition {
	t.Error = storable(t.Error)
	t.ResolvedBy = storable(t.ResolvedBy)
	t.ResolveNote = storable(t.ResolveNote)
	t.Event = storableEvent(t.Event)
	return t
}

func storableEvent(e Event) Event {
	e.Note = storable(e.Note)
	e.Actor = storable(e.Actor)
	e.Origin = storable(e.Origin)
	return e
}

// checkResult reports why raw cannot be stored as a result, or nil: it
// must be JSON, valid UTF-8 with no raw NUL, and nested at most
// MaxResultDepth deep. The error matches ErrResultNotJSON.
// CheckResult says whether raw can be stored as a result: valid UTF-8
// JSON nesting no deeper than MaxResultDepth. A server that stores
// results it did not make (once mcp keeps a tool's answer) checks with
// it before it chooses what to keep; the size bound is its own.
func CheckResult(raw []byte) error { return checkResult(raw) }

func checkResult(raw []byte) error {
	if why := resultProblem(raw); why != "" {
		return fmt.Errorf("%w: the result %s", ErrResultNotJSON, why)
	}
	return nil
}

// resultProblem says what is wrong with raw as a stored result ("is not
// valid JSON"), or "".
func resultProblem(raw []byte) string {
	if !utf8.Valid(raw) || bytes.IndexByte(raw, 0) >= 0 {
		return "is not valid UTF-8 text"
	}
	if !json.Valid(raw) {
		return "is not valid JSON"
	}
	// raw is valid JSON: outside strings, every bracket opens or
	// closes an array or object.
	depth, inString := 0, false
	for i := 0; i < len(raw); i++ {
		switch c := raw[i]; {
		case inString:
			switch c {
			case '\\':
				i++
			case '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '[' || c == '{':
			depth++
			if depth > MaxResultDepth {
				return fmt.Sprintf("nests deeper than %d levels; return a smaller value (an id, not a document)", MaxResultDepth)
			}
		case c == ']' || c == '}':
			depth--
		}
	}
	return ""
}
