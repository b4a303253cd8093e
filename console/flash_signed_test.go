package console_test

import (
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/oncehq/once/console"
)

// TestFlashAlteredIgnored: a notice the console signed shows once; the
// same cookie with its message altered, or its expiry moved, shows
// nothing.
func TestFlashAlteredIgnored(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{})
	cookie, token := b.form(t, "/review")
	w := b.serve(b.postForm("/actions/"+string(b.review)+"/resolve", url.Values{
		"decision": {"retry"}, "note": {"checked"}, "csrf": {token}, "next": {b.url("/review")},
	}, cookie))
	var flash *http.Cookie
	for _, c := range w.Result().Cookies() {
		if c.Name == "once_flash" {
			flash = c
		}
	}
	if flash == nil {
		t.Fatalf("no flash cookie after the resolution: %d", w.Code)
	}
	show := func(v string) string {
		r := httptest.NewRequest(http.MethodGet, b.url("/review"), nil)
		r.AddCookie(cookie)
		r.AddCookie(&http.Cookie{Name: "once_flash", Value: v})
		return b.serve(r).Body.String()
	}
	if !strings.Contains(show(flash.Value), "released for retry") {
		t.Fatal("the console's own notice is not shown")
	}
	exp, rest, _ := strings.Cut(flash.Value, ".")
	msg, mac, _ := strings.Cut(rest, ".")
	forged := strings.NewReplacer("released for retry", "rejected by grace").Replace(mustB64(t, msg))
	for name, v := range map[string]string{
		"message":   exp + "." + b64(forged) + "." + mac,
		"expiry":    exp + "0." + msg + "." + mac,
		"signature": exp + "." + msg + "." + b64(strings.Repeat("x", 32)),
		"unsigned":  msg,
	} {
		if body := show(v); strings.Contains(body, `class="flash"`) {
			t.Errorf("a notice with its %s altered is shown", name)
		}
	}
}

func b64(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

func mustB64(t *testing.T, s string) string {
	t.Helper()
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		t.Fatalf("the flash cookie's message %q is not base64: %v", s, err)
	}
	return string(b)
}
