package once

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"strconv"
)

// Key identifies one intended action. It is the lowercase hex SHA-256 of an
// unambiguous encoding of the intent, so the same intent presented twice —
// by a redelivered job, a restarted agent, another machine — gets the same
// key, and two different intents never share one.
type Key string

// Fingerprint is the lowercase hex SHA-256 of an intent's canonical payload.
// It is stored beside the key so that a retry which changed the payload is
// refused instead of silently replaying (or re-running) a different action.
type Fingerprint string

// Domain tags keep the two hashes apart and let the encoding evolve: a
// future v2 encoding can never collide with a v1 key.
const (
	keyDomain     = "once.key.v1"
	payloadDomain = "once.payload.v1"
)

// KeyOf returns the key and payload fingerprint of an intent, or an
// *IntentError if the intent is not valid. It is a pure function: no clock,
// no randomness, no I/O.
func KeyOf(in Intent) (Key, Fingerprint, error) {
	payload, err := in.validate(DefaultMaxPayloadBytes)
	if err != nil {
		return "", "", err
	}
	k, fp := keyOf(in, payload)
	return k, fp, nil
}

// keyOf hashes a validated intent whose payload is already canonical.
func keyOf(in Intent, payload []byte) (Key, Fingerprint) {
	fsum := sha256.New()
	writeField(fsum, []byte(payloadDomain))
	writeField(fsum, payload)
	fp := Fingerprint(hex.EncodeToString(fsum.Sum(nil)))

	ksum := sha256.New()
	writeField(ksum, []byte(keyDomain))
	writeField(ksum, []byte(in.Run))
	writeField(ksum, []byte(strconv.FormatInt(in.Step, 10)))
	writeField(ksum, []byte(in.Kind))
	writeField(ksum, []byte(in.Target))
	if in.PayloadInKey {
		writeField(ksum, []byte(fp))
	} else {
		// A distinct marker, so that folding the payload in can never
		// produce the same key as leaving it out.
		writeField(ksum, nil)
	}
	return Key(hex.EncodeToString(ksum.Sum(nil))), fp
}

// writeField writes an 8-byte big-endian length and then the bytes. The
// length prefix is what makes the encoding unambiguous: "a b"+"c" and
// "a"+"b c" have different lengths in first position.
func writeField(h hash.Hash, b []byte) {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(b)))
	h.Write(n[:])
	h.Write(b)
}

// canonicalPayload returns the bytes a payload is fingerprinted (and
// stored) as. Raw bytes ([]byte) are taken as they are. Anything else is
// encoded as JSON and re-encoded with object keys sorted, so two payloads
// that are equal as JSON values hash equal regardless of field order or
// whitespace. Numbers keep their literal text. A nil payload is empty.
func canonicalPayload(p any) ([]byte, error) {
	var raw []byte
	switch v := p.(type) {
	case nil:
		return nil, nil
	case json.RawMessage:
		raw = v
	case []byte:
		return v, nil
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("payload cannot be encoded as JSON: %w", err)
		}
		raw = b
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var tree any
	if err := dec.Decode(&tree); err != nil {
		return nil, fmt.Errorf("payload is not valid JSON: %w", err)
	}
	if dec.More() {
		return nil, fmt.Errorf("payload is not valid JSON: trailing data after the first value")
	}
	// encoding/json writes map keys in sorted order; that is the whole of
	// the canonical form we need.
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(tree); err != nil {
		return nil, fmt.Errorf("payload cannot be re-encoded: %w", err)
	}
	return bytes.TrimSuffix(out.Bytes(), []byte("\n")), nil
}
