package idemhttp

import (
	"errors"
	"fmt"
	"net/http"
)

// Header is the request header that carries the idempotency key, and
// ReplayedHeader the response header that marks a stored response served
// again.
const (
	Header         = "Idempotency-Key"
	ReplayedHeader = "Idempotent-Replayed"
)

// MaxKeyLength bounds a key. Clients make keys from UUIDs or random
// strings; 255 bytes is room for any of those and keeps a hostile client
// from filling the store with megabyte keys.
const MaxKeyLength = 255

// errNoKey reports a request that carries no Idempotency-Key.
var errNoKey = errors.New("the request has no Idempotency-Key header")

// ParseKey reads the value of an Idempotency-Key header. The IETF draft
// makes it a structured-field string ("8e03978e-40d5-43e8-bc93-6894a57f9324",
// quotes included); many clients send the bare token instead, and both are
// taken. A key is 1 to 255 bytes of printable ASCII. A quote or a
// backslash inside it is refused rather than unescaped: no client needs
// them, and a key that reads one way quoted and another bare would let
// two spellings name the same action, or one spelling two.
func ParseKey(v string) (string, error) {
	quoted := len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"'
	k := v
	if quoted {
		k = v[1 : len(v)-1]
	}
	switch {
	case k == "":
		return "", errors.New("the Idempotency-Key header is empty; send a unique value, such as a random UUID, for each distinct operation")
	case len(k) > MaxKeyLength:
		return "", fmt.Errorf("the Idempotency-Key is %d bytes, over the limit of %d; use a shorter key, such as a random UUID", len(k), MaxKeyLength)
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		switch {
		case c == '"' || c == '\\':
			return "", fmt.Errorf("the Idempotency-Key has a %q at byte %d; send the key as a quoted string (\"abc\") or a bare token (abc) without quotes or backslashes inside", c, i)
		case c == ' ' && quoted:
		case c < 0x21 || c > 0x7e:
			return "", fmt.Errorf("the Idempotency-Key has byte 0x%02x at %d; a key is printable ASCII (spaces only inside quotes)", c, i)
		}
	}
	return k, nil
}

// keyOf reads the key of r: errNoKey when there is none, an error naming
// the fault when there are two or the one is malformed.
func keyOf(r *http.Request) (string, error) {
	vs := r.Header.Values(Header)
	switch len(vs) {
	case 0:
		return "", errNoKey
	case 1:
		return ParseKey(vs[0])
	}
	return "", fmt.Errorf("the request has %d Idempotency-Key headers; send exactly one", len(vs))
}
