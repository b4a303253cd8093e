package console_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/console"
)

// The action page takes a key prefix of 8 or more characters, as `once
// show` and /api/actions/{key} do: the 12 characters every list shows
// open the action, and a prefix two keys share says so.
func TestActionPageTakesAKeyPrefix(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{})
	for _, p := range []string{short(b.review), string(b.review[:8]), strings.ToUpper(short(b.review))} {
		w := b.get("/actions/" + p)
		if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), string(b.review)) {
			t.Errorf("GET /actions/%s: %d, want 200 and the action %s", p, w.Code, b.review)
		}
	}
	// Two keys with a common first character: a one-character prefix is
	// too short, and says how many characters to give.
	if w := b.get("/actions/" + string(b.review[:4])); w.Code != http.StatusNotFound || !strings.Contains(w.Body.String(), "at least 8") {
		t.Errorf("GET /actions/<4 chars>: %d %s", w.Code, w.Body.String())
	}
	// An ambiguous prefix: a second row whose key shares the first 12
	// characters with b.review's, claimed in the store directly.
	twin := once.Key(string(b.review[:12]) + strings.Repeat("0", 52))
	if twin == b.review {
		twin = once.Key(string(b.review[:12]) + strings.Repeat("1", 52))
	}
	if _, err := b.store.Claim(context.Background(), once.ClaimRequest{Key: twin, Fingerprint: "f", Run: "twin", Kind: "k", Lease: time.Minute, Token: "t"}); err != nil {
		t.Fatal(err)
	}
	w := b.get("/actions/" + short(b.review))
	if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), "More than one key starts with") {
		t.Errorf("GET /actions/<ambiguous prefix>: %d, want 400 saying more than one key starts with it: %s", w.Code, w.Body.String())
	}
	// The full key still opens it.
	if w := b.get("/actions/" + string(b.review)); w.Code != http.StatusOK {
		t.Errorf("GET /actions/<full key>: %d", w.Code)
	}
}

// Stored text reaches the page with its control characters written as
// Go escapes, as `once show` prints them: an ESC or a BEL in a provider's
// error or a person's note never reaches the HTML raw.
func TestActionPageEscapesControlCharacters(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{})
	ctx := context.Background()
	evil := "reset\x1b]0;owned\x07 by \x1b[2Jpeer\x00\x7f\u0085 \u202egnp.exe"
	if _, err := b.store.Claim(ctx, once.ClaimRequest{Key: once.Key(strings.Repeat("ab", 32)), Fingerprint: "f", Run: "r\x1b[31m", Kind: "k\x07",
		Target: "t\x1b[1m", Payload: []byte("body\x1b[5m\x07"), Lease: time.Minute, Token: "t"}); err != nil {
		t.Fatal(err)
	}
	key := once.Key(strings.Repeat("ab", 32))
	if _, err := b.store.Transition(ctx, once.Transition{Key: key, Attempt: 1, From: []once.Status{once.StatusInFlight}, To: once.StatusReview,
		Error: evil, Event: once.Event{Key: key, Type: once.EventReview, Attempt: 1, From: once.StatusInFlight, Actor: "reaper\x1b[0m", Note: evil}}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/actions/" + string(key), "/actions", "/review", "/runs/" + "r%1B%5B31m", "/kinds", "/"} {
		w := b.get(p)
		body := w.Body.String()
		if w.Code != http.StatusOK {
			t.Errorf("GET %s: %d", p, w.Code)
		}
		for _, c := range []string{"\x1b", "\x07", "\x00", "\x7f", "\u0085", "\u202e"} {
			if strings.Contains(body, c) {
				t.Errorf("GET %s: the page holds %q raw", p, c)
			}
		}
	}
	body := b.get("/actions/" + string(key)).Body.String()
	for _, want := range []string{`reset\x1b]0;owned\a by \x1b[2Jpeer`, `\u202egnp.exe`, `body\x1b[5m\a`} {
		if !strings.Contains(body, want) {
			t.Errorf("the action page does not show %q escaped", want)
		}
	}
}
