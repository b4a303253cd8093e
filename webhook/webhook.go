// Package webhook is the contract of the webhook `once serve` sends when
// an action starts to wait for a person's approval: the body (Delivery),
// and the signature a receiver checks before it trusts one (Sign and
// Verify).
//
// The signature is made as Stripe's and GitHub's are: an HMAC-SHA256,
// keyed by a secret the sender and the receiver share, over the
// timestamp, a dot and the body, sent in the Once-Signature header as
//
//	Once-Signature: t=1700000000,v1=5257a869e7ecebeda32affa62cdca3fa51cad7e77a0e56ff536d0ce8e108d8bd
//
// The timestamp is signed with the body, so a receiver that refuses old
// timestamps refuses a captured request replayed later. A header may
// carry several v1 values (a sender signing with an old and a new secret
// while it is rotated); one that matches is enough.
//
// The package uses only the standard library, so a receiver in Go can
// import it without the rest of once.
package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Header is the request header that carries the signature.
const Header = "Once-Signature"

// DeliveryHeader carries Delivery.ID for logs and routing. The
// signature does not cover it: a receiver dedupes by the id in the body
// it verified, never by this header, which anyone on the path can change.
const DeliveryHeader = "Once-Delivery"

// DefaultTolerance is how far a signature's timestamp may be from the
// receiver's clock when Verify is given no tolerance: long enough for a
// slow request and some clock skew, short enough that a captured request
// is soon worthless.
const DefaultTolerance = 5 * time.Minute

// MaxHeaderBytes bounds the header Verify parses: a signature is under
// 100 bytes, and a longer header is refused unread.
const MaxHeaderBytes = 1024

// maxSignatures bounds the v1 values Verify compares, so a header cannot
// make it compute without end.
const maxSignatures = 8

// Errors Verify returns, each wrapped with what was wrong.
var (
	// ErrMalformed: the header is missing, too long, or not of the form
	// t=<unix seconds>,v1=<hex>.
	ErrMalformed = errors.New("webhook: malformed " + Header + " header")
	// ErrTimestamp: the signed timestamp is further from now than the
	// tolerance allows: an old request replayed, or a clock far off.
	ErrTimestamp = errors.New("webhook: signature timestamp outside the tolerance")
	// ErrMismatch: no signature in the header matches the body and the
	// secret: a forged or altered request, or another secret.
	ErrMismatch = errors.New("webhook: no signature matches")
	// ErrNoSecret: Verify was given an empty secret, which would accept
	// a signature anyone can make.
	ErrNoSecret = errors.New("webhook: empty secret")
)

// Sign returns the Once-Signature header value for body sent at t:
// "t=<unix seconds>,v1=<hex HMAC-SHA256 of secret over "<t>.<body>">".
func Sign(secret []byte, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac(secret, ts, body))
}

func mac(secret []byte, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// Verify checks that header (the Once-Signature value) signs body with
// secret at a time within tolerance of now; zero tolerance means
// DefaultTolerance. Pass the body exactly as it was read, before any
// decoding: a byte changed is a mismatch. The signatures are compared in
// constant time. The error wraps ErrMalformed, ErrTimestamp, ErrMismatch
// or ErrNoSecret.
func Verify(secret []byte, header string, body []byte, now time.Time, tolerance time.Duration) error {
	if len(secret) == 0 {
		return fmt.Errorf("%w: give the secret the sender signs with", ErrNoSecret)
	}
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	if len(header) > MaxHeaderBytes {
		return fmt.Errorf("%w: %d bytes, over %d", ErrMalformed, len(header), MaxHeaderBytes)
	}
	var ts string
	var sigs [][]byte
	for part := range strings.SplitSeq(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		switch {
		case !ok:
			return fmt.Errorf("%w: %q is not key=value", ErrMalformed, part)
		case k == "t":
			if ts != "" {
				return fmt.Errorf("%w: more than one t=", ErrMalformed)
			}
			ts = v
		case k == "v1":
			sig, err := hex.DecodeString(v)
			if err != nil || len(sig) != sha256.Size {
				return fmt.Errorf("%w: v1 is not %d hex digits", ErrMalformed, 2*sha256.Size)
			}
			if len(sigs) == maxSignatures {
				return fmt.Errorf("%w: more than %d v1 signatures", ErrMalformed, maxSignatures)
			}
			sigs = append(sigs, sig)
		}
		// Other keys are for schemes a later sender may add; they sign
		// nothing this version checks.
	}
	if ts == "" || len(sigs) == 0 {
		return fmt.Errorf("%w: want t=<unix seconds>,v1=<hex>", ErrMalformed)
	}
	unix, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || strconv.FormatInt(unix, 10) != ts {
		return fmt.Errorf("%w: t=%q is not a time in unix seconds", ErrMalformed, ts)
	}
	signed := time.Unix(unix, 0)
	if d := now.Sub(signed); d > tolerance || d < -tolerance {
		return fmt.Errorf("%w: signed at %s, %v from now, over %v", ErrTimestamp, signed.UTC().Format(time.RFC3339), d.Round(time.Second), tolerance)
	}
	want := mac(secret, ts, body)
	matched := false
	for _, sig := range sigs {
		// Every value is compared, so the time taken does not say which
		// matched.
		if hmac.Equal(want, sig) {
			matched = true
		}
	}
	if !matched {
		return fmt.Errorf("%w: the body or the secret is not the one signed", ErrMismatch)
	}
	return nil
}

// TypeAwaitingApproval is Delivery.Type for an action that waits for a
// person's approval.
const TypeAwaitingApproval = "awaiting_approval"

// Delivery is the JSON body of a webhook request: an action that waits
// for a person's approval. Times are RFC 3339, UTC.
type Delivery struct {
	// ID names this notice: the action's key, its attempt and when its
	// wait began. A sender that restarts sends again the notices it may
	// have sent, with the same ID; a receiver that keeps the IDs it has
	// seen tells a person once.
	ID   string `json:"id"`
	Type string `json:"type"`
	Key  string `json:"key"`
	Kind string `json:"kind"`
	// Target, Run and Step are the intent's.
	Target string `json:"target"`
	Run    string `json:"run"`
	Step   int64  `json:"step"`
	// Attempt, Fingerprint and Since are what a decision sent back
	// through the console's API names, so that it applies to this wait
	// and payload only (once.Approval).
	Attempt     int    `json:"attempt"`
	Fingerprint string `json:"fingerprint"`
	// Since is when the wait began; Expires, when an answer stops being
	// taken, and OnExpiry what the action becomes then: "failed" or
	// "review".
	Since    time.Time `json:"since"`
	Expires  time.Time `json:"expires"`
	OnExpiry string    `json:"on_expiry"`
	// Payload is the action's payload when it is JSON and short enough;
	// a longer one is cut to a preview, shown as PayloadText (or
	// PayloadBase64, if not text), and PayloadCut says how many bytes
	// were left out. The console shows it whole.
	Payload       json.RawMessage `json:"payload,omitempty"`
	PayloadText   string          `json:"payload_text,omitempty"`
	PayloadBase64 []byte          `json:"payload_base64,omitempty"`
	PayloadCut    int             `json:"payload_cut,omitempty"`
	// URL is the action's page in the console, where a person approves
	// or rejects it; absent when the sender knows no public address.
	URL string `json:"url,omitempty"`
}
