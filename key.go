package once

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"math"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/gowebpki/jcs"
)

// Key identifies one intended action. It is the lowercase hex SHA-256 of an
// unambiguous encoding of the intent, so the same intent presented twice —
// by a redelivered job, a restarted agent, another machine — gets the same
// key, and two different intents never share one. KEYS.md specifies the
// encoding byte by byte, with test vectors, for implementations in other
// languages.
type Key string

// Fingerprint is the lowercase hex SHA-256 of an intent's canonical payload
// and its kind (raw bytes or JSON). It is stored beside the key so that a
// retry which changed the payload is refused instead of silently replaying
// (or re-running) a different action.
type Fingerprint string

// Domain tags keep the two hashes apart and version the encoding. v2 reads
// JSON payloads per RFC 8785 and tags raw bytes apart from JSON; a v2 key
// can never equal a v1 key, so rows written under v1 are never mistaken
// for v2 intents (they are simply not found).
const (
	keyDomain     = "once.key.v2"
	payloadDomain = "once.payload.v2"
)

// Payload tags say which kind of payload a fingerprint was taken of, so
// that raw bytes and JSON text that happen to be the same bytes
// ([]byte(`"hi"`) and the string "hi") never share a fingerprint.
const (
	rawTag  = "raw"
	jsonTag = "json"
)

// KeyOf returns the key and payload fingerprint of an intent, or an
// *IntentError if the intent is not valid. It is a pure function: no clock,
// no randomness, no I/O.
func KeyOf(in Intent) (Key, Fingerprint, error) {
	_, k, fp, err := in.validate(DefaultMaxPayloadBytes, false)
	return k, fp, err
}

// sums is the scratch space of one hashing: the digest, the canonical
// payload and the fields are written into buffers kept between calls, so
// that a key costs one allocation, for its text.
type sums struct {
	h hash.Hash
	// payload holds a JSON payload's canonical form, fields the fields
	// around it.
	payload, fields []byte
	sum             [sha256.Size]byte
	// hex holds the fingerprint's text, then the key's.
	hex [4 * sha256.Size]byte
}

var sumsPool = sync.Pool{New: func() any { return &sums{h: sha256.New()} }}

// maxKeptBuffer bounds the buffer a pooled sums keeps: a rare large
// payload is not held on to.
const maxKeptBuffer = 64 << 10

// keyOf computes the canonical payload, the fingerprint and the key of an
// intent whose other fields are valid. It returns the canonical payload
// only when keep is set (it is stored with a claim); raw bytes are
// returned as they were given.
func keyOf(in Intent, maxPayload int, keep bool) ([]byte, Key, Fingerprint, error) {
	s := sumsPool.Get().(*sums)
	defer func() {
		if cap(s.payload) > maxKeptBuffer {
			s.payload = nil
		}
		sumsPool.Put(s)
	}()
	payload, raw := in.Payload.([]byte)
	tag := payloadTag(in.Payload)
	if tag == jsonTag {
		var err error
		s.payload, err = appendPayload(s.payload[:0], in.Payload, maxPayload)
		if err != nil {
			return nil, "", "", &IntentError{Field: "Payload", Reason: err.Error()}
		}
		payload = s.payload
	}
	if len(payload) > maxPayload {
		return nil, "", "", &IntentError{Field: "Payload", Reason: overLimit("", len(payload), maxPayload)}
	}

	s.h.Reset()
	f := appendField(s.fields[:0], payloadDomain)
	f = appendField(f, tag)
	f = binary.BigEndian.AppendUint64(f, uint64(len(payload)))
	s.h.Write(f)
	s.h.Write(payload)
	hex.Encode(s.hex[:2*sha256.Size], s.h.Sum(s.sum[:0]))

	s.h.Reset()
	f = appendField(f[:0], keyDomain)
	f = appendField(f, in.Run)
	f = binary.BigEndian.AppendUint64(f, uint64(decimalLen(in.Step)))
	f = strconv.AppendInt(f, in.Step, 10)
	f = appendField(f, in.Kind)
	f = appendField(f, in.Target)
	if in.PayloadInKey {
		f = appendField(f, s.hex[:2*sha256.Size])
	} else {
		// A distinct marker, so that folding the payload in can never
		// produce the same key as leaving it out.
		f = appendField(f, "")
	}
	s.fields = f
	s.h.Write(f)
	hex.Encode(s.hex[2*sha256.Size:], s.h.Sum(s.sum[:0]))

	// One string holds both texts.
	both := string(s.hex[:])
	if keep && !raw && payload != nil {
		payload = bytes.Clone(payload)
	} else if !keep {
		payload = nil
	}
	return payload, Key(both[2*sha256.Size:]), Fingerprint(both[:2*sha256.Size]), nil
}

// overLimit is the reason a payload over the size limit is refused; what
// says which text was measured, when it is not the canonical payload.
func overLimit(what string, n, max int) string {
	return fmt.Sprintf("%sis %d bytes, over the limit of %d; store large content elsewhere and pass a reference, or raise Config.MaxPayloadBytes", what, n, max)
}

// payloadTag names the kind of a payload: raw bytes for a []byte (and for
// no payload, which is zero raw bytes), JSON for anything else.
func payloadTag(p any) string {
	switch p.(type) {
	case nil, []byte:
		return rawTag
	}
	return jsonTag
}

// decimalLen is the length of n's decimal text; n is not negative.
func decimalLen(n int64) int {
	l := 1
	for ; n >= 10; n /= 10 {
		l++
	}
	return l
}

// appendField appends an 8-byte big-endian length and then the bytes.
// The length prefix is what makes the encoding unambiguous: "a b"+"c"
// and "a"+"b c" have different lengths in first position.
func appendField[S ~string | ~[]byte](b []byte, field S) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(len(field)))
	return append(b, field...)
}

// canonicalPayload returns the bytes a payload is fingerprinted (and
// stored) as. A []byte is taken as it is: any bytes, hashed under the raw
// tag. Anything else is JSON: a json.RawMessage as given, any other value
// as encoding/json encodes it, put in the canonical form of RFC 8785 (the
// JSON Canonicalization Scheme), so payloads that are equal as JSON values
// hash equal whatever their key order, whitespace, escapes or number
// notation. A nil payload is empty.
//
// Canonical form must not hide a difference between two payloads, so JSON
// that would lose information on the way is refused rather than hashed:
// text or strings that are not valid UTF-8 (encoding/json would turn the
// bad bytes into U+FFFD), duplicate object keys, and numbers that RFC
// 8785, which reads every number as an IEEE-754 double, would change.
func canonicalPayload(p any) ([]byte, error) {
	switch v := p.(type) {
	case nil:
		return nil, nil
	case []byte:
		return v, nil
	}
	return appendPayload(nil, p, math.MaxInt)
}

// appendPayload appends the canonical form of a JSON payload to b: by the
// shortcut (canonical.go) when it applies, and otherwise by the general
// path, whose result and errors define the canonical form. JSON text
// longer than max is refused before it is read: reading costs many times
// the text's size.
func appendPayload(b []byte, p any, max int) ([]byte, error) {
	n := len(b)
	out, ok := appendCanonical(b, p, 0, n+min(max, math.MaxInt-n))
	if ok {
		return out, nil
	}
	c, err := canonicalGeneral(p, max)
	if err != nil {
		return out[:n], err
	}
	return append(out[:n], c...), nil
}

// canonicalGeneral is the definition of a JSON payload's canonical form:
// encoding/json's text of the value (a json.RawMessage as given), read
// and written again per RFC 8785, refused where that would hide a
// difference. Text longer than max, and a value nested deeper than
// MaxPayloadDepth, are refused before they are read or encoded.
func canonicalGeneral(p any, max int) ([]byte, error) {
	if v, ok := p.(json.RawMessage); ok {
		if len(v) > max {
			return nil, errors.New(overLimit("is JSON text that ", len(v), max))
		}
		return canonicalJSON(v, "")
	}
	// The walk comes first: encoding/json has no bound on nesting, and a
	// value nested a million levels deep overflows its stack.
	if err := checkStrings(reflect.ValueOf(p), max); err != nil {
		return nil, err
	}
	// Without HTML escapes the text is as long as the canonical form, or
	// a little longer (U+2028, numbers as a json.Number wrote them), so
	// the limit refuses nothing the canonical form would take.
	var text bytes.Buffer
	enc := json.NewEncoder(&text)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(p); err != nil {
		return nil, fmt.Errorf("cannot be encoded as JSON: %v; pass a value encoding/json can encode, a json.RawMessage, or []byte to hash bytes as they are", err)
	}
	b := bytes.TrimSuffix(text.Bytes(), []byte("\n"))
	if len(b) > max {
		return nil, errors.New(overLimit("encodes to JSON text that ", len(b), max))
	}
	return canonicalJSON(b, "encodes to JSON that ")
}

// canonicalJSON validates JSON text and returns its RFC 8785 form. what
// prefixes the reasons, for text that encoding/json produced from a value
// (its json.Marshaler or json.RawMessage parts pass through unchecked).
func canonicalJSON(text []byte, what string) ([]byte, error) {
	if !utf8.Valid(text) {
		i := invalidUTF8At(text)
		fix := "fix the encoding, or pass the payload as []byte to hash its bytes as they are"
		if what != "" {
			fix = "a MarshalJSON method or a json.RawMessage in the value wrote them; make its output valid UTF-8"
		}
		return nil, fmt.Errorf("%sis not valid UTF-8 (byte %d is 0x%02x): JSON text is UTF-8, and bytes that are not could not be told apart once read; %s", what, i, text[i], fix)
	}
	if len(bytes.TrimLeft(text, " \t\r\n")) == 0 {
		return nil, fmt.Errorf("%sis empty, which is no JSON value; pass nil (or an empty []byte) for no payload, or a JSON value such as null", what)
	}
	out, err := jcs.Transform(text)
	if err != nil {
		return nil, fmt.Errorf("%sis not JSON that has a canonical form (RFC 8785): %v; send one JSON value with no duplicate object keys, no unpaired surrogate escapes (\\ud800) and only finite numbers", what, err)
	}
	if err := checkNumbers(text); err != nil {
		return nil, fmt.Errorf("%s%v", what, err)
	}
	return out, nil
}

// invalidUTF8At returns the offset of the first byte of b that does not
// start a valid UTF-8 sequence, or -1.
func invalidUTF8At(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return -1
}

// checkNumbers refuses a number whose canonical form has another value.
// RFC 8785 writes each number as the shortest text that reads back as the
// same IEEE-754 double, so 100.0 and 1e2 become 100; but
// 12345678901234567891 becomes 12345678901234567000, and two different
// amounts or ids would share a fingerprint. text must be valid JSON.
func checkNumbers(text []byte) error {
	for i := 0; i < len(text); {
		switch c := text[i]; {
		case c == '"':
			for i++; text[i] != '"'; i++ {
				if text[i] == '\\' {
					i++
				}
			}
			i++
		case c == '-' || '0' <= c && c <= '9':
			j := i
			for j < len(text) && strings.IndexByte("+-.eE0123456789", text[j]) >= 0 {
				j++
			}
			if err := checkNumber(string(text[i:j])); err != nil {
				return err
			}
			i = j
		default:
			i++
		}
	}
	return nil
}

func checkNumber(lit string) error {
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil {
		return fmt.Errorf("has the number %s, out of the range of an IEEE-754 double; send it as a string", shorten(lit))
	}
	canon, err := jcs.NumberToJSON(f)
	if err != nil {
		return fmt.Errorf("has the number %s, which is not finite; send it as a string", shorten(lit))
	}
	if !sameDecimal(lit, canon) {
		return fmt.Errorf("has the number %s, which canonical JSON (RFC 8785) would change to %s: it reads every number as an IEEE-754 double; send numbers a double cannot hold as strings (for a Go integer beyond 2^53, tag the field `json:\",string\"`)", shorten(lit), canon)
	}
	return nil
}

// sameDecimal reports whether two JSON number texts have the same value,
// compared exactly as decimals (-0 equals 0).
func sameDecimal(a, b string) bool {
	na, da, ea, oka := decimalOf(a)
	nb, db, eb, okb := decimalOf(b)
	return oka && okb && na == nb && da == db && ea == eb
}

// decimalOf splits a JSON number into its sign, its significant digits
// (no leading or trailing zeros) and the power of ten of the last of them,
// so that equal values give equal results: 100, 100.0 and 1e2 are all
// (false, "1", 2). Zero is (false, "", 0). ok is false for an exponent
// beyond ±2^40: a finite, non-zero number written so would need more
// digits than any payload holds, and none is a canonical number.
func decimalOf(s string) (neg bool, digits string, exp int, ok bool) {
	if strings.HasPrefix(s, "-") {
		neg, s = true, s[1:]
	}
	mant, e := s, ""
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		mant, e = s[:i], s[i+1:]
	}
	whole, frac, _ := strings.Cut(mant, ".")
	digits = strings.TrimLeft(whole+frac, "0")
	if digits == "" {
		return false, "", 0, true
	}
	if e != "" {
		n, err := strconv.Atoi(e)
		if err != nil || n > 1<<40 || n < -1<<40 {
			return false, "", 0, false
		}
		exp = n
	}
	trimmed := strings.TrimRight(digits, "0")
	return neg, trimmed, exp - len(frac) + len(digits) - len(trimmed), true
}

// shorten keeps an error message readable when the offending text is long.
func shorten(s string) string {
	if len(s) > 40 {
		return s[:37] + "..."
	}
	return s
}

var (
	jsonMarshalerType = reflect.TypeFor[json.Marshaler]()
	rawMessageType    = reflect.TypeFor[json.RawMessage]()
	textMarshalerType = reflect.TypeFor[encoding.TextMarshaler]()
)

// MaxPayloadDepth bounds how deeply a JSON payload nests (arrays and
// objects), in JSON text and in a Go value alike. Deeper payloads are
// refused before they are read or encoded.
const MaxPayloadDepth = 10000

// maxWalkDepth bounds checkStrings' recursion, pointers and interfaces
// included, which add no JSON level: encoding/json follows them without
// a bound, and a chain of them long enough overflows its stack.
const maxWalkDepth = 1 << 15

// checkStrings refuses a Go value nested deeper than MaxPayloadDepth, and
// a string in it that is not valid UTF-8:
// encoding/json would replace its bad bytes with U+FFFD, so two different
// payloads would encode, and hash, the same. It follows the value the way
// encoding/json does: exported fields and those of embedded structs (not
// the ones tagged "-"), map keys and values, elements, pointers,
// interfaces, and the text of encoding.TextMarshaler values and keys. A
// json.Marshaler is not entered: its output is checked as JSON text.
// []byte is base64 in JSON, so any bytes are fine there.
func checkStrings(v reflect.Value, max int) error {
	bad := walkStrings(v, 0, 0, &walkBudget{bytes: max, embeds: max})
	switch {
	case bad == nil:
		return nil
	case bad == tooDeep:
		return fmt.Errorf("nests deeper than %d levels (the limit of JSON payloads, MaxPayloadDepth), or refers to itself; flatten it", MaxPayloadDepth)
	case bad == tooLong:
		return fmt.Errorf("is reached through more than %d pointers and interfaces, or refers to itself; flatten it", maxWalkDepth)
	case bad == tooManyEmbeds:
		return fmt.Errorf("follows more than %d embedded struct pointers (one for each byte of the limit, Config.MaxPayloadBytes), or holds one in many places; flatten it", max)
	case bad == tooBig:
		return fmt.Errorf("would encode to JSON text of more than %d bytes, over the limit of %d (a part held in several places is written out in each); store large content elsewhere and pass a reference, or raise Config.MaxPayloadBytes", max, max)
	}
	i := invalidUTF8At([]byte(bad.text))
	return fmt.Errorf("has %s that is not valid UTF-8 (at %s, byte %d is 0x%02x: %s): encoding/json would replace it with U+FFFD, so payloads that differ there would hash the same; make it valid UTF-8, or carry binary data in a []byte field (base64 in JSON) or as a []byte payload", bad.what, bad.where(), i, bad.text[i], shorten(strconv.Quote(bad.text)))
}

// badText is what walkStrings found; path is built on the way back up,
// innermost first, so a payload with nothing wrong costs no path strings.
type badText struct {
	what, text string
	path       []string
}

// tooDeep, tooLong, tooBig and tooManyEmbeds are what walkStrings finds
// in a value nested deeper than MaxPayloadDepth, followed further than
// maxWalkDepth, over the byte budget, or over the embedded pointers'.
// They are shared, and carry neither what nor a path: a path that long
// would not help anyone.
var tooDeep, tooLong, tooBig, tooManyEmbeds = &badText{}, &badText{}, &badText{}, &badText{}

// at adds segment to the path of bad text; a bound's sentinel (no what)
// is returned as it is.
func (b *badText) at(segment string) *badText {
	if b.what == "" {
		return b
	}
	b.path = append(b.path, segment)
	return b
}

func (b *badText) where() string {
	if len(b.path) == 0 {
		return "the top level"
	}
	var s strings.Builder
	for i := len(b.path) - 1; i >= 0; i-- {
		s.WriteString(b.path[i])
	}
	return s.String()
}

// walkStrings walks v, depth calls and level JSON levels below the top.
// budget is what is left of the payload limit: each string, element,
// member and field name spends at least the bytes encoding/json writes
// for it, and tooBig is returned once it is spent. The walk follows a
// part held in many places (a shared pointer, one string in many
// elements) each time, as encoding/json does; the budget stops it long
// before it writes such a value out.
func walkStrings(v reflect.Value, depth, level int, budget *walkBudget) *badText {
	if !v.IsValid() {
		return nil
	}
	if depth > maxWalkDepth {
		return tooLong
	}
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice:
		if v.IsNil() {
			return nil
		}
	}
	if v.Type() == rawMessageType {
		// Written as it is, compacted: each byte but white space.
		if budget.spend(len(v.Bytes()) - countSpace(v.Bytes())) {
			return tooBig
		}
		return nil
	}
	if implements(v, jsonMarshalerType) {
		return nil
	}
	if implements(v, textMarshalerType) {
		if tm, ok := textMarshalerOf(v); ok {
			// An error here makes json.Marshal fail.
			if text, err := tm.MarshalText(); err == nil && !utf8.Valid(text) {
				return &badText{what: "the text of a MarshalText", text: string(text)}
			} else if budget.spend(len(text)) {
				return tooBig
			}
		}
		return nil
	}
	if isContainer(v.Type()) {
		if level++; level > MaxPayloadDepth {
			return tooDeep
		}
	}
	switch v.Kind() {
	case reflect.String:
		if budget.spend(v.Len()) {
			return tooBig
		}
		if !utf8.ValidString(v.String()) {
			return &badText{what: "a string", text: v.String()}
		}
	case reflect.Pointer, reflect.Interface:
		return walkStrings(v.Elem(), depth+1, level, budget)
	case reflect.Struct:
		t := v.Type()
		for i := range t.NumField() {
			sf := t.Field(i)
			fl := level
			if sf.Anonymous {
				ft := sf.Type
				if ft.Kind() == reflect.Pointer {
					ft = ft.Elem()
				}
				if !sf.IsExported() && ft.Kind() != reflect.Struct {
					continue
				}
			} else if !sf.IsExported() {
				continue
			}
			if sf.Tag.Get("json") == "-" {
				continue
			}
			if embedsStruct(sf) {
				// Its fields are promoted: they are the outer struct's,
				// a level up, and it writes nothing of its own, however
				// often it is shared: count the pointer.
				fl--
				if fv := v.Field(i); fv.Kind() == reflect.Pointer && !fv.IsNil() {
					if budget.embeds--; budget.embeds < 0 {
						return tooManyEmbeds
					}
				}
			} else if budget.spend(fieldBytes(sf, v.Field(i))) {
				return tooBig
			}
			if bad := walkStrings(v.Field(i), depth+1, fl, budget); bad != nil {
				return bad.at("." + sf.Name)
			}
		}
	case reflect.Map:
		kt := v.Type().Key()
		textKeys := kt.Kind() != reflect.String && kt.Implements(textMarshalerType)
		for it := v.MapRange(); it.Next(); {
			k := it.Key()
			kb := 4 // "":, and a value of at least a byte
			if k.Kind() == reflect.String {
				kb += k.Len()
			}
			if budget.spend(kb) {
				return tooBig
			}
			if k.Kind() == reflect.String && !utf8.ValidString(k.String()) {
				return &badText{what: "a map key", text: k.String()}
			}
			if textKeys && !(k.Kind() == reflect.Pointer && k.IsNil()) && k.CanInterface() {
				if text, err := k.Interface().(encoding.TextMarshaler).MarshalText(); err == nil && !utf8.Valid(text) {
					return &badText{what: "the text of a map key's MarshalText", text: string(text)}
				} else if budget.spend(len(text)) {
					return tooBig
				}
			}
			if bad := walkStrings(it.Value(), depth+1, level, budget); bad != nil {
				return bad.at(fmt.Sprintf("[%s]", shorten(fmt.Sprintf("%#v", k))))
			}
		}
	case reflect.Slice, reflect.Array:
		// An element is at least a byte; bytes are base64, 4 for 3.
		if budget.spend(v.Len()) {
			return tooBig
		}
		if !mayHoldText(v.Type().Elem()) {
			return nil
		}
		for i := range v.Len() {
			if bad := walkStrings(v.Index(i), depth+1, level, budget); bad != nil {
				return bad.at(fmt.Sprintf("[%d]", i))
			}
		}
	}
	return nil
}

// implements reports whether encoding/json would use v's implementation
// of the marshaler interface t: the value's own, or its address's when v
// is addressable.
func implements(v reflect.Value, t reflect.Type) bool {
	if v.Type().Implements(t) {
		return true
	}
	return v.Kind() != reflect.Pointer && v.CanAddr() && reflect.PointerTo(v.Type()).Implements(t)
}

func textMarshalerOf(v reflect.Value) (encoding.TextMarshaler, bool) {
	if v.Type().Implements(textMarshalerType) {
		if !v.CanInterface() {
			return nil, false
		}
		return v.Interface().(encoding.TextMarshaler), true
	}
	a := v.Addr()
	if !a.CanInterface() {
		return nil, false
	}
	return a.Interface().(encoding.TextMarshaler), true
}

// countSpace counts the bytes of b that are JSON white space.
func countSpace(b []byte) int {
	n := 0
	for _, c := range b {
		if c == ' ' || c == '\t' || c == '\n' || c == '\r' {
			n++
		}
	}
	return n
}

// walkBudget is what walkStrings may still spend: bytes of the payload
// limit, and embedded struct pointers followed.
type walkBudget struct{ bytes, embeds int }

// spend takes n bytes from the budget and reports whether it is spent.
func (b *walkBudget) spend(n int) bool {
	b.bytes -= n
	return b.bytes < 0
}

// embedsStruct reports whether sf embeds a struct, or a pointer to one,
// whose fields encoding/json promotes into the outer struct's (it has
// no name of its own in its tag).
func embedsStruct(sf reflect.StructField) bool {
	ft := sf.Type
	if ft.Kind() == reflect.Pointer {
		ft = ft.Elem()
	}
	name, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
	return sf.Anonymous && ft.Kind() == reflect.Struct && name == ""
}

// fieldBytes is the least encoding/json writes for the name of struct
// field sf holding v ("name":), counted only where the field is surely
// written: a non-nil pointer, interface, map or slice, or a non-empty
// string, without omitzero (whose IsZero method may say otherwise). It
// is what keeps a walk over a node shared many times bounded.
func fieldBytes(sf reflect.StructField, v reflect.Value) int {
	name, opts, _ := strings.Cut(sf.Tag.Get("json"), ",")
	if strings.Contains(","+opts+",", ",omitzero,") {
		return 0
	}
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice:
		if v.IsNil() {
			return 0
		}
	case reflect.String:
		if v.Len() == 0 {
			return 0
		}
	default:
		return 0
	}
	return len(cmp.Or(name, sf.Name)) + 3
}

// isContainer reports whether encoding/json writes a value of type t as
// an array or an object, which is one level of nesting: a struct, a map,
// an array, or a slice other than bytes (base64 text).
func isContainer(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Struct, reflect.Map, reflect.Array:
		return true
	case reflect.Slice:
		if t.Elem().Kind() != reflect.Uint8 {
			return true
		}
		p := reflect.PointerTo(t.Elem())
		return p.Implements(jsonMarshalerType) || p.Implements(textMarshalerType)
	}
	return false
}

// mayHoldText reports whether values of type t can hold a string: numbers
// and booleans cannot, unless they marshal themselves.
func mayHoldText(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64:
		p := reflect.PointerTo(t)
		return p.Implements(jsonMarshalerType) || p.Implements(textMarshalerType)
	}
	return true
}
