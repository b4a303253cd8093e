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
