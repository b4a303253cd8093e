package once

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"math/big"
	"os"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/gowebpki/jcs"
)

func mustKey(t testing.TB, in Intent) (Key, Fingerprint) {
	t.Helper()
	k, fp, err := KeyOf(in)
	if err != nil {
		t.Fatalf("KeyOf(%+v): %v", in, err)
	}
	return k, fp
}

func TestKeyIsPure(t *testing.T) {
	in := Intent{Run: "run-1", Step: 2, Kind: "send_email", Target: "ada@example.com", Payload: map[string]any{"b": 1, "a": []int{1, 2}}}
	k1, fp1 := mustKey(t, in)
	for range 100 {
		k2, fp2 := mustKey(t, in)
		if k1 != k2 || fp1 != fp2 {
			t.Fatal("the same intent gave two keys")
		}
	}
	if len(k1) != 64 || strings.ToLower(string(k1)) != string(k1) || len(fp1) != 64 {
		t.Fatalf("key %q / fingerprint %q: want 64 lowercase hex characters", k1, fp1)
	}
}

// TestKeyGolden pins the encoding: a change here changes every key in
// every deployed action log, and must come with a new domain tag.
func TestKeyGolden(t *testing.T) {
	in := Intent{Run: "run-1", Step: 2, Kind: "send_email", Target: "ada@example.com", Payload: json.RawMessage(`{"subject":"hi"}`)}
	k, fp := mustKey(t, in)
	// Computed independently from KEYS.md by testdata/keys/keyvectors.py.
	const (
		wantKey = "2d006585b492e8d9faa9791fa7ebec5a1acc43d6e649b3791c2a0348486f8958"
		wantFP  = "51b94bbce0a3d7429558154aced561dc136ce68c0fe8f3a4209bd2f004288946"
	)
	if k != wantKey || fp != wantFP {
		t.Fatalf("KeyOf = %s / %s, want %s / %s", k, fp, wantKey, wantFP)
	}
}

// keyVector is one test vector of KEYS.md (testdata/keys/vectors.json).
type keyVector struct {
	Name   string `json:"name"`
	Intent struct {
		Run     string `json:"run"`
		Step    int64  `json:"step"`
		Kind    string `json:"kind"`
		Target  string `json:"target"`
		Payload *struct {
			JSON   *string `json:"json"`
			RawHex *string `json:"raw_hex"`
		} `json:"payload"`
		PayloadInKey bool `json:"payload_in_key"`
	} `json:"intent"`
	Tag          string  `json:"tag"`
	Canonical    *string `json:"canonical"`
	CanonicalHex string  `json:"canonical_hex"`
	Fingerprint  string  `json:"fingerprint"`
	Key          string  `json:"key"`
}

// intent is the vector's intent as a Go program would write it: JSON as
// a json.RawMessage, raw bytes as []byte.
func (v keyVector) intent(t *testing.T) Intent {
	t.Helper()
	in := Intent{Run: v.Intent.Run, Step: v.Intent.Step, Kind: v.Intent.Kind, Target: v.Intent.Target, PayloadInKey: v.Intent.PayloadInKey}
	switch p := v.Intent.Payload; {
	case p == nil:
	case p.JSON != nil:
		in.Payload = json.RawMessage(*p.JSON)
	case p.RawHex != nil:
		b, err := hex.DecodeString(*p.RawHex)
		if err != nil {
			t.Fatalf("%s: raw_hex: %v", v.Name, err)
		}
		in.Payload = b
	default:
		t.Fatalf("%s: a payload with neither json nor raw_hex", v.Name)
	}
	return in
}

func readVectors(t *testing.T) []keyVector {
	t.Helper()
	b, err := os.ReadFile("testdata/keys/vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var f struct{ Vectors []keyVector }
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Vectors) < 10 {
		t.Fatalf("%d vectors; the file is cut short", len(f.Vectors))
	}
	return f.Vectors
}

// TestKeyVectors checks KeyOf against the vectors of KEYS.md, which were
// computed by a separate implementation (testdata/keys/keyvectors.py).
func TestKeyVectors(t *testing.T) {
	for _, v := range readVectors(t) {
		t.Run(v.Name, func(t *testing.T) {
			in := v.intent(t)
			canon, err := canonicalPayload(in.Payload)
			if err != nil {
				t.Fatal(err)
			}
			if got := hex.EncodeToString(canon); got != v.CanonicalHex {
				t.Errorf("canonical payload %s, want %s", got, v.CanonicalHex)
			}
			if v.Canonical != nil && string(canon) != *v.Canonical {
				t.Errorf("canonical payload %s, want %s", canon, *v.Canonical)
			}
			if got := payloadTag(in.Payload); got != v.Tag {
				t.Errorf("tag %s, want %s", got, v.Tag)
			}
			k, fp := mustKey(t, in)
			if string(fp) != v.Fingerprint || string(k) != v.Key {
				t.Errorf("KeyOf = %s / %s, want %s / %s", k, fp, v.Key, v.Fingerprint)
			}
		})
	}
}

// TestKeyVectorsRelations checks that the vectors show what KEYS.md says
// they show, so that a regenerated file cannot quietly stop showing it.
func TestKeyVectorsRelations(t *testing.T) {
	by := map[string]keyVector{}
	for _, v := range readVectors(t) {
		by[v.Name] = v
	}
	get := func(name string) keyVector {
		v, ok := by[name]
		if !ok {
			t.Fatalf("no vector %q", name)
		}
		return v
	}
	n100, n100dot, n1e2 := get("the number 100"), get("the number 100.0: the same fingerprint as 100"), get("the number 1e2: the same fingerprint as 100")
	if n100.Fingerprint != n100dot.Fingerprint || n100.Fingerprint != n1e2.Fingerprint {
		t.Error("100, 100.0 and 1e2 do not share a fingerprint")
	}
	js, raw := get(`JSON string "hi"`), get(`raw bytes "hi" (with the quotes): the same bytes as JSON "hi", another fingerprint`)
	if js.CanonicalHex != raw.CanonicalHex || js.Fingerprint == raw.Fingerprint {
		t.Error(`raw "hi" and JSON "hi": want the same canonical bytes and different fingerprints`)
	}
	obj, objIn := get("JSON object: keys sorted at every level, arrays kept in order"), get("the same JSON object, PayloadInKey: same fingerprint, another key")
	if obj.Fingerprint != objIn.Fingerprint || obj.Key == objIn.Key {
		t.Error("PayloadInKey: want the same fingerprint and another key")
	}
	none, noneIn := get("no payload"), get("no payload, PayloadInKey")
	if none.CanonicalHex != "" || none.Key == noneIn.Key {
		t.Error("no payload: want an empty canonical payload, and PayloadInKey to change the key")
	}
	uni := get("non-ASCII strings; keys in UTF-16 order, which is not UTF-8 order")
	if i, j := strings.Index(*uni.Canonical, "😀"), strings.Index(*uni.Canonical, "\ufb33"); i < 0 || j < 0 || i > j {
		t.Errorf("%s: want U+1F600 before U+FB33", *uni.Canonical)
	}
}

// TestKeysMDMirrorsVectors: KEYS.md carries the vectors the tests check,
// byte for byte.
func TestKeysMDMirrorsVectors(t *testing.T) {
	md, err := os.ReadFile("KEYS.md")
	if err != nil {
		t.Fatal(err)
	}
	file, err := os.ReadFile("testdata/keys/vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := bytes.Cut(md, []byte("<!-- vectors:begin -->\n```json\n"))
	block, _, ok2 := bytes.Cut(rest, []byte("```\n<!-- vectors:end -->"))
	if !ok || !ok2 {
		t.Fatal("KEYS.md has no vectors block between its markers")
	}
	if !bytes.Equal(block, file) {
		t.Fatal("KEYS.md's vectors differ from testdata/keys/vectors.json; run python3 testdata/keys/keyvectors.py --write")
	}
}

// TestKeysMDWorkedExample rebuilds the hashed bytes KEYS.md lists for its
// worked example and checks them against the example's vector.
func TestKeysMDWorkedExample(t *testing.T) {
	md, err := os.ReadFile("KEYS.md")
	if err != nil {
		t.Fatal(err)
	}
	preimage := func(marker string) []byte {
		_, rest, ok := bytes.Cut(md, []byte(marker+"\n```text\n"))
		block, _, ok2 := bytes.Cut(rest, []byte("```\n"))
		if !ok || !ok2 {
			t.Fatalf("KEYS.md has no block after %s", marker)
		}
		var out []byte
		for line := range strings.Lines(string(block)) {
			f := strings.Fields(line)
			n, err := strconv.ParseUint(f[0], 16, 64)
			if err != nil || len(f[0]) != 16 {
				t.Fatalf("%s: line %q does not start with a 16-digit length", marker, line)
			}
			var data []byte
			if n > 0 {
				if data, err = hex.DecodeString(f[1]); err != nil || uint64(len(data)) != n {
					t.Fatalf("%s: line %q: %d bytes of data, length says %d", marker, line, len(data), n)
				}
			}
			out = binary.BigEndian.AppendUint64(out, n)
			out = append(out, data...)
		}
		return out
	}
	var v keyVector
	for _, x := range readVectors(t) {
		if x.Name == "the number 100" {
			v = x
		}
	}
	fsum := sha256.Sum256(preimage("<!-- preimage:fingerprint -->"))
	ksum := sha256.Sum256(preimage("<!-- preimage:key -->"))
	if hex.EncodeToString(fsum[:]) != v.Fingerprint || hex.EncodeToString(ksum[:]) != v.Key {
		t.Fatalf("the worked example hashes to %x / %x, its vector says %s / %s", fsum, ksum, v.Fingerprint, v.Key)
	}
	if _, fp := mustKey(t, v.intent(t)); string(fp) != v.Fingerprint {
		t.Fatalf("KeyOf gives fingerprint %s", fp)
	}
}

func TestKeyUnambiguous(t *testing.T) {
	pairs := [][2]Intent{
		{{Run: "a b", Kind: "c"}, {Run: "a", Kind: "b c"}},
		{{Run: "a", Kind: "b", Target: "c"}, {Run: "a", Kind: "bc"}},
		{{Run: "a", Kind: "b", Target: ""}, {Run: "a", Kind: "b", Target: " "}},
		{{Run: "r", Step: 1, Kind: "k"}, {Run: "r", Step: 10, Kind: "k"}},
		{{Run: "r1", Step: 1, Kind: "k"}, {Run: "r", Step: 11, Kind: "k"}},
		{{Run: "r", Kind: "k", Payload: "x"}, {Run: "r", Kind: "k", Payload: "x", PayloadInKey: true}},
		{{Run: "r", Kind: "k", Payload: "x", PayloadInKey: true}, {Run: "r", Kind: "k", Payload: "y", PayloadInKey: true}},
		{{Run: "r", Kind: "k", Payload: "hi", PayloadInKey: true}, {Run: "r", Kind: "k", Payload: []byte(`"hi"`), PayloadInKey: true}},
	}
	for _, p := range pairs {
		k1, _ := mustKey(t, p[0])
		k2, _ := mustKey(t, p[1])
		if k1 == k2 {
			t.Errorf("%+v and %+v share key %s", p[0], p[1], k1)
		}
	}
}

func TestPayloadDoesNotChangeKeyByDefault(t *testing.T) {
	a := Intent{Run: "r", Kind: "send_email", Target: "t", Payload: "first body"}
	b := a
	b.Payload = "a body the model rewrote"
	ka, fa := mustKey(t, a)
	kb, fb := mustKey(t, b)
	if ka != kb || fa == fb {
		t.Fatalf("default mode: want same key, different fingerprints; got keys equal=%v fingerprints equal=%v", ka == kb, fa == fb)
	}
}

func fingerprintOf(t *testing.T, p any) Fingerprint {
	t.Helper()
	_, fp := mustKey(t, Intent{Run: "r", Kind: "k", Payload: p})
	return fp
}

func TestCanonicalPayload(t *testing.T) {
	type mail struct {
		To      string `json:"to"`
		Subject string `json:"subject"`
	}
	equal := []any{
		map[string]any{"subject": "hi", "to": "ada"},
		mail{To: "ada", Subject: "hi"},
		&mail{To: "ada", Subject: "hi"},
		json.RawMessage(`{"to":"ada","subject":"hi"}`),
		json.RawMessage("  {\n \"subject\" : \"hi\", \"to\":\"ada\" }  "),
		json.RawMessage(`{"\u0074o":"\u0061da","subject":"h\u0069"}`),
	}
	want := fingerprintOf(t, equal[0])
	for _, p := range equal[1:] {
		if got := fingerprintOf(t, p); got != want {
			t.Errorf("payload %#v fingerprints %s, want %s", p, got, want)
		}
	}
	// Numbers equal as values hash equal, whatever their notation.
	numbers := []any{100, 100.0, float32(100), json.Number("100"), json.RawMessage(`100`), json.RawMessage(`100.0`), json.RawMessage(`1e2`), json.RawMessage(`1E+2`), json.RawMessage(`10000e-2`)}
	want = fingerprintOf(t, numbers[0])
	for _, p := range numbers[1:] {
		if got := fingerprintOf(t, p); got != want {
			t.Errorf("number %#v fingerprints %s, want that of 100, %s", p, got, want)
		}
	}
	if fingerprintOf(t, json.RawMessage(`-0`)) != fingerprintOf(t, 0) {
		t.Error("-0 and 0 hash apart")
	}
	// Raw bytes are taken as they are: whitespace matters, and any bytes go.
	if fingerprintOf(t, []byte(`{"a":1}`)) == fingerprintOf(t, []byte(`{"a": 1}`)) {
		t.Error("raw bytes were canonicalised")
	}
	fingerprintOf(t, []byte{0xff, 0x00, 0xfe})
	// Raw bytes and JSON are tagged apart, even where their bytes agree.
	if fingerprintOf(t, []byte(`"hi"`)) == fingerprintOf(t, "hi") || fingerprintOf(t, []byte(`{"a":1}`)) == fingerprintOf(t, json.RawMessage(`{"a":1}`)) {
		t.Error("raw bytes and JSON with the same bytes share a fingerprint")
	}
	// No payload is zero raw bytes.
	if fingerprintOf(t, nil) != fingerprintOf(t, []byte{}) || fingerprintOf(t, nil) != fingerprintOf(t, []byte(nil)) {
		t.Error("nil, []byte(nil) and []byte{} hash apart")
	}
	// Values encoding/json would not emit are not looked at.
	type quiet struct {
		Shown  string
		Hidden string `json:"-"`
		inner  string
		Blob   []byte
	}
	if got := fingerprintOf(t, quiet{Shown: "x", Hidden: "\xff", inner: "\xfe", Blob: []byte{0xff}}); got != fingerprintOf(t, json.RawMessage(`{"Blob":"/w==","Shown":"x"}`)) {
		t.Error("fields encoding/json leaves out changed the fingerprint")
	}
	for in, want := range map[string]string{
		`{"z":"<&>","a":1}`:                             `{"a":1,"z":"<&>"}`,
		`"\u001F\u00e9\/\u2028"`:                        "\"\\u001f\u00e9/\u2028\"",
		`[1e21,1e-7,0.000001,4.50,-0.0]`:                `[1e+21,1e-7,0.000001,4.5,0]`,
		`{"b":{"d":[3,{"f":1,"e":2}],"c":null},"a":[]}`: `{"a":[],"b":{"c":null,"d":[3,{"e":2,"f":1}]}}`,
	} {
		c, err := canonicalPayload(json.RawMessage(in))
		if err != nil || string(c) != want {
			t.Errorf("canonical form of %s = %s (%v), want %s", in, c, err, want)
		}
	}
}

type textWithBadBytes struct{}

func (textWithBadBytes) MarshalText() ([]byte, error) { return []byte("a\xffb"), nil }

type goodJSON struct{ secret string }

func (goodJSON) MarshalJSON() ([]byte, error) { return []byte(`"fine"`), nil }

type badJSON struct{}

func (badJSON) MarshalJSON() ([]byte, error) { return []byte("\"a\xffb\""), nil }

func TestPayloadRefused(t *testing.T) {
	type inner struct{ Subject string }
	type outer struct {
		inner
		Items []inner
	}
	cases := []struct {
		name    string
		payload any
		says    string
	}{
		{"invalid UTF-8 in JSON text", json.RawMessage("{\"a\":\"x\xffy\"}"), "not valid UTF-8 (byte 7 is 0xff)"},
		{"invalid UTF-8 outside strings", json.RawMessage("[1,\xc0]"), "not valid UTF-8"},
		{"an encoded surrogate", json.RawMessage("\"\xed\xa0\x80\""), "not valid UTF-8"},
		{"invalid UTF-8 in a string", "caf\xe9", `a string that is not valid UTF-8 (at the top level, byte 3 is 0xe9`},
		{"invalid UTF-8 in a nested string", map[string]any{"x": []any{"ok", map[string]string{"k": "a\xffb"}}}, `at ["x"][1]["k"]`},
		{"invalid UTF-8 in a map key", map[string]int{"k\xff": 1}, "a map key that is not valid UTF-8"},
		{"invalid UTF-8 in a field", outer{Items: []inner{{"ok"}, {"\xfe"}}}, "at .Items[1].Subject"},
		{"invalid UTF-8 in an embedded field", &outer{inner: inner{"\xfe"}}, "at .inner.Subject"},
		{"invalid UTF-8 from MarshalText", []any{textWithBadBytes{}}, "the text of a MarshalText that is not valid UTF-8 (at [0]"},
		{"invalid UTF-8 from a MarshalText map key", map[textWithBadBytes]int{{}: 1}, "map key's MarshalText"},
		{"invalid UTF-8 from MarshalJSON", []any{badJSON{}}, "encodes to JSON that is not valid UTF-8"},
		{"invalid UTF-8 in a nested json.RawMessage", struct{ R json.RawMessage }{json.RawMessage("\"\xff\"")}, "encodes to JSON that is not valid UTF-8"},
		{"duplicate keys", json.RawMessage(`{"a":1,"a":2}`), `Duplicate key: "a"`},
		{"duplicate keys once unescaped", json.RawMessage(`{"a":1,"\u0061":2}`), "Duplicate key"},
		{"an unpaired surrogate", json.RawMessage(`"\udc00"`), "surrogate"},
		{"a number out of range", json.RawMessage(`[1e400]`), "out of range"},
		{"a number that would lose digits", json.RawMessage(`{"id":12345678901234567891}`), "12345678901234567891, which canonical JSON (RFC 8785) would change to 12345678901234567000"},
		{"a Go integer past 2^53", uint64(1<<60 + 1), "would change to 1152921504606847000"},
		{"a number that would underflow", json.RawMessage(`1e-400`), "would change to 0"},
		{"a number with more precision than a double", json.RawMessage(`0.10000000000000000001`), "would change to 0.1"},
		{"the RFC's own overlong number", json.RawMessage(`333333333.33333329`), "would change to 333333333.3333333"},
		{"empty JSON text", json.RawMessage(``), "is empty"},
		{"blank JSON text", json.RawMessage(" \n"), "is empty"},
		{"trailing data", json.RawMessage(`{} {}`), "RFC 8785"},
		{"not JSON", json.RawMessage(`{"a":}`), "RFC 8785"},
		{"a value encoding/json refuses", make(chan int), "cannot be encoded as JSON"},
		{"a NaN", math.NaN(), "cannot be encoded as JSON"},
		{"deep nesting", json.RawMessage(strings.Repeat("[", 10001) + strings.Repeat("]", 10001)), "nesting"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := KeyOf(Intent{Run: "r", Kind: "k", Payload: c.payload})
			var ie *IntentError
			if !errors.As(err, &ie) || ie.Field != "Payload" || !errors.Is(err, ErrInvalidIntent) {
				t.Fatalf("KeyOf = %v, want an *IntentError for Payload", err)
			}
			if !strings.Contains(ie.Reason, c.says) {
				t.Fatalf("reason %q does not say %q", ie.Reason, c.says)
			}
		})
	}
	// What is not refused: a json.Marshaler whose output is fine, whatever
	// it holds, and U+FFFD itself.
	for _, p := range []any{goodJSON{secret: "\xff"}, "\ufffd", json.RawMessage(`"\ufffd"`), 1 << 53, -(1 << 53), json.RawMessage(`999999999999999900000`), json.RawMessage(`0e99999999999999999999`), json.RawMessage(`-0.000e-5`)} {
		if _, _, err := KeyOf(Intent{Run: "r", Kind: "k", Payload: p}); err != nil {
			t.Errorf("payload %#v refused: %v", p, err)
		}
	}
}

func TestKeyOfRefusesBadInput(t *testing.T) {
	_, _, err := KeyOf(Intent{Run: "", Kind: "k"})
	var ie *IntentError
	if !errors.As(err, &ie) || ie.Field != "Run" || !errors.Is(err, ErrInvalidIntent) {
		t.Fatalf("KeyOf with empty run = %v", err)
	}
	if _, _, err := KeyOf(Intent{Run: "r", Kind: "k", Payload: json.RawMessage(`{} {}`)}); err == nil {
		t.Fatal("trailing JSON accepted")
	}
}

// TestJCSExamples holds the canonicaliser to RFC 8785's own examples
// (sections 3.2.2 and 3.2.3), without once's refusal of numbers it would
// change: one of them, 333333333.33333329, is such a number.
func TestJCSExamples(t *testing.T) {
	b, err := os.ReadFile("testdata/jcs/rfc8785-examples.json")
	if err != nil {
		t.Fatal(err)
	}
	var examples []struct{ Name, Input, Output, OutputHex string }
	if err := json.Unmarshal(b, &examples); err != nil || len(examples) < 2 {
		t.Fatalf("%d examples: %v", len(examples), err)
	}
	for _, e := range examples {
		got, err := jcs.Transform([]byte(e.Input))
		if err != nil || string(got) != e.Output {
			t.Errorf("%s: %s (%v), want %s", e.Name, got, err, e.Output)
		}
		if e.OutputHex != "" && hex.EncodeToString(got) != e.OutputHex {
			t.Errorf("%s: bytes %x, want %s", e.Name, got, e.OutputHex)
		}
	}
}

// TestJCSNumbers holds number serialisation to RFC 8785's Appendix B and
// to a sample that ECMAScript itself serialised (testdata/jcs/es-numbers.js).
// Each canonical text is accepted as it is; the double's 17-digit text is
// accepted exactly when it is the same decimal value, by math/big's count.
func TestJCSNumbers(t *testing.T) {
	for _, file := range []string{"testdata/jcs/rfc8785-numbers.txt", "testdata/jcs/es-numbers.txt"} {
		f, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		n := 0
		for sc := bufio.NewScanner(f); sc.Scan(); {
			line := sc.Text()
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			n++
			h, want, _ := strings.Cut(line, ",")
			bits, err := strconv.ParseUint(h, 16, 64)
			if err != nil {
				t.Fatalf("%s: %q: %v", file, line, err)
			}
			x := math.Float64frombits(bits)
			got, err := jcs.NumberToJSON(x)
			if want == "" {
				if err == nil {
					t.Errorf("%s: %s serialised as %s; want it refused", file, h, got)
				}
				continue
			}
			if err != nil || got != want {
				t.Errorf("%s: %s serialised as %s (%v), want %s", file, h, got, err, want)
				continue
			}
			if c, err := canonicalPayload(json.RawMessage(want)); err != nil || string(c) != want {
				t.Errorf("%s: canonical text %s gave %s (%v)", file, want, c, err)
			}
			long := strconv.FormatFloat(x, 'e', 16, 64)
			a, _ := new(big.Rat).SetString(long)
			b, _ := new(big.Rat).SetString(want)
			c, err := canonicalPayload(json.RawMessage(long))
			if same := a.Cmp(b) == 0; same != (err == nil) || err == nil && string(c) != want {
				t.Errorf("%s: %s is %s as %s; canonical %s, %v", file, long, map[bool]string{true: "equal", false: "not equal"}[same], want, c, err)
			}
		}
		if n < 20 {
			t.Fatalf("%s: %d numbers; the file is cut short", file, n)
		}
	}
}

func FuzzKey(f *testing.F) {
	f.Add("run", int64(0), "send_email", "ada@example.com", []byte(`{"a":1}`), "run", int64(0), "send_email", "ada@example.com", []byte(`{"a":1}`), false)
	f.Add("a b", int64(1), "c", "", []byte(nil), "a", int64(1), "b c", "", []byte(nil), true)
	f.Add("r", int64(7), "k", "t", []byte(`{"b":[1,2.50,"\u00e9"],"a":{"y":1e2,"x":null}}`), "r", int64(7), "k", "t", []byte(`{"a":{"x":null,"y":100},"b":[1,2.5,"é"]}`), true)
	f.Add("r", int64(0), "k", "", []byte("\"\xff\""), "r", int64(0), "k", "", []byte(`"\ud83d\ude00"`), false)
	f.Fuzz(func(t *testing.T, r1 string, s1 int64, k1, t1 string, p1 []byte, r2 string, s2 int64, k2, t2 string, p2 []byte, inKey bool) {
		// Raw bytes: fingerprints equal exactly when the bytes are.
		a := Intent{Run: r1, Step: s1, Kind: k1, Target: t1, Payload: p1, PayloadInKey: inKey}
		b := Intent{Run: r2, Step: s2, Kind: k2, Target: t2, Payload: p2, PayloadInKey: inKey}
		ka, fa, errA := KeyOf(a)
		kb, fb, errB := KeyOf(b)
		if errA == nil && errB == nil {
			sameIdentity := r1 == r2 && s1 == s2 && k1 == k2 && t1 == t2
			samePayload := string(p1) == string(p2)
			if (fa == fb) != samePayload {
				t.Fatalf("fingerprints equal=%v for payloads equal=%v", fa == fb, samePayload)
			}
			want := sameIdentity && (!inKey || samePayload)
			if (ka == kb) != want {
				t.Fatalf("keys equal=%v, want %v for %+v and %+v", ka == kb, want, a, b)
			}
			if again, _, _ := KeyOf(a); again != ka {
				t.Fatal("key not deterministic")
			}
		}
		// The same bytes as JSON text, and as a string in a Go value.
		for _, p := range [][]byte{p1, p2} {
			checkJSONPayload(t, p)
			_, _, err := KeyOf(Intent{Run: "r", Kind: "k", Payload: string(p)})
			if utf8.Valid(p) != (err == nil) {
				t.Fatalf("string payload %q: valid UTF-8 %v, refused: %v", p, utf8.Valid(p), err)
			}
		}
	})
}

// checkJSONPayload checks what canonical form promises for the JSON text
// p: invalid UTF-8 is refused; what is accepted is canonical, valid UTF-8,
// and a fixed point; and equal values hash equal, whether given as the
// text, as its canonical form, or as encoding/json's re-encoding of the
// parsed value.
func checkJSONPayload(t *testing.T, p []byte) {
	t.Helper()
	in := Intent{Run: "r", Kind: "k", Payload: json.RawMessage(p)}
	_, fp, err := KeyOf(in)
	if !utf8.Valid(p) {
		if err == nil {
			t.Fatalf("JSON text %q is not UTF-8 and was accepted", p)
		}
		return
	}
	if err != nil {
		var ie *IntentError
		if !errors.As(err, &ie) || ie.Field != "Payload" {
			t.Fatalf("JSON text %q refused with %v, want an *IntentError for Payload", p, err)
		}
		return
	}
	canon, err := canonicalPayload(json.RawMessage(p))
	if err != nil || !utf8.Valid(canon) {
		t.Fatalf("canonical form of %q: %q, %v", p, canon, err)
	}
	again, err := canonicalPayload(json.RawMessage(canon))
	if err != nil || !bytes.Equal(again, canon) {
		t.Fatalf("canon(canon(%q)) = %q (%v), want %q", p, again, err, canon)
	}
	if _, fp2 := mustKey(t, Intent{Run: "r", Kind: "k", Payload: json.RawMessage(canon)}); fp2 != fp {
		t.Fatalf("%q and its canonical form %q hash apart", p, canon)
	}
	// A round trip through encoding/json changes the text (its own key
	// order, escapes and number forms) but not the value.
	dec := json.NewDecoder(bytes.NewReader(p))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("accepted %q, which encoding/json cannot read: %v", p, err)
	}
	re, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("encoding/json cannot write back %q: %v", p, err)
	}
	if _, fp3, err := KeyOf(Intent{Run: "r", Kind: "k", Payload: json.RawMessage(re)}); err != nil || fp3 != fp {
		t.Fatalf("%q and its re-encoding %q hash apart (%v)", p, re, err)
	}
	if _, fp4, err := KeyOf(Intent{Run: "r", Kind: "k", Payload: v}); err != nil || fp4 != fp {
		t.Fatalf("%q and its parsed value hash apart (%v)", p, err)
	}
	// Read with float64 numbers, the value is one the canonical shortcut
	// writes itself (maps, slices, strings, float64s): it must hash as
	// the text does, since every number the text was accepted with is
	// one a double holds.
	var f any
	if err := json.Unmarshal(p, &f); err != nil {
		t.Fatalf("accepted %q, which encoding/json cannot read: %v", p, err)
	}
	if _, fp5, err := KeyOf(Intent{Run: "r", Kind: "k", Payload: f}); err != nil || fp5 != fp {
		t.Fatalf("%q and its value read with float64 numbers hash apart (%v)", p, err)
	}
}

func TestNewValidatesConfig(t *testing.T) {
	if _, err := New(Config{}); err == nil || !strings.Contains(err.Error(), "Config.Store") {
		t.Fatalf("New without a store = %v", err)
	}
}
