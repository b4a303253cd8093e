package once

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// The canonical form of a JSON payload is defined (KEYS.md) as what
// encoding/json writes for the value, read and written again per RFC
// 8785. That round trip costs dozens of allocations for a small map, and
// runs on every Do. appendCanonical writes the same bytes directly for
// the values payloads are usually made of: strings, booleans, integers a
// double holds exactly, float64s, []byte, maps with string keys, slices,
// arrays, pointers, interfaces, and plain structs (their field layout
// worked out once per type). Anything else, and anything the general path
// would refuse or might write differently (invalid UTF-8, a large
// integer, a MarshalJSON method, an embedded struct, a ",string" tag),
// makes it give up, and the general path decides, with its own errors.
// TestKeyGoldenPayloads and FuzzCanonicalShortcuts hold the two paths to
// the same bytes.

// maxShortcutDepth bounds the shortcut's recursion; deeper values (and
// pointer cycles, which encoding/json refuses) take the general path.
const maxShortcutDepth = 64

// maxExactInt is the largest magnitude of an integer that a double holds
// exactly, so that RFC 8785 writes it as its decimal digits. Beyond it
// the general path decides (and refuses an integer it would change).
const maxExactInt = 1 << 53

// appendCanonical appends the canonical JSON of v to b. ok is false when
// the shortcut does not apply; what it appended is then to be discarded.
//
// end bounds len(b): past it the shortcut gives up, so that a value
// sharing its parts (one string in many places) is not written out
// whole; the general path then measures it before encoding it.
func appendCanonical(b []byte, v any, depth, end int) (_ []byte, ok bool) {
	if depth > maxShortcutDepth || len(b) > end {
		return b, false
	}
	switch v := v.(type) {
	case nil:
		return append(b, "null"...), true
	case string:
		return appendJSONString(b, v)
	case bool:
		return strconv.AppendBool(b, v), true
	case int:
		return appendInt(b, int64(v))
	case int64:
		return appendInt(b, v)
	case int32:
		return appendInt(b, int64(v))
	case int16:
		return appendInt(b, int64(v))
	case int8:
		return appendInt(b, int64(v))
	case uint:
		return appendUint(b, uint64(v))
	case uint64:
		return appendUint(b, v)
	case uint32:
		return appendUint(b, uint64(v))
	case uint16:
		return appendUint(b, uint64(v))
	case uint8:
		return appendUint(b, uint64(v))
	case float64:
		return appendFloat(b, v)
	case []byte:
		return appendBytes(b, v), true
	case map[string]string:
		return appendStringMap(b, v, end)
	case map[string]any:
		return appendAnyMap(b, v, depth, end)
	case []string:
		if v == nil {
			return append(b, "null"...), true
		}
		b = append(b, '[')
		for i, s := range v {
			if i > 0 {
				b = append(b, ',')
			}
			if b, ok = appendJSONString(b, s); !ok || len(b) > end {
				return b, false
			}
		}
		return append(b, ']'), true
	case []any:
		if v == nil {
			return append(b, "null"...), true
		}
		b = append(b, '[')
		for i, e := range v {
			if i > 0 {
				b = append(b, ',')
			}
			if b, ok = appendCanonical(b, e, depth+1, end); !ok {
				return b, false
			}
		}
		return append(b, ']'), true
	case json.RawMessage, json.Number:
		// Text of the caller's: the general path reads and checks it.
		return b, false
	}
	rv := reflect.ValueOf(v)
	return appendValue(b, rv, shapeOf(rv.Type()), depth, end)
}

func appendInt(b []byte, n int64) ([]byte, bool) {
	if n > maxExactInt || n < -maxExactInt {
		return b, false
	}
	return strconv.AppendInt(b, n, 10), true
}

func appendUint(b []byte, n uint64) ([]byte, bool) {
	if n > maxExactInt {
		return b, false
	}
	return strconv.AppendUint(b, n, 10), true
}

// appendFloat writes f as RFC 8785 does (jcs.NumberToJSON: ECMAScript's
// Number.prototype.toString), without its string. encoding/json writes
// the shortest digits that read back as f, so reading them again gives f.
func appendFloat(b []byte, f float64) ([]byte, bool) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return b, false
	}
	if f == 0 {
		return append(b, '0'), true
	}
	if f < 0 {
		b = append(b, '-')
		f = -f
	}
	if f >= 1e-6 && f < 1e21 {
		return strconv.AppendFloat(b, f, 'f', -1, 64), true
	}
	start := len(b)
	b = strconv.AppendFloat(b, f, 'e', -1, 64)
	// Go writes at least two exponent digits (1e+07); ECMAScript as few
	// as it needs (1e+7).
	if e := start + bytes.IndexByte(b[start:], 'e'); b[e+2] == '0' {
		b = append(b[:e+2], b[e+3:]...)
	}
	return b, true
}

// appendBytes writes a []byte as encoding/json does: base64, or null.
func appendBytes(b []byte, v []byte) []byte {
	if v == nil {
		return append(b, "null"...)
	}
	b = append(b, '"')
	b = base64.StdEncoding.AppendEncode(b, v)
	return append(b, '"')
}

// appendJSONString writes s as RFC 8785 writes a string: as itself in
// UTF-8, but for the quote, the backslash and the control characters.
// encoding/json's own escapes (<, >, &, U+2028) are read back by RFC 8785
// and written as themselves. Invalid UTF-8, which encoding/json would
// replace, is refused by the general path.
func appendJSONString(b []byte, s string) ([]byte, bool) {
	if !utf8.ValidString(s) {
		return b, false
	}
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\b':
			b = append(b, '\\', 'b')
		case '\f':
			b = append(b, '\\', 'f')
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			const hexDigits = "0123456789abcdef"
			b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		start = i + 1
	}
	b = append(b, s[start:]...)
	return append(b, '"'), true
}

// compareUTF16 orders object member names as RFC 8785 does: by their
// UTF-16 code units. a and b must be valid UTF-8. The order is that of
// the bytes (and of code points) except between a character above U+FFFF
// (a surrogate pair, D800–DBFF first) and one in E000–FFFF.
func compareUTF16(a, b string) int {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	if i == len(a) || i == len(b) {
		return len(a) - len(b)
	}
	for i > 0 && !utf8.RuneStart(a[i]) {
		i--
	}
	ra, _ := utf8.DecodeRuneInString(a[i:])
	rb, _ := utf8.DecodeRuneInString(b[i:])
	ua, ub := utf16Lead(ra), utf16Lead(rb)
	if ua == ub {
		// Both above U+FFFF with the same high surrogate: the low ones
		// follow the code points.
		ua, ub = ra, rb
	}
	if ua < ub {
		return -1
	}
	return 1
}

// utf16Lead is the first UTF-16 code unit of r.
func utf16Lead(r rune) rune {
	if r < 0x10000 {
		return r
	}
	return 0xD800 + (r-0x10000)>>10
}

// sortNames sorts object member names in RFC 8785 order. Payload maps are
// small: an insertion sort needs no closure and no allocation.
func sortNames(names []string) {
	if len(names) > 12 {
		slices.SortFunc(names, compareUTF16)
		return
	}
	for i := 1; i < len(names); i++ {
		for j := i; j > 0 && compareUTF16(names[j], names[j-1]) < 0; j-- {
			names[j], names[j-1] = names[j-1], names[j]
		}
	}
}

// mapKeys returns m's keys in RFC 8785 order, in small if they fit; ok
// is false if a key is not valid UTF-8.
func mapKeys[V any](m map[string]V, small []string) (_ []string, ok bool) {
	keys := small[:0]
	for k := range m {
		if !utf8.ValidString(k) {
			return nil, false
		}
		keys = append(keys, k)
	}
	sortNames(keys)
	return keys, true
}

func appendStringMap(b []byte, m map[string]string, end int) ([]byte, bool) {
	return appendMap(b, m, end, func(b []byte, v string) ([]byte, bool) { return appendJSONString(b, v) })
}

func appendAnyMap(b []byte, m map[string]any, depth, end int) ([]byte, bool) {
	return appendMap(b, m, end, func(b []byte, v any) ([]byte, bool) { return appendCanonical(b, v, depth+1, end) })
}

// appendMap writes m as a JSON object, its members in RFC 8785 order,
// each value by value; false if a key is not valid UTF-8 or value
// refuses one.
func appendMap[V any](b []byte, m map[string]V, end int, value func([]byte, V) ([]byte, bool)) ([]byte, bool) {
	if m == nil {
		return append(b, "null"...), true
	}
	var small [16]string
	keys, ok := mapKeys(m, small[:])
	if !ok {
		return b, false
	}
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b, _ = appendJSONString(b, k)
		b = append(b, ':')
		if b, ok = value(b, m[k]); !ok || len(b) > end {
			return b, false
		}
	}
	return append(b, '}'), true
}

// shape is how the shortcut encodes values of one type, worked out once
// per type from its reflect.Type, as encoding/json caches its encoders.
type shape struct {
	// ok is false for a type the shortcut leaves to the general path.
	ok   bool
	kind reflect.Kind
	// elem is the shape of a pointer's, slice's or array's element, or a
	// map's value.
	elem *shape
	// bytes marks a slice of bytes, which encoding/json writes in base64.
	bytes bool
	// fields are a struct's encoded fields, in RFC 8785 order.
	fields []fieldShape
}

type fieldShape struct {
	index int
	// name is the member name, quoted, and the colon.
	name      []byte
	omitEmpty bool
	shape     *shape
}

var (
	// shapes maps a reflect.Type to its *shape. Shapes are built under
	// shapesMu and published complete.
	shapes   sync.Map
	shapesMu sync.Mutex

	jsonNumberType = reflect.TypeFor[json.Number]()
	stringAnyMap   = reflect.TypeFor[map[string]any]()
	stringMap      = reflect.TypeFor[map[string]string]()
)

func shapeOf(t reflect.Type) *shape {
	if s, ok := shapes.Load(t); ok {
		return s.(*shape)
	}
	shapesMu.Lock()
	defer shapesMu.Unlock()
	built := make(map[reflect.Type]*shape)
	s := buildShape(t, built)
	for t, s := range built {
		shapes.Store(t, s)
	}
	return s
}

// marshals reports whether encoding/json would let a value of type t (or
// its address) encode itself.
func marshals(t reflect.Type) bool {
	if t.Implements(jsonMarshalerType) || t.Implements(textMarshalerType) {
		return true
	}
	if t.Kind() != reflect.Pointer {
		p := reflect.PointerTo(t)
		return p.Implements(jsonMarshalerType) || p.Implements(textMarshalerType)
	}
	return false
}

// buildShape works out t's shape; built holds the shapes of this call, so
// that a recursive type refers to itself.
func buildShape(t reflect.Type, built map[reflect.Type]*shape) *shape {
	if s, ok := built[t]; ok {
		return s
	}
	if s, ok := shapes.Load(t); ok {
		return s.(*shape)
	}
	s := &shape{kind: t.Kind()}
	built[t] = s
	if marshals(t) {
		return s
	}
	switch t.Kind() {
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float64, reflect.Interface:
		s.ok = true
	case reflect.String:
		// json.Number is written as the number it holds.
		s.ok = t != jsonNumberType
	case reflect.Pointer, reflect.Array:
		s.elem = buildShape(t.Elem(), built)
		s.ok = true
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			// encoding/json writes base64 unless the element marshals.
			s.bytes = !marshals(t.Elem())
			s.ok = s.bytes
			return s
		}
		s.elem = buildShape(t.Elem(), built)
		s.ok = true
	case reflect.Map:
		if t.Key().Kind() != reflect.String || marshals(t.Key()) {
			return s
		}
		s.elem = buildShape(t.Elem(), built)
		s.ok = true
	case reflect.Struct:
		s.ok = buildFields(s, t, built)
	}
	return s
}

// buildFields lays out a struct's fields as encoding/json names them,
// and reports false for what the shortcut leaves to it: embedded fields
// (promotion rules), options other than omitempty, tag names it would
// not take, and two fields of one name.
func buildFields(s *shape, t reflect.Type, built map[reflect.Type]*shape) bool {
	seen := make(map[string]bool)
	for i := range t.NumField() {
		sf := t.Field(i)
		if sf.Anonymous {
			return false
		}
		if !sf.IsExported() {
			continue
		}
		tag := sf.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		omitEmpty := false
		for opts != "" {
			var opt string
			opt, opts, _ = strings.Cut(opts, ",")
			if opt != "omitempty" {
				return false
			}
			omitEmpty = true
		}
		if name == "" {
			name = sf.Name
		} else if !validTagName(name) {
			return false
		}
		if seen[name] {
			return false
		}
		seen[name] = true
		quoted, ok := appendJSONString(nil, name)
		if !ok {
			return false
		}
		s.fields = append(s.fields, fieldShape{index: i, name: append(quoted, ':'), omitEmpty: omitEmpty, shape: buildShape(sf.Type, built)})
	}
	slices.SortFunc(s.fields, func(a, b fieldShape) int {
		return compareUTF16(string(a.name[1:len(a.name)-2]), string(b.name[1:len(b.name)-2]))
	})
	return true
}

// validTagName is encoding/json's rule for a name it takes from a tag.
// Names it rejects (it uses the field's name instead) are rare enough to
// leave to it; names that need escaping never pass.
func validTagName(s string) bool {
	for _, c := range s {
		switch {
		case strings.ContainsRune("!#$%&()*+-./:;<=>?@[]^_{|}~ ", c):
		case !unicode.IsLetter(c) && !unicode.IsDigit(c):
			return false
		}
	}
	return s != ""
}

// appendValue appends the canonical JSON of v, whose type has shape s.
func appendValue(b []byte, v reflect.Value, s *shape, depth, end int) (_ []byte, ok bool) {
	if !s.ok || depth > maxShortcutDepth || len(b) > end {
		return b, false
	}
	switch s.kind {
	case reflect.Bool:
		return strconv.AppendBool(b, v.Bool()), true
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return appendInt(b, v.Int())
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return appendUint(b, v.Uint())
	case reflect.Float64:
		return appendFloat(b, v.Float())
	case reflect.String:
		return appendJSONString(b, v.String())
	case reflect.Interface:
		if v.IsNil() {
			return append(b, "null"...), true
		}
		return appendCanonical(b, v.Interface(), depth+1, end)
	case reflect.Pointer:
		if v.IsNil() {
			return append(b, "null"...), true
		}
		return appendValue(b, v.Elem(), s.elem, depth+1, end)
	case reflect.Slice:
		if v.IsNil() {
			return append(b, "null"...), true
		}
		if s.bytes {
			return appendBytes(b, v.Bytes()), true
		}
		fallthrough
	case reflect.Array:
		b = append(b, '[')
		for i := range v.Len() {
			if i > 0 {
				b = append(b, ',')
			}
			if b, ok = appendValue(b, v.Index(i), s.elem, depth+1, end); !ok {
				return b, false
			}
		}
		return append(b, ']'), true
	case reflect.Map:
		return appendMapValue(b, v, s, depth, end)
	case reflect.Struct:
		b = append(b, '{')
		first := true
		for i := range s.fields {
			f := &s.fields[i]
			fv := v.Field(f.index)
			if f.omitEmpty && isEmptyValue(fv) {
				continue
			}
			if !first {
				b = append(b, ',')
			}
			first = false
			b = append(b, f.name...)
			if b, ok = appendValue(b, fv, f.shape, depth+1, end); !ok {
				return b, false
			}
		}
		return append(b, '}'), true
	}
	return b, false
}

// appendMapValue appends a map with string keys. The two map types
// payloads use most take the typed path; others are read by reflection.
func appendMapValue(b []byte, v reflect.Value, s *shape, depth, end int) ([]byte, bool) {
	if v.IsNil() {
		return append(b, "null"...), true
	}
	switch v.Type() {
	case stringMap:
		return appendStringMap(b, v.Interface().(map[string]string), end)
	case stringAnyMap:
		return appendAnyMap(b, v.Interface().(map[string]any), depth, end)
	}
	type member struct {
		name  string
		value reflect.Value
	}
	members := make([]member, 0, v.Len())
	for it := v.MapRange(); it.Next(); {
		name := it.Key().String()
		if !utf8.ValidString(name) {
			return b, false
		}
		members = append(members, member{name, it.Value()})
	}
	slices.SortFunc(members, func(a, b member) int { return compareUTF16(a.name, b.name) })
	b = append(b, '{')
	for i, m := range members {
		if i > 0 {
			b = append(b, ',')
		}
		b, _ = appendJSONString(b, m.name)
		b = append(b, ':')
		var ok bool
		if b, ok = appendValue(b, m.value, s.elem, depth+1, end); !ok {
			return b, false
		}
	}
	return append(b, '}'), true
}

// isEmptyValue is encoding/json's test for omitempty.
func isEmptyValue(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Array, reflect.Map, reflect.Slice, reflect.String:
		return v.Len() == 0
	case reflect.Bool,
		reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64,
		reflect.Interface, reflect.Pointer:
		return v.IsZero()
	}
	return false
}
