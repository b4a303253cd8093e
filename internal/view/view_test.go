package view_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/view"
)

func TestDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		500 * time.Millisecond:                       "<1s",
		42 * time.Second:                             "42s",
		5*time.Minute + 3*time.Second:                "5m 3s",
		2*time.Hour + 10*time.Minute + 9*time.Second: "2h 10m",
		47 * time.Hour:                               "47h 0m",
		3*24*time.Hour + 4*time.Hour + time.Minute:   "3d 4h",
	} {
		if got := view.Duration(d); got != want {
			t.Errorf("Duration(%v) = %q, want %q", d, got, want)
		}
	}
	if got := view.Ago(time.Now().Add(-(90*time.Minute + 20*time.Second))); got != "1h 30m ago" {
		t.Errorf("Ago(90m ago) = %q", got)
	}
	if got := view.Ago(time.Now().Add(10*time.Minute + 30*time.Second)); !strings.HasPrefix(got, "in 10m ") {
		t.Errorf("Ago(in 10m) = %q", got)
	}
	if view.Ago(time.Time{}) != "" || view.Time(time.Time{}) != "" {
		t.Errorf("a zero time is not shown as empty")
	}
	at := time.Date(2024, 3, 1, 14, 5, 9, 0, time.FixedZone("CET", 3600))
	if got := view.Time(at); got != "2024-03-01 13:05:09" {
		t.Errorf("Time = %q, want UTC to the second", got)
	}
}

func TestShortKeyAndStatusList(t *testing.T) {
	key, _, err := once.KeyOf(once.Intent{Run: "r", Kind: "k"})
	if err != nil {
		t.Fatal(err)
	}
	if got := view.ShortKey(key); len(got) != view.ShortKeyLen || !strings.HasPrefix(string(key), got) {
		t.Errorf("ShortKey(%s) = %q", key, got)
	}
	if got := view.ShortKey("abc"); got != "abc" {
		t.Errorf("ShortKey of a short string = %q", got)
	}
	list := view.StatusList()
	for _, s := range once.Statuses() {
		if !strings.Contains(list, string(s)) {
			t.Errorf("StatusList %q lacks %s", list, s)
		}
	}
}

func TestActionsJSON(t *testing.T) {
	at := time.Date(2024, 3, 1, 14, 5, 9, 0, time.UTC)
	as := []once.Action{
		{Key: "k1", Status: once.StatusSucceeded, Payload: []byte(`{"to":"ada"}`), CreatedAt: at},
		{Key: "k2", Status: once.StatusReview, Payload: []byte{0xff, 0x00}, CreatedAt: at},
		{Key: "k3", Status: once.StatusReview, Payload: []byte("plain text, not JSON"), CreatedAt: at},
	}
	var buf bytes.Buffer
	if err := view.Encode(&buf, view.Actions(as)); err != nil {
		t.Fatal(err)
	}
	var got []map[string]any
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatalf("%v: %s", err, buf.Bytes())
	}
	// A JSON payload is JSON in the output, not a string holding JSON;
	// other text is payload_text, other bytes payload_base64.
	obj, _ := got[0]["payload"].(map[string]any)
	if len(got) != 3 || obj["to"] != "ada" || got[1]["payload_base64"] != "/wA=" || got[1]["payload"] != nil ||
		got[2]["payload_text"] != "plain text, not JSON" || got[2]["payload"] != nil ||
		got[0]["created_at"] != "2024-03-01T14:05:09Z" || got[0]["completed_at"] != nil || got[0]["events"] != nil {
		t.Errorf("Actions as JSON: %s", buf.Bytes())
	}
	if !strings.Contains(buf.String(), "\n  {") {
		t.Errorf("Encode does not indent: %s", buf.Bytes())
	}
}

// TestTerminal: control, bidi and separator characters are written as
// escapes; other text, non-ASCII included, is left as it is.
func TestTerminal(t *testing.T) {
	for in, want := range map[string]string{
		"café ☕ 😀":                                "café ☕ 😀",
		"a\nb\tc\rd":                              `a\nb\tc\rd`,
		"\x1b]0;title\x07\x1b[2J":                 `\x1b]0;title\a\x1b[2J`,
		"\u009b31m":                               `\u009b31m`,
		"ab\u202ecd\u202a\u202c":                  `ab\u202ecd\u202a\u202c`,
		"\u2066x\u2069\u200e\u200f":               `\u2066x\u2069\u200e\u200f`,
		"\u061c \u2028 \u2029 \x7f":               `\u061c \u2028 \u2029 \x7f`,
		"a\u200bb\u2060c\ufeffd\u00ade\U000e0041": `a\u200bb\u2060c\ufeffd\u00ade\U000e0041`,
	} {
		if got := view.Terminal(in); got != want {
			t.Errorf("Terminal(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestEscapeControls(t *testing.T) {
	for in, want := range map[string]string{
		"plain\nline\ttab":         "plain\nline\ttab",
		"a\x1b[2Jb\x07c\rd\x00":    `a\x1b[2Jb\ac\rd\x00`,
		"\u0085 \u202egnp \u2066x": `\u0085 \u202egnp \u2066x`,
		"bad \xff utf8 \x1b":       "bad \xff utf8 \\x1b",
	} {
		if got := string(view.EscapeControls([]byte(in))); got != want {
			t.Errorf("EscapeControls(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestCutPayloadDropsASplitRune: a payload cut in the middle of a rune
// is shown as the text before that rune, and the rune's bytes are
// counted as cut; cut on a rune boundary it keeps every byte up to the
// bound. Base64 is only for a cut part that is not text.
func TestCutPayloadDropsASplitRune(t *testing.T) {
	for _, c := range []struct {
		payload, text string
		max, cut      int
	}{
		{`"aé"`, `"a`, 3, 3},  // é is two bytes; the bound falls between them
		{`"aé"`, `"aé`, 4, 1}, // on the boundary
		{`"a€b"`, `"a`, 4, 5}, // € is three bytes; two are under the bound
		{`"a"`, ``, 3, 0},     // not over the bound: not cut
	} {
		a := once.Action{Payload: []byte(c.payload)}
		v := view.CutPayload(view.FromAction(a, nil), a, c.max)
		if v.PayloadCut != c.cut || v.PayloadText != c.text || v.PayloadBase64 != nil {
			t.Errorf("%q cut to %d: text %q, %d cut, base64 %q; want text %q, %d cut", c.payload, c.max, v.PayloadText, v.PayloadCut, v.PayloadBase64, c.text, c.cut)
		}
	}
	// The bound is never under a few bytes (the console's are 64 KiB and
	// 1 MiB): cut shorter than utf8.UTFMax, bytes that are not text
	// would all be trimmed away as if they were one split rune.
	bin := once.Action{Payload: bytes.Repeat([]byte{0xff}, 8)}
	if v := view.CutPayload(view.FromAction(bin, nil), bin, 6); v.PayloadText != "" || !bytes.Equal(v.PayloadBase64, bin.Payload[:6]) || v.PayloadCut != 2 {
		t.Errorf("binary payload cut to 6: text %q, base64 %q, %d cut; want base64 of the first 6 bytes, 2 cut", v.PayloadText, v.PayloadBase64, v.PayloadCut)
	}
}
