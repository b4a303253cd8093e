package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
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

// get fetches url over real HTTP and returns the status and the body.
func fetch(t *testing.T, url string) (int, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body
}

// A trail of 1,000 events with 4 KB notes (written before refusals were
// bounded, or by workers) is read a page at a time: the action page
// and the API hold 100 events, say how many there are, and link the
// next page, and walking the links shows every event once.
func TestActionPagePagesTheTrail(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{})
	srv := httptest.NewServer(b.h)
	defer srv.Close()
	ctx := context.Background()
	const n = 1000
	for i := range n {
		if err := b.store.AppendEvent(ctx, once.Event{Key: b.ok, Type: once.EventRefused, Attempt: 1, From: once.StatusSucceeded, Actor: "mallory",
			Note: fmt.Sprintf("note-%04d-", i) + strings.Repeat("n", 4000)}); err != nil {
			t.Fatal(err)
		}
	}
	all, err := b.client.Events(ctx, b.ok)
	if err != nil || len(all) != n+2 {
		t.Fatalf("Events = %d, %v; want %d", len(all), err, n+2)
	}
	seen := map[string]int{}
	next := srv.URL + "/actions/" + string(b.ok)
	for pages := 0; next != ""; pages++ {
		if pages > n {
			t.Fatal("the trail's pages do not end")
		}
		code, body := fetch(t, next)
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d", next, code)
		}
		if len(body) > 600<<10 {
			t.Fatalf("GET %s: %d bytes of HTML; a page of the trail should hold 100 events of 4 KB, not all %d", next, len(body), n)
		}
		if !strings.Contains(string(body), fmt.Sprintf("%d events", n+2)) {
			t.Fatalf("GET %s does not say the trail holds %d events", next, n+2)
		}
		for _, m := range regexp.MustCompile(`note-(\d{4})-`).FindAllStringSubmatch(string(body), -1) {
			seen[m[1]]++
		}
		next = ""
		if m := regexp.MustCompile(`href="(/actions/[0-9a-f]+\?events_after=\d+)"`).FindSubmatch(body); m != nil {
			next = srv.URL + html.UnescapeString(string(m[1]))
		}
	}
	if len(seen) != n {
		t.Errorf("walking the pages showed %d of the %d events", len(seen), n)
	}
	for note, times := range seen {
		if times != 1 {
			t.Errorf("event %s shown %d times", note, times)
		}
	}

	// The API: a page of the trail, its total and the next page's cursor.
	code, body := fetch(t, srv.URL+"/api/actions/"+string(b.ok))
	var got struct {
		Events      []json.RawMessage `json:"events"`
		EventsTotal int64             `json:"events_total"`
		EventsNext  int64             `json:"events_next"`
	}
	if err := json.Unmarshal(body, &got); code != http.StatusOK || err != nil {
		t.Fatalf("GET /api/actions/{key}: %d %v", code, err)
	}
	if len(got.Events) != 102 || got.EventsTotal != n+2 || got.EventsNext == 0 || len(body) > 600<<10 {
		t.Errorf("GET /api/actions/{key}: %d events, total %d, next %d, %d bytes; want 100 and the claim and outcome the row tells, %d, a cursor, under 600 KiB",
			len(got.Events), got.EventsTotal, got.EventsNext, len(body), n+2)
	}
	code, body = fetch(t, fmt.Sprintf("%s/api/actions/%s/events?after=%d&limit=1000&order=newest", srv.URL, b.ok, 0))
	var page struct {
		Events []struct {
			Note string `json:"note"`
		} `json:"events"`
		Total int64 `json:"total"`
		Next  int64 `json:"next"`
	}
	if err := json.Unmarshal(body, &page); code != http.StatusOK || err != nil {
		t.Fatalf("GET /api/actions/{key}/events: %d %v %s", code, err, body)
	}
	if len(page.Events) < n || page.Total != n+2 || !strings.HasPrefix(page.Events[0].Note, "note-0999-") {
		t.Errorf("GET /api/actions/{key}/events?order=newest&limit=1000: %d events, total %d, first %.12q", len(page.Events), page.Total, page.Events[0].Note)
	}
	if code, body := fetch(t, srv.URL+"/api/actions/"+string(b.ok)+"/events?limit=1001"); code != http.StatusBadRequest || !strings.Contains(string(body), "1000") {
		t.Errorf("GET /api/actions/{key}/events?limit=1001: %d %s, want 400 naming the most, 1000", code, body)
	}
}

// Lists read no payload and no result: 30 actions with payloads of
// 1 MiB come to a few kilobytes in every list, the API's and the
// pages', where they came to 30 MiB and more. A limit over the most a
// list takes (1000) is refused, naming it; the one-action API shows a
// payload up to 1 MiB and says how much it cut.
func TestListsLeaveOutPayloads(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{})
	srv := httptest.NewServer(b.h)
	defer srv.Close()
	ctx := context.Background()
	big := []byte(`{"blob":"` + strings.Repeat("x", 1<<20) + `"}`)
	for i := range 30 {
		k := once.Key(fmt.Sprintf("%064x", i+1))
		if _, err := b.store.Claim(ctx, once.ClaimRequest{Key: k, Fingerprint: "f", Run: "big", Step: int64(i), Kind: "upload", Payload: big, Lease: time.Minute, Token: "t"}); err != nil {
			t.Fatal(err)
		}
		to := once.StatusReview
		if i%3 == 0 {
			to = once.StatusReleased
		}
		if _, err := b.store.Transition(ctx, once.Transition{Key: k, Attempt: 1, From: []once.Status{once.StatusInFlight}, To: to,
			Event: once.Event{Key: k, Type: once.EventReview, Attempt: 1, From: once.StatusInFlight, Actor: "reaper"}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"/api/actions?limit=30", "/actions?limit=30", "/review", "/runs/big", "/api/runs/big", "/"} {
		code, body := fetch(t, srv.URL+p)
		if code != http.StatusOK {
			t.Errorf("GET %s: %d", p, code)
		}
		if len(body) > 256<<10 {
			t.Errorf("GET %s: %d bytes for 30 actions; a list carries no payload", p, len(body))
		}
	}
	for _, p := range []string{"/api/actions?limit=1001", "/actions?limit=1001"} {
		if code, body := fetch(t, srv.URL+p); code != http.StatusBadRequest || !strings.Contains(string(body), "1 to 1000") {
			t.Errorf("GET %s: %d, want 400 naming the most, 1000: %.300s", p, code, body)
		}
	}
	// One action: its payload up to 1 MiB, and how much was cut.
	huge := once.Key(strings.Repeat("c", 64))
	if _, err := b.store.Claim(ctx, once.ClaimRequest{Key: huge, Fingerprint: "f", Run: "huge", Kind: "upload", Payload: append(big, big...), Lease: time.Minute, Token: "t"}); err != nil {
		t.Fatal(err)
	}
	code, body := fetch(t, srv.URL+"/api/actions/"+string(huge))
	var got struct {
		PayloadText string `json:"payload_text"`
		PayloadCut  int    `json:"payload_cut"`
	}
	if err := json.Unmarshal(body, &got); code != http.StatusOK || err != nil {
		t.Fatalf("GET /api/actions/{key}: %d %v", code, err)
	}
	if len(got.PayloadText) != once.DefaultMaxPayloadBytes || got.PayloadCut != 2*len(big)-once.DefaultMaxPayloadBytes || len(body) > 1100<<10 {
		t.Errorf("GET /api/actions/{key} of a %d-byte payload: %d shown, %d cut, %d bytes", 2*len(big), len(got.PayloadText), got.PayloadCut, len(body))
	}
	if code, body := fetch(t, srv.URL+"/actions/"+string(huge)); code != http.StatusOK || !strings.Contains(string(body), "cut: the last") || len(body) > 256<<10 {
		t.Errorf("GET /actions/{key} of a %d-byte payload: %d, %d bytes, or it does not say it was cut", 2*len(big), code, len(body))
	}
}
