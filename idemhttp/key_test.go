package idemhttp_test

import (
	"strings"
	"testing"

	"github.com/oncehq/once/idemhttp"
)

func TestParseKey(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{`abc`, "abc", true},
		{`"abc"`, "abc", true},
		{`"a b"`, "a b", true},
		{`8e03978e-40d5-43e8-bc93-6894a57f9324`, "8e03978e-40d5-43e8-bc93-6894a57f9324", true},
		{strings.Repeat("k", 255), strings.Repeat("k", 255), true},
		{`"` + strings.Repeat("k", 255) + `"`, strings.Repeat("k", 255), true},
		{strings.Repeat("k", 256), "", false},
		{``, "", false},
		{`""`, "", false},
		{`"`, "", false},
		{`"abc`, "", false},
		{`a b`, "", false},
		{`"a\"b"`, "", false},
		{`a\b`, "", false},
		{"a\tb", "", false},
		{"caf\u00e9", "", false},
	} {
		got, err := idemhttp.ParseKey(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseKey(%q) = %q, %v; want %q, ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "Idempotency-Key") {
			t.Errorf("ParseKey(%q): error %q does not name the header", tc.in, err)
		}
	}
}

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{`abc`, `"abc"`, `""`, `"`, `"a\"b"`, "a\x00b", strings.Repeat("k", 256)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		k, err := idemhttp.ParseKey(v)
		if err != nil {
			if k != "" {
				t.Fatalf("ParseKey(%q) returned %q with error %v", v, k, err)
			}
			return
		}
		if len(k) < 1 || len(k) > idemhttp.MaxKeyLength {
			t.Fatalf("ParseKey(%q) accepted a key of %d bytes", v, len(k))
		}
		for i := 0; i < len(k); i++ {
			if c := k[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
				t.Fatalf("ParseKey(%q) accepted %q, which has byte 0x%02x", v, k, c)
			}
		}
		// The structured-field spelling of an accepted key is the same key.
		if q, err := idemhttp.ParseKey(`"` + k + `"`); err != nil || q != k {
			t.Fatalf("ParseKey of %q quoted = %q, %v; want %q", k, q, err, k)
		}
	})
}
