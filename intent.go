package once

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Limits on the fields of an intent. They keep keys and rows a sane size
// and match what every store can index.
const (
	// MaxIDBytes bounds Run and Kind.
	MaxIDBytes = 255
	// MaxTargetBytes bounds Target (an address, a customer id, a channel).
	MaxTargetBytes = 1024
	// DefaultMaxPayloadBytes bounds the canonical payload unless
	// Config.MaxPayloadBytes says otherwise.
	DefaultMaxPayloadBytes = 1 << 20
)

// Intent is what the caller means to do: one external effect, named so
// that the same intent presented again is recognised.
//
// Run, Step, Kind and Target form the key. The Payload is fingerprinted
// beside it: a later attempt of the same key whose payload differs is
// refused with a *FingerprintError, because an agent that regenerates an
// email body on retry must not send a second, different email. Set
// PayloadInKey to fold the payload into the key instead, for callers with
// no stable step identity; then a changed payload is a new action.
type Intent struct {
	// Run identifies the job, agent run or request the effect belongs to.
	// Required; at most 255 bytes of valid UTF-8.
	Run string
	// Step numbers the effect within its run (0, 1, 2…). Must not be
	// negative. Run.Step numbers steps for you.
	Step int64
	// Kind names the kind of action ("send_email", "charge_card"). It
	// selects the kind policy: lease, execution time, recovery. Required;
	// at most 255 bytes.
	Kind string
	// Target is who or what the effect is aimed at: a recipient, a
	// customer, a channel. Optional; at most 1024 bytes.
	Target string
	// Payload is the exact content of the effect. []byte is raw bytes,
	// taken and hashed as they are. json.RawMessage (JSON text) and any
	// other value (encoded with encoding/json) are JSON, hashed in the
	// canonical form of RFC 8785, so equal JSON values hash equal: key
	// order, whitespace, escapes and number notation (100, 100.0, 1e2) do
	// not matter. Raw bytes and JSON are tagged apart: []byte(`"hi"`) and
	// "hi" are different payloads. JSON that canonical form could not keep
	// apart from another payload is refused: invalid UTF-8 (in the text or
	// in any string of the value), duplicate object keys, and numbers an
	// IEEE-754 double cannot hold as written. Optional; nil is an empty
	// payload, the same as an empty []byte. KEYS.md has the details.
	Payload any
	// PayloadInKey folds the payload's fingerprint into the key.
	PayloadInKey bool
}

// validate checks the intent and returns its key, its fingerprint and,
// when keep is set, its canonical payload. Every check runs before any
// I/O, so bad input never claims, executes or writes.
func (in Intent) validate(maxPayload int, keep bool) ([]byte, Key, Fingerprint, error) {
	if err := checkText("Run", in.Run, MaxIDBytes, true); err != nil {
		return nil, "", "", err
	}
	if in.Step < 0 {
		return nil, "", "", &IntentError{Field: "Step", Reason: fmt.Sprintf("is %d; steps are numbered from 0", in.Step)}
	}
	if err := checkText("Kind", in.Kind, MaxIDBytes, true); err != nil {
		return nil, "", "", err
	}
	if err := checkText("Target", in.Target, MaxTargetBytes, false); err != nil {
		return nil, "", "", err
	}
	return keyOf(in, maxPayload, keep)
}

func checkText(field, s string, max int, required bool) error {
	switch {
	case required && s == "":
		return &IntentError{Field: field, Reason: "is empty; it is required"}
	case len(s) > max:
		return &IntentError{Field: field, Reason: fmt.Sprintf("is %d bytes, over the limit of %d", len(s), max)}
	case !utf8.ValidString(s):
		return &IntentError{Field: field, Reason: "is not valid UTF-8"}
	case strings.IndexByte(s, 0) >= 0:
		// PostgreSQL text cannot hold NUL; refuse it everywhere so every
		// store accepts the same intents.
		return &IntentError{Field: field, Reason: "contains a NUL byte"}
	}
	return nil
}
