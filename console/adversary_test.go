package console_test

import (
	"context"
	"database/sql"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/console"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/sqlite"
)

var hiddenField = regexp.MustCompile(`<input type="hidden" name="([a-z_]+)" value="([^"]*)">`)

// TestAdversaryStaleFormDecidesNewerAttempt: two people open the same
// review item. A chooses Retry; the next delivery runs the effect again
// (attempt 2), which ends in review too. B, who checked the provider for
// attempt 1 and found nothing, now submits Retry from the page loaded
// before: the console applies it to attempt 2, which B never looked at,
// and the next delivery runs the effect a third time. A decision must be
// about the attempt the person saw.
func TestAdversaryStaleFormDecidesNewerAttempt(t *testing.T) {
	b := setup(t, console.Config{})
	ctx := context.Background()

	// B loads the action's page and its form, exactly as a browser would.
	page := b.get("/actions/" + string(b.review))
	if page.Code != http.StatusOK {
		t.Fatalf("GET action: %d", page.Code)
	}
	var csrf *http.Cookie
	for _, c := range page.Result().Cookies() {
		if c.Name == "once_csrf" {
			csrf = c
		}
	}
	form := url.Values{}
	for _, m := range hiddenField.FindAllStringSubmatch(page.Body.String(), -1) {
		form.Set(m[1], m[2])
	}
	if csrf == nil || form.Get("csrf") == "" {
		t.Fatalf("no form on the action page:\n%s", page.Body)
	}

	// A decides first; the job is delivered again and attempt 2 also
	// ends with an unknown outcome.
	if _, err := b.client.Resolve(ctx, b.review, once.Resolution{Decision: once.DecisionRetry, By: "ada", Note: "nothing in the mail log"}); err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	in := once.Intent{Run: b.runID, Step: 1, Kind: "send_email", Target: "bob@example.com",
		Payload: map[string]string{"subject": "Invoice", "body": b.payload}}
	_, err := once.Do(ctx, b.client, in, func(context.Context, once.Attempt) (string, error) {
		runs.Add(1)
		return "", errors.New("smtp: timeout after DATA")
	})
	if runs.Load() != 1 || err == nil {
		t.Fatalf("the second delivery: ran %d, err %v", runs.Load(), err)
	}
	a, _ := b.client.Get(ctx, b.review)
	if a.Status != once.StatusReview || a.Attempt != 2 {
		t.Fatalf("after the second delivery: %s attempt %d", a.Status, a.Attempt)
	}

	// B submits the form loaded when the action was at attempt 1.
	form.Set("decision", "retry")
	form.Set("note", "checked the provider for the first send: nothing")
	form.Set("by", "bob")
	w := b.serve(b.postForm("/actions/"+string(b.review)+"/resolve", form, csrf))
	a, _ = b.client.Get(ctx, b.review)
	if w.Code == http.StatusSeeOther || a.Status != once.StatusReview {
		t.Errorf("a form loaded at attempt 1 decided attempt 2: %d, the action is now %s at attempt %d (resolved by %q); "+
			"the next delivery runs the effect a third time. Want 409: the action moved on since the page was loaded",
			w.Code, a.Status, a.Attempt, a.ResolvedBy)
	}
}

// released puts one action of kind in released status: its effect's
// unknown outcome went to review and a person chose Retry.
func released(t *testing.T, c *once.Client, kind string, step int64) once.Key {
	t.Helper()
	ctx := context.Background()
	in := once.Intent{Run: "run-" + kind, Step: step, Kind: kind, Target: "t"}
	once.Do(ctx, c, in, func(context.Context, once.Attempt) (int, error) { return 0, errors.New("reset after DATA") })
	k, _, _ := once.KeyOf(in)
	if _, err := c.Resolve(ctx, k, once.Resolution{Decision: once.DecisionRetry, By: "ada", Note: "send again"}); err != nil {
		t.Fatal(err)
	}
	return k
}

// TestAdversaryWaitingHiddenByNewerReleased: kind "fast" re-drives after
// 30ms, kind "slow" after an hour. One fast action waits for a delivery;
// then waitingLimit (50) slow actions are released, more recently. The
// overview asks the store for the 50 newest released actions older than
// the shortest RedriveAfter and only then drops those whose own kind's
// RedriveAfter has not passed: the slow ones fill the page and are
// dropped, so the panel "Released, waiting for a delivery" is not shown
// while the fast action waits. The reaper has the same cut
// (MaxPerPass), so past that many newer released actions it never
// re-drives the fast one: the effect is lost.
func TestAdversaryWaitingHiddenByNewerReleased(t *testing.T) {
	ctx := context.Background()
	store, err := sqlite.Open(filepath.Join(t.TempDir(), "once.db"), sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var redriven atomic.Int32
	client, err := once.New(once.Config{Store: store, Kinds: map[string]once.KindPolicy{
		"fast": {RedriveAfter: 30 * time.Millisecond, Redrive: func(context.Context, once.Action) error { redriven.Add(1); return nil }},
		"slow": {RedriveAfter: time.Hour},
	}})
	if err != nil {
		t.Fatal(err)
	}
	fast := released(t, client, "fast", 0)
	time.Sleep(50 * time.Millisecond)
	for i := range 50 {
		released(t, client, "slow", int64(i))
	}
	time.Sleep(50 * time.Millisecond)

	h, err := console.New(console.Config{Client: client})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if body := rec.Body.String(); rec.Code != http.StatusOK || !strings.Contains(body, "waiting for a delivery") || !strings.Contains(body, string(fast[:12])) {
		t.Errorf("the overview does not list the fast action waiting for a delivery (%d)", rec.Code)
	}

	r, err := once.NewReaper(client, once.ReaperConfig{MaxPerPass: 50})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := r.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Redriven != 1 || redriven.Load() != 1 {
		t.Errorf("a reaper pass re-drove %d (hook called %d times), want the fast action re-driven once; report %+v", rep.Redriven, redriven.Load(), rep)
	}
}

// TestAdversaryBlindConsoleWaitingWrong: the application's kind
// "charge" has a Redrive hook and RedriveAfter of an hour. A released
// charge ten minutes old is not late. A console in a process that knows
// no kinds (once serve) applies its own default RedriveAfter (5m) and no
// hook, because the row records neither: the overview lists the charge
// as waiting and tells the operator to "give their kind a Redrive hook",
// which it has.
func TestAdversaryBlindConsoleWaitingWrong(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "once.db")
	store, err := sqlite.Open(path, sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	app, err := once.New(once.Config{Store: store, Kinds: map[string]once.KindPolicy{
		"charge": {RedriveAfter: time.Hour, Redrive: func(context.Context, once.Action) error { return nil }},
	}})
	if err != nil {
		t.Fatal(err)
	}
	k := released(t, app, "charge", 0)
	// Ten minutes pass.
	if err := ageRows(path, 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	if w, err := app.Waiting(ctx, 50); err != nil || len(w) != 0 {
		t.Fatalf("the application itself counts %d waiting (%v), want 0", len(w), err)
	}

	h := blindConsole(t, store)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if body := rec.Body.String(); strings.Contains(body, "waiting for a delivery") && strings.Contains(body, string(k[:12])) {
		t.Errorf("a console that knows no kinds lists the charge (RedriveAfter 1h, with a Redrive hook) as waiting for a delivery, "+
			"and says to give its kind a Redrive hook:\n%s", section(body, "Released, waiting"))
	}
}

// ageRows moves every action's updated_at back by d in the SQLite file.
func ageRows(path string, d time.Duration) error {
	db, err := sqlOpen(path)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.Exec(`UPDATE once_action SET updated_at = updated_at - ?`, d.Milliseconds())
	return err
}

func section(body, from string) string {
	i := strings.Index(body, from)
	if i < 0 {
		return "(no such section)"
	}
	return body[i:min(len(body), i+800)]
}

// TestAdversaryBadBytesInPathIsStoreUnavailable: a URL with a byte that
// is not UTF-8 (a mistyped or hostile link) makes PostgreSQL refuse the
// query; the console answers 500 "Store unavailable" and logs an error,
// as if the database were down, instead of 404 "No such action" / "No
// such run".
func TestAdversaryBadBytesInPathIsStoreUnavailable(t *testing.T) {
	_, _, client, _ := postgresClient(t, "once_adv")
	h, err := console.New(console.Config{Client: client})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/actions/%FF", "/runs/%FF", "/api/actions/%FF", "/api/runs/%FF", "/actions?kind=%FF", "/api/actions?run=%FF"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", p, nil))
		if rec.Code >= 500 {
			t.Errorf("GET %s: %d %q; want 404 (or 400 naming the bad bytes), not a store failure", p, rec.Code, firstLine(rec.Body.String()))
		}
	}
}

var pageMessage = regexp.MustCompile(`(?s)<p class="message">(.*?)</p>`)

// firstLine is what an answer says: the error page's message, or the
// JSON body.
func firstLine(s string) string {
	if m := pageMessage.FindStringSubmatch(s); m != nil {
		return m[1]
	}
	return strings.TrimSpace(s)
}

func sqlOpen(path string) (*sql.DB, error) { return sql.Open("sqlite", path) }

// TestAdversaryReviewQueueHidesOldest: the review queue says "Oldest
// first", but with more than 500 items in review it reads the 500 most
// recently updated and sorts those: the action that has waited longest
// for a person is not on the page at all.
func TestAdversaryReviewQueueHidesOldest(t *testing.T) {
	ctx := context.Background()
	client, _ := testdb.SQLiteClient(t, once.Config{})
	var oldest once.Key
	for i := range 501 {
		in := once.Intent{Run: "run-q", Step: int64(i), Kind: "send_email", Target: "t"}
		once.Do(ctx, client, in, func(context.Context, once.Attempt) (int, error) { return 0, errors.New("reset after DATA") })
		if i == 0 {
			oldest, _, _ = once.KeyOf(in)
		}
	}
	h, err := console.New(console.Config{Client: client})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/review", nil))
	if body := rec.Body.String(); rec.Code != http.StatusOK || !strings.Contains(body, `id="item-`+string(oldest)) {
		t.Errorf("the review queue (oldest first) does not list the action that has waited longest, %s (%d)", oldest[:12], rec.Code)
	}
}
