package once

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gowebpki/jcs"
)

// TestCanonicalShortcutTaken checks which payloads the shortcut writes
// itself and which it leaves to the general path: a shortcut that gave
// up on everything would pass every equality test and save nothing.
func TestCanonicalShortcutTaken(t *testing.T) {
	taken := map[string]bool{
		"string": true, "string escapes": true, "string non-ASCII": true, "bool true": true, "int": true, "int 2^53": true, "int -2^53": true,
		"int8": true, "uint64": true, "uintptr": true, "float64": true, "float64 negative zero": true, "float64 tiny": true, "float64 large": true,
		"float64 max": true, "float64 smallest": true, "map[string]string": true, "map[string]string nil": true, "map[string]string UTF-16 order": true,
		"map[string]any": true, "map[string]any nested": true, "map[string]any bytes": true, "map[string]int": true, "map[goldenNamed]goldenNamed": true,
		"map[string][]string": true, "[]any": true, "[]any nil": true, "[]string": true, "[]int": true, "[]float64": true, "[]map[string]string": true,
		"[3]int": true, "[2]byte": true, "named string": true, "struct": true, "struct empty fields": true, "struct pointer": true, "struct nil pointer": true,
		"struct tree": true, "anonymous struct": true, "pointer to string": true, "pointer to pointer": true, "interface slice of structs": true,

		"float32": false, "json.Number": false, "RawMessage": false, "map[string]any numbers": false, "map[string]any raw": false, "map[int]string": false,
		"struct embedded": false, "struct string tag": false, "struct omitzero": false, "time": false,
	}
	for _, p := range goldenPayloads() {
		want, listed := taken[p.name]
		if !listed {
			continue
		}
		delete(taken, p.name)
		if _, ok := appendCanonical(nil, p.payload, 0, math.MaxInt); ok != want {
			t.Errorf("%s: shortcut taken = %v, want %v", p.name, ok, want)
		}
	}
	for name := range taken {
		t.Errorf("no golden payload %q", name)
	}
	// What the general path refuses, the shortcut leaves to it.
	for _, p := range []any{"a\xffb", map[string]string{"k\xff": "v"}, []any{"ok", "\xfe"}, math.NaN(), math.Inf(-1), int64(1<<53 + 1), uint64(math.MaxUint64), make(chan int)} {
		if _, ok := appendCanonical(nil, p, 0, math.MaxInt); ok {
			t.Errorf("shortcut taken for %#v", p)
		}
	}
}

// fuzzValue builds a Go value from fuzz input: the shapes payloads take,
// with strings cut from the fuzzed text.
type fuzzValue struct {
	data []byte
	text string
}

type fuzzStruct struct {
	Name  string            `json:"name"`
	N     int64             `json:"n,omitempty"`
	F     float64           `json:"f"`
	On    bool              `json:"on,omitempty"`
	Tags  []string          `json:"tags,omitempty"`
	Attrs map[string]string `json:"attrs"`
	Any   any               `json:"any,omitempty"`
	Next  *fuzzStruct       `json:"next,omitempty"`
	Blob  []byte
	U     uint32
	Named goldenNamed `json:"é"`
	Arr   [2]int8
	Skip  string `json:"-"`
}

func (g *fuzzValue) next() byte {
	if len(g.data) == 0 {
		return 0
	}
	c := g.data[0]
	g.data = g.data[1:]
	return c
}

func (g *fuzzValue) u64() uint64 {
	var b [8]byte
	n := copy(b[:], g.data)
	g.data = g.data[n:]
	return binary.LittleEndian.Uint64(b[:])
}

func (g *fuzzValue) str() string {
	if g.text == "" {
		return ""
	}
	i, n := int(g.next())%len(g.text), int(g.next())%8
	return g.text[i:min(i+n, len(g.text))]
}

func (g *fuzzValue) value(depth int) any {
	if depth > 4 {
		return g.str()
	}
	switch g.next() % 24 {
	case 0:
		return nil
	case 1, 2:
		return g.str()
	case 3:
		return g.next()&1 == 1
	case 4:
		return int64(g.u64()) >> (g.next() % 64)
	case 5:
		return g.u64() >> (g.next() % 64)
	case 6:
		return math.Float64frombits(g.u64())
	case 7:
		return float64(int64(g.u64())>>(g.next()%64)) / float64(1+g.next())
	case 8:
		return []any{int8(g.next()), int16(g.u64()), int32(g.u64()), uint8(g.next()), uint16(g.u64()), uint(g.u64() >> 12), int(g.u64() >> 12)}
	case 9:
		if g.next()&1 == 0 {
			return []byte(nil)
		}
		return []byte(g.str())
	case 10, 11:
		m := map[string]any{}
		for range int(g.next() % 6) {
			m[g.str()] = g.value(depth + 1)
		}
		return m
	case 12:
		m := map[string]string{}
		for range int(g.next() % 6) {
			m[g.str()] = g.str()
		}
		return m
	case 13:
		var s []any
		for range int(g.next() % 5) {
			s = append(s, g.value(depth+1))
		}
		return s
	case 14:
		var s []string
		for range int(g.next() % 4) {
			s = append(s, g.str())
		}
		return s
	case 15, 16:
		s := fuzzStruct{Name: g.str(), N: int64(g.u64()) >> (g.next() % 64), F: float64(int32(g.u64())) / 8, On: g.next()&1 == 1, Tags: []string{g.str()},
			Attrs: map[string]string{g.str(): g.str()}, Blob: []byte(g.str()), U: uint32(g.u64()), Named: goldenNamed(g.str()), Arr: [2]int8{int8(g.next()), 1}, Skip: g.str()}
		if g.next()&1 == 1 {
			s.Any = g.value(depth + 1)
		}
		if g.next()&1 == 1 {
			s.Next = &fuzzStruct{Name: g.str()}
		}
		if g.next()&1 == 1 {
			return &s
		}
		return s
	case 17:
		return json.Number(g.str())
	case 18:
		return float32(math.Float32frombits(uint32(g.u64())))
	case 19:
		return json.RawMessage(g.str())
	case 20:
		return map[string]int{g.str(): int(int32(g.u64())), g.str(): -1}
	case 21:
		return map[goldenNamed][]int{goldenNamed(g.str()): {int(g.next())}}
	case 22:
		return goldenRef{ID: g.u64() >> (g.next() % 64), Kind: g.str()}
	default:
		v := g.value(depth + 1)
		return &v
	}
}

// FuzzCanonicalShortcuts holds the shortcut to the general path: on any
// value it takes, it writes the general path's bytes, and the general
// path accepts the value.
func FuzzCanonicalShortcuts(f *testing.F) {
	f.Add([]byte{10, 3, 0, 2, 1, 3, 2, 5, 6, 7, 8}, "hello\x00\x1f\"\\<>&\u2028é😀דּ\xff")
	f.Add([]byte{15, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}, "abc")
	f.Add([]byte{13, 4, 6, 255, 255, 255, 255, 255, 255, 239, 127, 7, 1, 2, 3, 4, 5, 6, 7, 8, 0, 3}, "x")
	f.Add([]byte{12, 5, 0, 4, 4, 3, 8, 2, 12, 1, 5, 6}, "😀\uffff\ue000a")
	f.Add([]byte{4, 255, 255, 255, 255, 255, 255, 31, 0, 0}, "")
	f.Fuzz(func(t *testing.T, data []byte, text string) {
		g := &fuzzValue{data: data, text: text}
		v := g.value(0)
		want, wantErr := canonicalGeneral(v, math.MaxInt)
		got, ok := appendCanonical([]byte("prefix"), v, 0, math.MaxInt)
		if ok {
			if wantErr != nil {
				t.Fatalf("%#v: the shortcut wrote %q, the general path refused it: %v", v, got, wantErr)
			}
			if !bytes.Equal(got[len("prefix"):], want) {
				t.Fatalf("%#v: the shortcut wrote %q, the general path %q", v, got[len("prefix"):], want)
			}
		}
		// Whatever path it takes, the payload is the general path's. (Its
		// refusals name the first bad map key met, in map order.)
		p, err := appendPayload([]byte("prefix"), v, math.MaxInt)
		if (err == nil) != (wantErr == nil) || err == nil && !bytes.Equal(p[len("prefix"):], want) {
			t.Fatalf("%#v: appendPayload = %q, %v; want %q, %v", v, p, err, want, wantErr)
		}
	})
}

// appendFloat writes every finite double as RFC 8785's reference
// formatter (jcs.NumberToJSON) does.
func TestAppendFloatMatchesJCS(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	edges := []float64{0, math.Copysign(0, -1), 1, -1, 1e21, 1e21 - 65536, 1e-6, 1e-6 - 1e-22, 1e-7, 5e-324, math.MaxFloat64, -math.MaxFloat64, 1 << 53, 0.1, 1e100, 123e-20, 4.5}
	for i := range 200000 {
		var f float64
		switch {
		case i < len(edges):
			f = edges[i]
		case i%2 == 0:
			f = math.Float64frombits(r.Uint64())
		default:
			f = float64(r.Int64N(1<<62)) * math.Pow(10, float64(r.IntN(60)-30))
		}
		if math.IsNaN(f) || math.IsInf(f, 0) {
			if _, ok := appendFloat(nil, f); ok {
				t.Fatalf("appendFloat(%v) taken", f)
			}
			continue
		}
		want, err := jcs.NumberToJSON(f)
		got, ok := appendFloat(nil, f)
		if err != nil || !ok || string(got) != want {
			t.Fatalf("appendFloat(%v) = %q (%v), jcs.NumberToJSON = %q (%v)", f, got, ok, want, err)
		}
	}
}
