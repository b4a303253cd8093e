package once

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
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
	// Computed independently from the documented encoding (see doc.go).
	const (
		wantKey = "0a3c3c42b6236f4ce825ed6954cf0ff3f9df2e723e31a81d485a3f26b34bf790"
		wantFP  = "1b9565f2e170e86a7524d3b864f3506c3cee7192d334e1447ab8901a4eff471e"
	)
	if k != wantKey || fp != wantFP {
		t.Fatalf("KeyOf = %s / %s, want %s / %s", k, fp, wantKey, wantFP)
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

func TestCanonicalPayload(t *testing.T) {
	type mail struct {
		To      string `json:"to"`
		Subject string `json:"subject"`
	}
	equal := []any{
		map[string]any{"subject": "hi", "to": "ada"},
		mail{To: "ada", Subject: "hi"},
		json.RawMessage(`{"to":"ada","subject":"hi"}`),
		json.RawMessage("  {\n \"subject\" : \"hi\", \"to\":\"ada\" }  "),
	}
	_, want := mustKey(t, Intent{Run: "r", Kind: "k", Payload: equal[0]})
	for _, p := range equal[1:] {
		if _, got := mustKey(t, Intent{Run: "r", Kind: "k", Payload: p}); got != want {
			t.Errorf("payload %#v fingerprints %s, want %s", p, got, want)
		}
	}
	// Raw bytes are taken as they are: whitespace matters.
	_, r1 := mustKey(t, Intent{Run: "r", Kind: "k", Payload: []byte(`{"a":1}`)})
	_, r2 := mustKey(t, Intent{Run: "r", Kind: "k", Payload: []byte(`{"a": 1}`)})
	if r1 == r2 {
		t.Error("raw bytes were canonicalised")
	}
	// Big numbers keep their digits.
	_, n1 := mustKey(t, Intent{Run: "r", Kind: "k", Payload: json.RawMessage(`{"n":12345678901234567890}`)})
	_, n2 := mustKey(t, Intent{Run: "r", Kind: "k", Payload: json.RawMessage(`{"n":12345678901234567891}`)})
	if n1 == n2 {
		t.Error("large integers lost precision in the fingerprint")
	}
	c, _ := canonicalPayload(map[string]any{"z": "<&>", "a": 1})
	if string(c) != `{"a":1,"z":"<&>"}` {
		t.Errorf("canonical form %s", c)
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

func TestNewValidatesConfig(t *testing.T) {
	if _, err := New(Config{}); err == nil || !strings.Contains(err.Error(), "Config.Store") {
		t.Fatalf("New without a store = %v", err)
	}
}

func FuzzKey(f *testing.F) {
	f.Add("run", int64(0), "send_email", "ada@example.com", []byte(`{"a":1}`), "run", int64(0), "send_email", "ada@example.com", []byte(`{"a":1}`), false)
	f.Add("a b", int64(1), "c", "", []byte(nil), "a", int64(1), "b c", "", []byte(nil), true)
	f.Fuzz(func(t *testing.T, r1 string, s1 int64, k1, t1 string, p1 []byte, r2 string, s2 int64, k2, t2 string, p2 []byte, inKey bool) {
		a := Intent{Run: r1, Step: s1, Kind: k1, Target: t1, Payload: p1, PayloadInKey: inKey}
		b := Intent{Run: r2, Step: s2, Kind: k2, Target: t2, Payload: p2, PayloadInKey: inKey}
		ka, fa, errA := KeyOf(a)
		kb, fb, errB := KeyOf(b)
		if errA != nil || errB != nil {
			return // refused input is tested elsewhere; here: no panic
		}
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
	})
}
