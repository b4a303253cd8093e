package console_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/oncehq/once"
	"github.com/oncehq/once/console"
)

// TestResolveRefusesAnOversizedBody: a decision is a few hundred bytes;
// a body over 4 MiB, to the API or to the page's form, is refused with
// what was wrong (413 naming the bound, 400 saying the form could not
// be read), over real HTTP, and the action is left as it was.
func TestResolveRefusesAnOversizedBody(t *testing.T) {
	b := setup(t, console.Config{})
	srv := httptest.NewServer(b.h)
	defer srv.Close()
	huge := strings.Repeat("x", 4<<20)

	body := `{"decision":"retry","note":"` + huge + `"}`
	resp, err := http.Post(srv.URL+b.url("/api/actions/"+string(b.review)+"/resolve"), "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var e struct{ Error string }
	json.NewDecoder(resp.Body).Decode(&e)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(e.Error, "over 4194304 bytes") {
		t.Errorf("API resolve with a %d-byte body: %d %q, want 413 naming the bound of 4194304 bytes", len(body), resp.StatusCode, e.Error)
	}

	form := url.Values{"decision": {"retry"}, "note": {huge}}.Encode()
	resp, err = http.Post(srv.URL+b.url("/actions/"+string(b.review)+"/resolve"), "application/x-www-form-urlencoded", strings.NewReader(form))
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(page), "could not be read") {
		t.Errorf("form resolve with a %d-byte body: %d, want 400 saying the form could not be read\n%.500s", len(form), resp.StatusCode, page)
	}
	if got := b.status(t, b.review); got != once.StatusReview {
		t.Errorf("after the oversized resolutions the action is %s, want review", got)
	}
}
