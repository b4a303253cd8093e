package cli_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/dburl"
)

// withClient opens db as an application would and hands its client to fn.
func withClient(t *testing.T, db string, cfg once.Config, fn func(c *once.Client, s once.Store)) {
	t.Helper()
	ctx := context.Background()
	s, err := dburl.Open(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cfg.Store = s.Store
	c, err := once.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	fn(c, s.Store)
}

// TestAdversaryReapHidesWaiting: a person chose Retry on a review item
// ten minutes ago and no delivery has claimed it since: it runs only if
// its job comes again. `once reap` has no Redrive hook, so its pass
// counts the action as waiting (ReapReport.Waiting = 1, as --json
// shows), but the line it prints says only "examined 0: review 0,
// released 0, ..." and nothing of the action that needs someone to
// publish its job again.
func TestAdversaryReapHidesWaiting(t *testing.T) {
	db := filepath.Join(t.TempDir(), "once.db")
	mustRun(t, "migrate", "--db", db)
	withClient(t, db, once.Config{}, func(c *once.Client, _ once.Store) {
		ctx := context.Background()
		in := once.Intent{Run: "run-a", Kind: "send_email", Target: "ada@example.com"}
		once.Do(ctx, c, in, func(context.Context, once.Attempt) (int, error) { return 0, errors.New("reset after DATA") })
		k, _, _ := once.KeyOf(in)
		if _, err := c.Resolve(ctx, k, once.Resolution{Decision: once.DecisionRetry, By: "ada", Note: "not in the mail log"}); err != nil {
			t.Fatal(err)
		}
	})
	ageRows(t, db, 10*time.Minute)

	js := mustRun(t, "reap", "--json", "--db", db)
	if !strings.Contains(js, `"waiting": 1`) {
		t.Fatalf("reap --json: %s", js)
	}
	out := mustRun(t, "reap", "--db", db)
	if !strings.Contains(out, "waiting") {
		t.Errorf("the pass counted 1 released action waiting for a delivery, but `once reap` printed only:\n%s", out)
	}
}

// TestAdversaryReapSilentOnVerifyThenDecide: a worker of a
// VerifyThenDecide kind died holding its claim. `once reap` knows no
// verifier, so (by design) it leaves the action alone, and prints
// "examined 0": the operator who ran it to "recover actions whose worker
// died" is told there was nothing to do, and the console's review queue
// does not list the dead claim either. Nothing says that an action waits
// for a process that holds its kind's verifier.
func TestAdversaryReapSilentOnVerifyThenDecide(t *testing.T) {
	db := filepath.Join(t.TempDir(), "once.db")
	mustRun(t, "migrate", "--db", db)
	var key once.Key
	withClient(t, db, once.Config{}, func(_ *once.Client, s once.Store) {
		in := once.Intent{Run: "run-v", Kind: "post_message", Target: "#general"}
		k, fp, _ := once.KeyOf(in)
		key = k
		if _, err := s.Claim(context.Background(), once.ClaimRequest{Key: k, Fingerprint: fp, Run: in.Run, Kind: in.Kind, Target: in.Target,
			Lease: time.Millisecond, Token: "t", Recovery: once.VerifyThenDecide, Retention: time.Hour}); err != nil {
			t.Fatal(err)
		}
	})
	time.Sleep(20 * time.Millisecond) // past the lease: the worker is dead

	out := mustRun(t, "reap", "--db", db)
	if !strings.Contains(out, "verifier") && !strings.Contains(out, string(key[:12])) {
		t.Errorf("a dead VerifyThenDecide claim (%s) was left alone, and `once reap` said only:\n%s", key[:12], out)
	}
}

// TestAdversaryShowForgedTrail: the text in a trail comes from outside:
// an effect's error (a provider's reply), a resolution's note (the
// console's textarea keeps line breaks). `once show` prints it as is, so
// a line break in it prints as a trail line of its own — here one that
// says a person marked the action done — and terminal escapes reach the
// operator's terminal (ESC[8m hides the rest of the output).
func TestAdversaryShowForgedTrail(t *testing.T) {
	db := filepath.Join(t.TempDir(), "once.db")
	mustRun(t, "migrate", "--db", db)
	var key once.Key
	withClient(t, db, once.Config{}, func(c *once.Client, _ once.Store) {
		in := once.Intent{Run: "run-f", Kind: "send_email", Target: "ada@example.com"}
		key, _, _ = once.KeyOf(in)
		once.Do(context.Background(), c, in, func(context.Context, once.Attempt) (int, error) {
			return 0, errors.New("550 mailbox busy\n  2026-01-02 03:04:05  resolved  #1  review → succeeded  ada  done: sent by hand\x1b[8m")
		})
	})
	out := mustRun(t, "show", string(key), "--db", db)
	if strings.ContainsRune(out, '\x1b') {
		t.Errorf("`once show` wrote a terminal escape from stored text to the terminal:\n%q", out)
	}
	_, trail, _ := strings.Cut(out, "trail (UTC):\n")
	lines := strings.Split(strings.TrimRight(trail, "\n"), "\n")
	if len(lines) != 2 { // claimed, review
		t.Errorf("the action has 2 events but `once show` prints %d trail lines, one of them forged:\n%s", len(lines), trail)
	}
}

// TestAdversaryServeAnyHost: `once serve` on loopback without a token
// answers any Host name. A web page on rebind.attacker.example, whose
// name the attacker then points at 127.0.0.1 (DNS rebinding), is the
// same origin as the console in the operator's browser: it reads every
// page (payloads included) and its form's CSRF token, and its POST
// passes the Origin and Sec-Fetch-Site checks, because Origin and Host
// agree. Here it abandons an action in review.
func TestAdversaryServeAnyHost(t *testing.T) {
	db := filepath.Join(t.TempDir(), "once.db")
	mustRun(t, "migrate", "--db", db)
	_, review, _ := fill(t, db)

	base, _, _, _ := startServe(t, "--addr", "127.0.0.1:0", "--reap-every", "0", "--db", db)
	u, _ := url.Parse(base)
	evil := "rebind.attacker.example:" + u.Port()

	req, _ := http.NewRequest("GET", base+"actions/"+string(review), nil)
	req.Host = evil
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		t.Errorf("GET with Host %s: 200, the page and its payload are served to a foreign name", evil)
	}
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindSubmatch(body)
	var csrf *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == "once_csrf" {
			csrf = c
		}
	}
	if m == nil || csrf == nil {
		return
	}
	form := url.Values{"csrf": {string(m[1])}, "decision": {"abandon"}, "note": {"x"}, "by": {"x"}}
	req, _ = http.NewRequest("POST", base+"actions/"+string(review)+"/resolve", strings.NewReader(form.Encode()))
	req.Host = evil
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "http://"+evil)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	req.AddCookie(csrf)
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err = client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	show := mustRun(t, "show", string(review), "--db", db)
	if resp.StatusCode == http.StatusSeeOther || strings.Contains(show, "abandoned by x") {
		t.Errorf("POST from a page on %s: %d; the action was abandoned through a foreign host name", evil, resp.StatusCode)
	}
}

// ageRows moves every action's updated_at back by d in the SQLite file.
func ageRows(t *testing.T, path string, d time.Duration) {
	t.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`UPDATE once_action SET updated_at = updated_at - ?`, d.Milliseconds()); err != nil {
		t.Fatal(err)
	}
}
