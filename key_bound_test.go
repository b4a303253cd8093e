package once

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
)

// nested returns a []any nested depth levels deep around leaf.
func nested(depth int, leaf any) any {
	v := leaf
	for range depth {
		v = []any{v}
	}
	return v
}

// envDeepChild asks the test binary, started again, to key a Go value
// nested a million levels deep and to print what KeyOf said. A stack
// overflow is fatal to a Go process, so the test that could meet one
// runs it in a process of its own.
const envDeepChild = "ONCE_KEY_DEEP_CHILD"

// TestKeyOfRefusesDeepGoValue: a Go value nested far deeper than JSON
// text may nest is refused, naming the limit, as the JSON text is; it
// does not overflow the stack.
func TestKeyOfRefusesDeepGoValue(t *testing.T) {
	if os.Getenv(envDeepChild) != "" {
		_, _, err := KeyOf(Intent{Run: "r", Kind: "k", Payload: nested(1_000_000, 1)})
		os.Stdout.WriteString("KeyOf: " + errString(err) + "\n")
		os.Exit(0)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestKeyOfRefusesDeepGoValue$")
	cmd.Env = append(os.Environ(), envDeepChild+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the child keying a value nested 10^6 deep died (%v):\n%.2000s", err, out)
	}
	if !strings.Contains(string(out), "KeyOf: once: invalid intent: Payload nests deeper than 10000 levels") {
		t.Fatalf("the child said:\n%.2000s\nwant a refusal naming the limit of 10000 levels", out)
	}

	// The limit is the one JSON text has: 10000 levels are taken, in a Go
	// value and in text alike, and 10001 are refused by both.
	for _, depth := range []int{MaxPayloadDepth, MaxPayloadDepth + 1} {
		text := json.RawMessage(strings.Repeat("[", depth) + "1" + strings.Repeat("]", depth))
		for _, p := range []any{nested(depth, 1), text} {
			_, _, err := KeyOf(Intent{Run: "r", Kind: "k", Payload: p})
			if depth <= MaxPayloadDepth {
				if err != nil {
					t.Errorf("a %T nested %d deep refused: %v", p, depth, err)
				}
				continue
			}
			var ie *IntentError
			if !errors.As(err, &ie) || ie.Field != "Payload" || !strings.Contains(ie.Reason, "10000") {
				t.Errorf("a %T nested %d deep: %v, want an *IntentError for Payload naming 10000", p, depth, err)
			}
		}
	}

	// A value that holds itself is refused the same way, as it was when
	// encoding/json refused it.
	loop := map[string]any{}
	loop["again"] = loop
	self := new(any)
	*self = self
	for _, p := range []any{loop, self} {
		_, _, err := KeyOf(Intent{Run: "r", Kind: "k", Payload: p})
		if !errors.Is(err, ErrInvalidIntent) || !strings.Contains(err.Error(), "refers to itself") {
			t.Errorf("a %T that holds itself: %v, want it refused", p, err)
		}
	}
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// TestKeyOfRefusesLargeTextBeforeReading: JSON text over the payload
// limit is refused before it is canonicalised, so refusing it allocates
// far less than the text's size (it allocated 26 times the text).
func TestKeyOfRefusesLargeTextBeforeReading(t *testing.T) {
	const size = 16 << 20
	text := make([]byte, 0, size)
	text = append(text, '[')
	for len(text) < size-8 {
		text = append(text, `"abcd",`...)
	}
	text = append(text, `"e"]`...)
	big := map[string]string{"k": strings.Repeat("x", size)}
	for _, p := range []any{json.RawMessage(text), big, []any{big, json.Number("1")}} {
		var err error
		allocated := bytesAllocated(func() {
			_, _, err = KeyOf(Intent{Run: "r", Kind: "k", Payload: p})
		})
		var ie *IntentError
		if !errors.As(err, &ie) || ie.Field != "Payload" || !strings.Contains(ie.Reason, "over the limit of 1048576") {
			t.Fatalf("a %T of %d bytes: %v, want it refused as over the limit", p, size, err)
		}
		t.Logf("refusing a %T of %d bytes allocated %d bytes", p, size, allocated)
		// Text is refused unread. A Go value is encoded once, as
		// encoding/json encodes it (4 times its size here, 6 under the
		// race detector), but not canonicalised (17 times its size).
		if _, raw := p.(json.RawMessage); raw && allocated > DefaultMaxPayloadBytes {
			t.Errorf("refusing %d bytes of JSON text allocated %d bytes; want less than the limit, %d", size, allocated, DefaultMaxPayloadBytes)
		} else if allocated > 10*size {
			t.Errorf("refusing a %T of %d bytes allocated %d bytes; want at most 10 times its size", p, size, allocated)
		}
	}
}

// bytesAllocated returns how many bytes the heap gave out while f ran.
func bytesAllocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// dagNode is a value that shares its parts: both children of a node are
// the same node, so a value of n nodes encodes to 2^n leaves.
type dagNode struct {
	L, R *dagNode
	S    string
}

// sharedText marshals itself to text it shares with every other one.
type sharedText struct{ text []byte }

func (s sharedText) MarshalText() ([]byte, error) { return s.text, nil }

// textKey is a map key that marshals itself to a long text, each key's
// a little shorter than the last one's, all sharing one array.
type textKey struct{ n int }

var textKeyText = []byte(strings.Repeat("k", 1<<19))

func (k textKey) MarshalText() ([]byte, error) { return textKeyText[:len(textKeyText)-k.n], nil }

// embedNode embeds two pointers that lead back to embedNode: encoding/json
// promotes no field of them (they conflict), so a value of them writes
// "{}" however deep, while a walk that follows them visits 2^n nodes.
// It is refused for the pointers it follows: before, KeyOf never
// returned.
type embedNode struct {
	*EmbedLeft
	*EmbedRight
}

type EmbedLeft struct{ *embedNode }
type EmbedRight struct{ *embedNode }

// TestKeyOfRefusesSharedParts: a Go value that shares its parts (one
// string in many places, a node that is both children of its parent) is
// small in memory and encodes to far more than the limit. It is refused
// before it is encoded: before, the shortcut and encoding/json wrote it
// out whole (256 MB to 512 MB allocated for a value of well under 1 MB),
// and a node shared 40 levels deep would be written out for ever.
func TestKeyOfRefusesSharedParts(t *testing.T) {
	half := strings.Repeat("x", 1<<19)
	strs := make([]string, 512)
	bytesList := make([][]byte, 512)
	general := []any{json.Number("1")} // json.Number takes the general path
	raws := make([]json.RawMessage, 512)
	texts := make([]sharedText, 512)
	textKeys := map[textKey]int{}
	rawHalf := json.RawMessage(`"` + half + `"`)
	for i := range strs {
		strs[i] = half
		bytesList[i] = []byte(half[:1<<18])
		general = append(general, half)
		raws[i] = rawHalf
		texts[i] = sharedText{[]byte(half)}
		textKeys[textKey{i}] = i
	}
	leaf := &dagNode{S: strings.Repeat("y", 100)}
	node := leaf
	for range 20 {
		node = &dagNode{L: node, R: node}
	}
	deep := leaf
	for range 40 {
		deep = &dagNode{L: deep, R: deep}
	}
	embedded := &embedNode{}
	for range 40 {
		embedded = &embedNode{&EmbedLeft{embedded}, &EmbedRight{embedded}}
	}
	tree := any([]any{json.Number("1"), strings.Repeat("y", 100)})
	for range 20 {
		tree = []any{tree, tree}
	}
	for name, p := range map[string]any{
		"one string 512 times": strs, "one []byte 512 times": bytesList, "one string 512 times, general path": general, "one json.RawMessage 512 times": raws,
		"one MarshalText 512 times": texts, "512 map keys of MarshalText": textKeys,
		"a node shared 20 levels deep": node, "a node shared 40 levels deep": deep, "embedded pointers shared 40 levels deep": embedded, "a []any shared 20 levels deep": tree,
	} {
		var err error
		allocated := bytesAllocated(func() {
			_, _, err = KeyOf(Intent{Run: "r", Kind: "k", Payload: p})
		})
		want := "over the limit of 1048576"
		if p == any(embedded) {
			want = "follows more than 1048576 embedded struct pointers"
		}
		var ie *IntentError
		if !errors.As(err, &ie) || ie.Field != "Payload" || !strings.Contains(ie.Reason, want) {
			t.Errorf("%s: %v, want it refused: %s", name, err, want)
		}
		t.Logf("%s: refused after allocating %d bytes", name, allocated)
		if allocated > 16*DefaultMaxPayloadBytes {
			t.Errorf("%s: refusing it allocated %d bytes; want at most 16 times the limit (%d)", name, allocated, 16*DefaultMaxPayloadBytes)
		}
	}
}
