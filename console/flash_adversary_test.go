package console_test

import (
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/oncehq/once"
	"github.com/oncehq/once/console"
	"github.com/oncehq/once/console/internal/consoletest"
	"github.com/oncehq/once/internal/testdb"
)

// TestFlashNotForged: the notice after a decision ("Action … approved
// by ada: the next delivery of its job runs it, once.") travels in the
// once_flash cookie, which the console shows as it finds it: base64,
// unsigned. A cookie is not the console's alone to set: a page on a
// sibling host (user content on other.example.com, beside
// ops.example.com) sets one for the parent domain, a man in the middle
// of a plain-http console sets one, and the browser sends it with the
// console's own cookies. The operator then reads, on the console's own
// page and under its token, that an action was approved or rejected
// when nobody decided: the wait runs out, or a second person decides
// what the first was told is done. A notice the console did not write
// must not be shown.
func TestFlashNotForged(t *testing.T) {
	t.Parallel()
	c, _ := testdb.SQLiteClient(t, consoletest.Gated(0))
	var runs consoletest.Runs
	key := consoletest.Await(t, c, consoletest.Transfer(0, "DE89370400440532013000", 9_900_000), &runs)
	const token = "0123456789abcdef0123456789abcdef"
	h, err := console.New(console.Config{Client: c, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	forged := "Action " + string(key[:12]) + "… rejected by grace: it does not run, and every duplicate is told why (now failed)."
	r := httptest.NewRequest(http.MethodGet, "/approvals", nil)
	r.Header.Set("Authorization", "Bearer "+token)
	r.AddCookie(&http.Cookie{Name: "once_flash", Value: base64.RawURLEncoding.EncodeToString([]byte(forged))})
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		t.Fatalf("GET /approvals: %d", w.Code)
	}
	if a, _ := c.Get(r.Context(), key); a.Status != once.StatusAwaitingApproval {
		t.Fatalf("setup: the action is %s", a.Status)
	}
	if body := w.Body.String(); strings.Contains(body, "rejected by grace") {
		t.Fatalf("the approvals page shows, as the console's own notice, a once_flash cookie it never set: %q, "+
			"while the action still awaits approval", forged)
	}
}
