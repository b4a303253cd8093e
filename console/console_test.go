package console_test

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/oncehq/once"
	"github.com/oncehq/once/console"
	"github.com/oncehq/once/console/internal/consoletest"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/postgres"
	"github.com/oncehq/once/sqlite"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines leaked:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// mount is where a test puts the console (consoletest.Mounts).
type mount = consoletest.Mount

var mounts = consoletest.Mounts

// appHome is what the application's own mux serves beside the console.
const appHome = consoletest.AppHome

// forMounts runs test once for each mount, in parallel.
func forMounts(t *testing.T, test func(t *testing.T, m mount)) {
	t.Helper()
	for _, m := range mounts {
		t.Run(m.Name, func(t *testing.T) {
			t.Parallel()
			test(t, m)
		})
	}
}

// bundle is a console over a real SQLite store holding three actions of
// one run: one succeeded, one in review, one failed permanently.
type bundle struct {
	store  *sqlite.Store
	client *once.Client
	// console is the console's handler; h is what requests go through:
	// the console itself, or the application's mux it is mounted on.
	console http.Handler
	h       http.Handler
	prefix  string
	ok      once.Key
	review  once.Key
	failed  once.Key
	runID   string
	payload string
}

func setup(t *testing.T, cfg console.Config) *bundle {
	t.Helper()
	l := consoletest.NewLog(t)
	b := &bundle{store: l.Store, client: l.Client, ok: l.OK, review: l.Review, failed: l.Failed, runID: l.RunID, payload: l.Payload}
	cfg.Client = l.Client
	b.mount(t, cfg)
	return b
}

// mount makes the console from cfg and puts it where cfg.Prefix says:
// with a prefix, on an application's mux that serves pages of its own.
func (b *bundle) mount(t *testing.T, cfg console.Config) {
	t.Helper()
	b.console, b.h, b.prefix = consoletest.Serve(t, cfg)
}

// url is the console's page p as the browser sees it, prefix included.
func (b *bundle) url(p string) string { return b.prefix + p }

func (b *bundle) status(t *testing.T, key once.Key) once.Status {
	t.Helper()
	a, err := b.client.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return a.Status
}

func short(k once.Key) string { return string(k[:12]) }

// serve runs one request through the handler.
func (b *bundle) serve(r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	b.h.ServeHTTP(w, r)
	return w
}

// get loads the console's page path (prefix not included).
func (b *bundle) get(path string) *httptest.ResponseRecorder {
	return b.serve(httptest.NewRequest(http.MethodGet, b.url(path), nil))
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// form loads a page as a browser would and returns its CSRF cookie and
// the token of its forms.
func (b *bundle) form(t *testing.T, path string) (*http.Cookie, string) {
	t.Helper()
	w := b.get(path)
	if w.Code != http.StatusOK {
		t.Fatalf("GET %s: %d", path, w.Code)
	}
	var cookie *http.Cookie
	for _, c := range w.Result().Cookies() {
		if c.Name == "once_csrf" {
			cookie = c
		}
	}
	if cookie == nil {
		t.Fatalf("GET %s set no once_csrf cookie", path)
	}
	if !cookie.HttpOnly || cookie.SameSite != http.SameSiteStrictMode {
		t.Errorf("once_csrf cookie is not HttpOnly and SameSite=Strict: %+v", cookie)
	}
	m := csrfField.FindStringSubmatch(w.Body.String())
	if m == nil {
		t.Fatalf("GET %s has no csrf field", path)
	}
	return cookie, m[1]
}

// postForm posts a form to the console's path (prefix not included).
func (b *bundle) postForm(path string, v url.Values, cookies ...*http.Cookie) *http.Request {
	r := httptest.NewRequest(http.MethodPost, b.url(path), strings.NewReader(v.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for _, c := range cookies {
		r.AddCookie(&http.Cookie{Name: c.Name, Value: c.Value})
	}
	return r
}

func TestPages(t *testing.T) {
	t.Parallel()
	forMounts(t, func(t *testing.T, m mount) {
		status := new(console.ReaperStatus)
		status.OnPass(once.ReapReport{Examined: 7, Review: 3}, nil)
		b := setup(t, console.Config{Prefix: m.Prefix, Reaper: status})
		u := b.url
		tests := []struct {
			path   string
			code   int
			want   []string
			absent []string
		}{
			{"/", 200, []string{"<strong>1</strong>", "action awaits", `href="` + u("/review") + `"`, "send_email", "Recent recoveries", short(b.review), "Last reaper pass", "<td class=\"num\">7</td>"}, nil},
			{"/actions", 200, []string{short(b.ok), short(b.review), short(b.failed), `href="` + u("/runs/run-1") + `"`, "ada@example.com", "badge s-review"}, nil},
			{"/actions?status=review", 200, []string{short(b.review)}, []string{short(b.ok), short(b.failed)}},
			{"/actions?kind=other", 200, []string{"No actions match."}, []string{short(b.ok)}},
			{"/actions?run=run-1&limit=2", 200, []string{"The limit was reached"}, nil},
			{"/actions?status=nope", 400, []string{"status &#34;nope&#34; is not one of"}, nil},
			{"/actions?limit=0", 400, []string{"limit"}, nil},
			{"/actions/" + string(b.review), 200, []string{string(b.review), "smtp: connection reset after DATA", b.payload, "bob@example.com",
				`name="decision" value="retry"`, `name="csrf"`, `action="` + u("/actions/"+string(b.review)+"/resolve") + `"`, "Trail", "claimed", "in_flight → review"}, nil},
			{"/actions/" + string(b.ok), 200, []string{"&#34;msg-1&#34;", "succeeded"}, []string{"/resolve"}},
			{"/actions/" + string(b.failed), 200, []string{"550 no such user", `value="abandon"`}, nil},
			{"/actions/0123abcd", 404, []string{"No such action", "No action has the key"}, nil},
			{"/runs/run-1", 200, []string{short(b.ok), short(b.review), short(b.failed), "3 steps"}, nil},
			{"/runs/nope", 404, []string{"No actions belong to the run"}, nil},
			{"/review", 200, []string{short(b.review), "smtp: connection reset after DATA", "bob@example.com", `value="done"`, `value="retry"`, `value="abandon"`, `name="next" value="` + u("/review") + `"`, "required"},
				[]string{short(b.ok), short(b.failed)}},
			{"/healthz", 200, []string{"ok"}, nil},
		}
		for _, tt := range tests {
			t.Run(tt.path, func(t *testing.T) {
				w := b.get(tt.path)
				body := w.Body.String()
				if w.Code != tt.code {
					t.Fatalf("GET %s: %d, want %d\n%s", u(tt.path), w.Code, tt.code, body)
				}
				for _, s := range tt.want {
					if !strings.Contains(body, s) {
						t.Errorf("GET %s: body lacks %q", u(tt.path), s)
					}
				}
				for _, s := range tt.absent {
					if strings.Contains(body, s) {
						t.Errorf("GET %s: body has %q", u(tt.path), s)
					}
				}
				h := w.Header()
				for name, want := range map[string]string{"X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin", "X-Frame-Options": "DENY"} {
					if got := h.Get(name); got != want {
						t.Errorf("GET %s: %s is %q, want %q", u(tt.path), name, got, want)
					}
				}
				if !strings.Contains(h.Get("Content-Security-Policy"), "default-src 'self'") {
					t.Errorf("GET %s: Content-Security-Policy is %q", u(tt.path), h.Get("Content-Security-Policy"))
				}
			})
		}
	})
}

func TestStylesheet(t *testing.T) {
	t.Parallel()
	forMounts(t, func(t *testing.T, m mount) {
		b := setup(t, console.Config{Prefix: m.Prefix})
		page := b.get("/").Body.String()
		m2 := regexp.MustCompile(`href="(` + regexp.QuoteMeta(b.url("/static/console.css")) + `\?v=[0-9a-f]+)"`).FindStringSubmatch(page)
		if m2 == nil {
			t.Fatal("the overview links no stylesheet")
		}
		w := b.serve(httptest.NewRequest(http.MethodGet, m2[1], nil))
		if w.Code != 200 || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/css") || !strings.Contains(w.Body.String(), ".badge") {
			t.Fatalf("GET %s: %d %s", m2[1], w.Code, w.Header().Get("Content-Type"))
		}
	})
}

func TestRunIDNeedingEscapes(t *testing.T) {
	t.Parallel()
	forMounts(t, func(t *testing.T, m mount) {
		b := setup(t, console.Config{Prefix: m.Prefix})
		ctx := context.Background()
		for _, run := range []string{"job/42 ünïcode?x=1#y", ".."} {
			in := once.Intent{Run: run, Kind: "post_message", Target: "#general"}
			if _, err := once.Do(ctx, b.client, in, func(context.Context, once.Attempt) (int, error) { return 1, nil }); err != nil {
				t.Fatal(err)
			}
			w := b.get("/actions?run=" + url.QueryEscape(run))
			m := regexp.MustCompile(`<td><a href="([^"]+)">`).FindStringSubmatch(w.Body.String())
			if m == nil {
				t.Fatalf("run %q: no run link in the list", run)
			}
			link := strings.ReplaceAll(m[1], "&amp;", "&")
			if !strings.HasPrefix(link, b.url("/")) {
				t.Errorf("run %q: the link %s is not under the console's path", run, link)
			}
			page := b.serve(httptest.NewRequest(http.MethodGet, link, nil))
			if page.Code != 200 || !strings.Contains(page.Body.String(), "post_message") {
				t.Errorf("run %q: GET %s: %d", run, link, page.Code)
			}
		}
	})
}

func TestCSRF(t *testing.T) {
	t.Parallel()
	forMounts(t, func(t *testing.T, m mount) {
		b := setup(t, console.Config{Prefix: m.Prefix})
		cookie, token := b.form(t, "/actions/"+string(b.review))
		path := "/actions/" + string(b.review) + "/resolve"
		valid := url.Values{"decision": {"retry"}, "note": {"checked the mail log"}, "csrf": {token}}

		tests := []struct {
			name string
			req  func() *http.Request
		}{
			{"no token, no cookie", func() *http.Request {
				return b.postForm(path, url.Values{"decision": {"retry"}, "note": {"x"}})
			}},
			{"token without its cookie", func() *http.Request { return b.postForm(path, valid) }},
			{"cookie without token", func() *http.Request {
				return b.postForm(path, url.Values{"decision": {"retry"}, "note": {"x"}}, cookie)
			}},
			{"wrong token", func() *http.Request {
				return b.postForm(path, url.Values{"decision": {"retry"}, "note": {"x"}, "csrf": {wrongToken(token)}}, cookie)
			}},
			{"another browser's token", func() *http.Request {
				other, _ := b.form(t, "/review")
				return b.postForm(path, valid, other)
			}},
			{"foreign Origin", func() *http.Request {
				r := b.postForm(path, valid, cookie)
				r.Header.Set("Origin", "https://evil.example")
				return r
			}},
			{"null Origin", func() *http.Request {
				r := b.postForm(path, valid, cookie)
				r.Header.Set("Origin", "null")
				return r
			}},
			{"cross-site fetch", func() *http.Request {
				r := b.postForm(path, valid, cookie)
				r.Header.Set("Sec-Fetch-Site", "cross-site")
				return r
			}},
		}
		for _, tt := range tests {
			w := b.serve(tt.req())
			if w.Code != http.StatusForbidden {
				t.Errorf("%s: %d, want 403\n%s", tt.name, w.Code, w.Body)
			}
		}
		if got := b.status(t, b.review); got != once.StatusReview {
			t.Fatalf("after refused POSTs the action is %s, want review", got)
		}

		// The same form, same-origin, goes through.
		r := b.postForm(path, valid, cookie)
		r.Header.Set("Origin", "http://"+r.Host)
		r.Header.Set("Sec-Fetch-Site", "same-origin")
		if w := b.serve(r); w.Code != http.StatusSeeOther {
			t.Fatalf("same-origin POST: %d, want 303\n%s", w.Code, w.Body)
		}
	})
}

// wrongToken is tok with its last character changed: always a different
// token, whatever tok ends with.
func wrongToken(tok string) string {
	last := byte('A')
	if tok[len(tok)-1] == last {
		last = 'B'
	}
	return tok[:len(tok)-1] + string(last)
}

func TestWrongTokenDiffers(t *testing.T) {
	for _, tok := range []string{"abcAA", "abcAB", "xyzBA", "A", "B"} {
		if w := wrongToken(tok); w == tok || len(w) != len(tok) {
			t.Errorf("wrongToken(%q) = %q, want a different token of the same length", tok, w)
		}
	}
}

func TestResolveForm(t *testing.T) {
	t.Parallel()
	forMounts(t, func(t *testing.T, m mount) {
		b := setup(t, console.Config{Prefix: m.Prefix})
		cookie, token := b.form(t, "/review")
		if want := cmp.Or(m.Prefix, "/"); cookie.Path != want {
			t.Errorf("once_csrf cookie path %q, want %q", cookie.Path, want)
		}
		w := b.serve(b.postForm("/actions/"+string(b.review)+"/resolve", url.Values{
			"decision": {"retry"}, "note": {"checked the mail log:\r\nnothing was sent"}, "csrf": {token}, "next": {b.url("/review")},
		}, cookie))
		if w.Code != http.StatusSeeOther {
			t.Fatalf("resolve: %d, want 303\n%s", w.Code, w.Body)
		}
		if loc := w.Header().Get("Location"); loc != b.url("/review") {
			t.Errorf("redirect to %q, want %s", loc, b.url("/review"))
		}
		a, err := b.client.Get(context.Background(), b.review)
		if err != nil {
			t.Fatal(err)
		}
		if a.Status != once.StatusReleased || a.ResolvedBy != "console" || a.ResolveNote != "checked the mail log:\nnothing was sent" {
			t.Errorf("after retry: status %s, by %q, note %q", a.Status, a.ResolvedBy, a.ResolveNote)
		}

		// The next page shows what happened, once.
		var flash *http.Cookie
		for _, c := range w.Result().Cookies() {
			if c.Name == "once_flash" {
				flash = c
			}
		}
		if flash == nil {
			t.Fatal("no flash cookie after the resolution")
		}
		if want := cmp.Or(m.Prefix, "/"); flash.Path != want {
			t.Errorf("once_flash cookie path %q, want %q", flash.Path, want)
		}
		r := httptest.NewRequest(http.MethodGet, b.url("/review"), nil)
		r.AddCookie(cookie)
		r.AddCookie(flash)
		page := b.serve(r)
		if body := page.Body.String(); !strings.Contains(body, "released for retry") || strings.Contains(body, `id="item-`+string(b.review)) {
			t.Errorf("the review queue after the resolution lacks the notice or still lists the action:\n%s", body)
		}

		// Done with a result and a name, from the action page, returning there.
		cookie, token = b.form(t, "/actions/"+string(b.failed))
		w = b.serve(b.postForm("/actions/"+string(b.failed)+"/resolve", url.Values{
			"decision": {"done"}, "note": {"the address was fixed and sent by hand"}, "by": {"ada"},
			"result": {`{"id": "manual-1"}`}, "csrf": {token},
		}, cookie))
		if w.Code != http.StatusSeeOther || w.Header().Get("Location") != b.url("/actions/"+string(b.failed)) {
			t.Fatalf("done: %d to %q\n%s", w.Code, w.Header().Get("Location"), w.Body)
		}
		a, err = b.client.Get(context.Background(), b.failed)
		if err != nil {
			t.Fatal(err)
		}
		if a.Status != once.StatusSucceeded || a.ResolvedBy != "ada" || string(a.Result) != `{"id": "manual-1"}` {
			t.Errorf("after done: status %s, by %q, result %s", a.Status, a.ResolvedBy, a.Result)
		}
	})
}

// TestResolveFormRefused: input the client's ValidateResolution refuses
// (or the form cannot be read as a decision) is a 400 naming the field,
// with nothing written; a conflict is a 409 written to the trail.
func TestResolveFormRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{})
	cookie, token := b.form(t, "/review")
	tests := []struct {
		name string
		key  once.Key
		form url.Values
		code int
		want string
	}{
		{"no note", b.review, url.Values{"decision": {"retry"}, "note": {"  "}}, 400, "Note is empty"},
		{"no decision", b.review, url.Values{"note": {"n"}}, 400, "no decision"},
		{"bad decision", b.review, url.Values{"decision": {"maybe"}, "note": {"n"}}, 400, "is not done, retry or abandon"},
		{"result not JSON", b.review, url.Values{"decision": {"done"}, "note": {"n"}, "result": {"{oops"}}, 400, "Result is not valid JSON"},
		{"result with retry", b.review, url.Values{"decision": {"retry"}, "note": {"n"}, "result": {"1"}}, 400, "Result is only stored with Done"},
		{"by too long", b.review, url.Values{"decision": {"retry"}, "note": {"n"}, "by": {strings.Repeat("x", 4097)}}, 400, "By is 4097 bytes"},
		{"succeeded action", b.ok, url.Values{"decision": {"done"}, "note": {"already done"}}, 409, "refused"},
		{"unknown key", once.Key("feedface"), url.Values{"decision": {"done"}, "note": {"n"}}, 404, "No action has the key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.form.Set("csrf", token)
			w := b.serve(b.postForm("/actions/"+string(tt.key)+"/resolve", tt.form, cookie))
			if w.Code != tt.code {
				t.Fatalf("%d, want %d\n%s", w.Code, tt.code, w.Body)
			}
			body := w.Body.String()
			if !strings.Contains(body, tt.want) {
				t.Errorf("body lacks %q:\n%s", tt.want, body)
			}
			if tt.code == 400 && !strings.Contains(body, `class="error"`) {
				t.Errorf("the page shows no error")
			}
		})
	}
	if got := b.status(t, b.review); got != once.StatusReview {
		t.Errorf("after refused resolutions the action is %s, want review", got)
	}
	// What the user typed survives a refused form.
	w := b.serve(b.postForm("/actions/"+string(b.review)+"/resolve",
		url.Values{"decision": {"retry"}, "note": {"kept <note>"}, "result": {"{oops"}, "csrf": {token}}, cookie))
	if body := w.Body.String(); !strings.Contains(body, "kept &lt;note&gt;</textarea>") || !strings.Contains(body, `value="{oops"`) {
		t.Errorf("the re-rendered form lost the input:\n%s", body)
	}
	// The conflict is in the trail.
	events, err := b.client.Events(context.Background(), b.ok)
	if err != nil {
		t.Fatal(err)
	}
	if last := events[len(events)-1]; last.Type != once.EventRefused || last.Actor != "console" {
		t.Errorf("last event of the succeeded action: %+v, want a refusal by console", last)
	}
}

func TestResolveNextIsLocal(t *testing.T) {
	t.Parallel()
	forMounts(t, func(t *testing.T, m mount) {
		nexts := []string{"//evil.example/x", "https://evil.example/", "/\\evil.example", "review", ""}
		if m.Prefix != "" {
			// A path on the host but outside the console is not the
			// console's to send the browser to.
			nexts = append(nexts, "/review", m.Prefix+"x/review")
		}
		for _, next := range nexts {
			b := setup(t, console.Config{Prefix: m.Prefix})
			cookie, token := b.form(t, "/review")
			w := b.serve(b.postForm("/actions/"+string(b.review)+"/resolve",
				url.Values{"decision": {"abandon"}, "note": {"n"}, "csrf": {token}, "next": {next}}, cookie))
			if w.Code != http.StatusSeeOther {
				t.Fatalf("next %q: %d", next, w.Code)
			}
			if loc := w.Header().Get("Location"); loc != b.url("/actions/"+string(b.review)) {
				t.Errorf("next %q: redirected to %q, want the action page", next, loc)
			}
		}
	})
}

func TestToken(t *testing.T) {
	t.Parallel()
	forMounts(t, func(t *testing.T, m mount) {
		const token = "s3cret-t0ken"
		b := setup(t, console.Config{Token: token, Prefix: m.Prefix})

		w := b.get("/")
		if w.Code != http.StatusUnauthorized || !strings.Contains(w.Body.String(), "Authorization: Bearer") || !strings.Contains(w.Body.String(), b.url("/")+"?token=") {
			t.Fatalf("no token: %d %q", w.Code, w.Body)
		}
		for _, h := range []string{"Bearer wrong", "Bearer " + token + "x", "Basic " + token, token} {
			r := httptest.NewRequest(http.MethodGet, b.url("/"), nil)
			r.Header.Set("Authorization", h)
			if w := b.serve(r); w.Code != http.StatusUnauthorized {
				t.Errorf("Authorization %q: %d, want 401", h, w.Code)
			}
		}
		r := httptest.NewRequest(http.MethodGet, b.url("/review"), nil)
		r.Header.Set("Authorization", "Bearer "+token)
		if w := b.serve(r); w.Code != http.StatusOK {
			t.Errorf("bearer: %d, want 200", w.Code)
		}
		if w := b.get("/healthz"); w.Code != http.StatusOK {
			t.Errorf("/healthz without token: %d, want 200", w.Code)
		}
		w = b.get("/api/stats")
		if w.Code != http.StatusUnauthorized || w.Header().Get("Content-Type") != "application/json" {
			t.Errorf("/api/stats without token: %d %s", w.Code, w.Header().Get("Content-Type"))
		}
		if w := b.get("/actions?token=wrong"); w.Code != http.StatusUnauthorized {
			t.Errorf("?token=wrong: %d, want 401", w.Code)
		}

		// ?token= trades the token for a cookie and drops it from the URL.
		w = b.get("/actions?status=review&token=" + token)
		if w.Code != http.StatusSeeOther {
			t.Fatalf("?token=: %d, want 303", w.Code)
		}
		if loc := w.Header().Get("Location"); loc != b.url("/actions?status=review") {
			t.Errorf("?token= redirected to %q", loc)
		}
		var cookie *http.Cookie
		for _, c := range w.Result().Cookies() {
			if c.Name == "once_token" {
				cookie = c
			}
		}
		if cookie == nil || !cookie.HttpOnly || cookie.SameSite != http.SameSiteStrictMode || cookie.Path != cmp.Or(m.Prefix, "/") {
			t.Fatalf("?token= set cookie %+v, want an HttpOnly SameSite=Strict once_token for %s", cookie, cmp.Or(m.Prefix, "/"))
		}
		r = httptest.NewRequest(http.MethodGet, b.url("/actions?status=review"), nil)
		r.AddCookie(cookie)
		if w := b.serve(r); w.Code != http.StatusOK || !strings.Contains(w.Body.String(), short(b.review)) {
			t.Errorf("with the cookie: %d", w.Code)
		}
		// Straight to the console: an application's mux would clean the
		// double slash away before the console saw it.
		w = httptest.NewRecorder()
		b.console.ServeHTTP(w, httptest.NewRequest(http.MethodGet, b.url("//evil.example/?token="+token), nil))
		if w.Code != http.StatusSeeOther || w.Header().Get("Location") != b.url("/evil.example/") {
			t.Errorf("?token= on //evil.example/: %d to %q, want a local path", w.Code, w.Header().Get("Location"))
		}

		// The API resolves with the bearer token alone, no CSRF token.
		r = httptest.NewRequest(http.MethodPost, b.url("/api/actions/"+string(b.review)+"/resolve"), strings.NewReader(`{"decision":"abandon","note":"spam"}`))
		r.Header.Set("Authorization", "Bearer "+token)
		r.Header.Set("Content-Type", "application/json")
		if w := b.serve(r); w.Code != http.StatusOK {
			t.Errorf("API resolve with bearer: %d\n%s", w.Code, w.Body)
		}
	})
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	if _, err := console.New(console.Config{}); err == nil || !strings.Contains(err.Error(), "Config.Client") {
		t.Errorf("nil client: %v", err)
	}
	b := setup(t, console.Config{})
	if _, err := console.New(console.Config{Client: b.client, Token: "has space"}); err == nil || !strings.Contains(err.Error(), "Config.Token") {
		t.Errorf("token with a space: %v", err)
	}
	for _, prefix := range []string{"ops", "/ops//once", "/ops/../once", "/ops/./once", "/ops once", "/ops?x", "/ops%2Fonce", "//evil.example"} {
		if _, err := console.New(console.Config{Client: b.client, Prefix: prefix}); err == nil || !strings.Contains(err.Error(), "Config.Prefix") {
			t.Errorf("prefix %q: %v, want an error naming Config.Prefix", prefix, err)
		}
	}
	for _, prefix := range []string{"", "/", "/ops", "/ops/once/", "/a-b_c.d~e/0"} {
		if _, err := console.New(console.Config{Client: b.client, Prefix: prefix}); err != nil {
			t.Errorf("prefix %q: %v", prefix, err)
		}
	}
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "console_test_total", Help: "test"})
	reg.MustRegister(c)
	c.Add(3)
	b := setup(t, console.Config{Registry: reg})
	w := b.get("/metrics")
	if w.Code != 200 || !strings.Contains(w.Body.String(), "console_test_total 3") {
		t.Errorf("/metrics: %d\n%s", w.Code, w.Body)
	}
	if w := setup(t, console.Config{}).get("/metrics"); w.Code != http.StatusNotFound {
		t.Errorf("/metrics without a registry: %d, want 404", w.Code)
	}
}

// healthz asks h for /healthz from remote (host:port).
func healthz(h http.Handler, remote string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, "/healthz", nil)
	r.RemoteAddr = remote
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestHealthzNotMigrated: an unmigrated store is 503; the reason, with
// what to do, goes to a caller on this machine of a console without a
// token, and to the log.
func TestHealthzNotMigrated(t *testing.T) {
	t.Parallel()
	store, err := sqlite.Open(filepath.Join(t.TempDir(), "once.db"), sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	client, err := once.New(once.Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	for _, token := range []string{"", "t"} {
		var log bytes.Buffer
		h, err := console.New(console.Config{Client: client, Token: token, Logger: slog.New(slog.NewTextHandler(&log, nil))})
		if err != nil {
			t.Fatal(err)
		}
		w := healthz(h, "127.0.0.1:40000")
		if token == "" && (w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), "once migrate")) {
			t.Errorf("/healthz on an unmigrated store, no token: %d %q, want 503 saying to run once migrate", w.Code, w.Body)
		}
		if token != "" && (w.Code != http.StatusServiceUnavailable || w.Body.String() != "unavailable\n") {
			t.Errorf("/healthz on an unmigrated store, with a token: %d %q, want 503 unavailable", w.Code, w.Body)
		}
		if !strings.Contains(log.String(), "once migrate") {
			t.Errorf("token %q: the log lacks the reason:\n%s", token, log.String())
		}
	}
}

func TestHealthzStoreDown(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{Token: "t"})
	b.store.Close()
	w := b.get("/healthz")
	if w.Code != http.StatusServiceUnavailable || w.Body.String() != "unavailable\n" {
		t.Errorf("/healthz with the store closed: %d %q, want 503 unavailable", w.Code, w.Body)
	}
}

// TestHealthzHidesStoreDetail: /healthz needs no token, so it must not
// tell whoever asks which database, user and server the console uses.
// With a token, or asked from another machine, it says only
// "unavailable"; the reason goes to the log. A PostgreSQL store whose
// database does not exist has all three in its error.
func TestHealthzHidesStoreDetail(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testdb.RequirePostgres(t))
	if err != nil {
		t.Fatal(err)
	}
	const db = "once_healthz_no_such_db"
	u.Path = "/" + db
	pool, err := pgxpool.New(context.Background(), u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := postgres.New(pool, postgres.Config{})
	if err != nil {
		t.Fatal(err)
	}
	client, err := once.New(once.Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		token, remote string
		detail        bool
	}{
		{"tok", "127.0.0.1:40000", false},
		{"tok", "192.0.2.1:40000", false},
		{"", "192.0.2.1:40000", false},
		{"", "[::1]:40000", true},
	}
	for _, tt := range tests {
		var log bytes.Buffer
		h, err := console.New(console.Config{Client: client, Token: tt.token, Logger: slog.New(slog.NewTextHandler(&log, nil))})
		if err != nil {
			t.Fatal(err)
		}
		w := healthz(h, tt.remote)
		body := w.Body.String()
		if w.Code != http.StatusServiceUnavailable {
			t.Errorf("token %q from %s: %d, want 503", tt.token, tt.remote, w.Code)
		}
		if tt.detail && !strings.Contains(body, db) {
			t.Errorf("no token, from %s: %q, want the store's error", tt.remote, body)
		}
		if !tt.detail && body != "unavailable\n" {
			t.Errorf("token %q from %s: %q, want only \"unavailable\"", tt.token, tt.remote, body)
		}
		if !strings.Contains(log.String(), db) {
			t.Errorf("token %q from %s: the log lacks the store's error:\n%s", tt.token, tt.remote, log.String())
		}
	}
}

// apiCall runs a JSON API request and decodes the answer into out.
func (b *bundle) apiCall(t *testing.T, method, path, body string, out any) int {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	r := httptest.NewRequest(method, b.url(path), rd)
	if body != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	w := b.serve(r)
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("%s %s: Content-Type %q\n%s", method, path, ct, w.Body)
	}
	if out != nil {
		if err := json.Unmarshal(w.Body.Bytes(), out); err != nil {
			t.Fatalf("%s %s: %v\n%s", method, path, err, w.Body)
		}
	}
	return w.Code
}

type apiAction struct {
	Key         string          `json:"key"`
	Run         string          `json:"run"`
	Step        int             `json:"step"`
	Kind        string          `json:"kind"`
	Target      string          `json:"target"`
	Status      string          `json:"status"`
	Attempt     int             `json:"attempt"`
	Payload     json.RawMessage `json:"payload"`
	PayloadB64  []byte          `json:"payload_base64"`
	Result      json.RawMessage `json:"result"`
	Error       string          `json:"error"`
	CreatedAt   string          `json:"created_at"`
	ResolvedBy  string          `json:"resolved_by"`
	ResolveNote string          `json:"resolve_note"`
	Events      []struct {
		Type  string `json:"type"`
		From  string `json:"from"`
		To    string `json:"to"`
		Actor string `json:"actor"`
	} `json:"events"`
}

func compact(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		t.Fatalf("%v: %s", err, raw)
	}
	return buf.String()
}

type apiError struct {
	Error  string     `json:"error"`
	Action *apiAction `json:"action"`
}

func TestAPI(t *testing.T) {
	t.Parallel()
	forMounts(t, func(t *testing.T, m mount) { testAPI(t, setup(t, console.Config{Prefix: m.Prefix})) })
}

func testAPI(t *testing.T, b *bundle) {

	var list struct{ Actions []apiAction }
	if code := b.apiCall(t, "GET", "/api/actions", "", &list); code != 200 || len(list.Actions) != 3 {
		t.Fatalf("list: %d, %d actions", code, len(list.Actions))
	}
	if code := b.apiCall(t, "GET", "/api/actions?status=failed&kind=send_email&run=run-1&limit=5", "", &list); code != 200 || len(list.Actions) != 1 || list.Actions[0].Key != string(b.failed) {
		t.Errorf("filtered list: %d, %+v", code, list.Actions)
	}
	var e apiError
	if code := b.apiCall(t, "GET", "/api/actions?status=bogus", "", &e); code != 400 || !strings.Contains(e.Error, "bogus") {
		t.Errorf("bad status: %d %q", code, e.Error)
	}

	var a apiAction
	if code := b.apiCall(t, "GET", "/api/actions/"+string(b.ok), "", &a); code != 200 {
		t.Fatalf("show: %d", code)
	}
	if a.Status != "succeeded" || a.Run != "run-1" || a.Target != "ada@example.com" || compact(t, a.Result) != `"msg-1"` ||
		!strings.Contains(string(a.Payload), b.payload) || len(a.Payload) == 0 || a.Payload[0] != '{' || a.PayloadB64 != nil || a.CreatedAt == "" || len(a.Events) < 2 || a.Events[0].Type != "claimed" {
		t.Errorf("show: %+v", a)
	}
	if code := b.apiCall(t, "GET", "/api/actions/nope", "", &e); code != 404 || e.Error == "" {
		t.Errorf("show unknown: %d %q", code, e.Error)
	}
	// A key prefix of 8 or more characters will do, as in the command.
	var byPrefix apiAction
	if code := b.apiCall(t, "GET", "/api/actions/"+string(b.ok[:10]), "", &byPrefix); code != 200 || byPrefix.Key != string(b.ok) {
		t.Errorf("show by a key prefix: %d, key %q", code, byPrefix.Key)
	}
	if code := b.apiCall(t, "GET", "/api/actions/"+string(b.ok[:5]), "", &e); code != 404 && code != 400 {
		t.Errorf("show by a 5-character prefix: %d; want it refused", code)
	}

	var stats struct {
		ByStatus      map[string]int            `json:"by_status"`
		ByKind        map[string]map[string]int `json:"by_kind"`
		Total         int                       `json:"total"`
		ReviewBacklog int                       `json:"review_backlog"`
	}
	if code := b.apiCall(t, "GET", "/api/stats", "", &stats); code != 200 || stats.ReviewBacklog != 1 || stats.Total != 3 ||
		stats.ByStatus["succeeded"] != 1 || stats.ByStatus["in_flight"] != 0 || stats.ByKind["send_email"]["failed"] != 1 {
		t.Errorf("stats: %d %+v", code, stats)
	}

	var run struct {
		Run   string
		Steps []apiAction
	}
	if code := b.apiCall(t, "GET", "/api/runs/run-1", "", &run); code != 200 || run.Run != "run-1" || len(run.Steps) != 3 || run.Steps[2].Key != string(b.failed) {
		t.Errorf("run: %d %+v", code, run)
	}
	if code := b.apiCall(t, "GET", "/api/runs/none", "", &e); code != 404 {
		t.Errorf("unknown run: %d", code)
	}

	resolve := "/api/actions/" + string(b.review) + "/resolve"
	for _, tt := range []struct {
		body string
		code int
		want string
	}{
		{`{"decision":"retry"}`, 400, "Note is empty"},
		{`{"decision":"later","note":"n"}`, 400, "not done, retry or abandon"},
		{`{"decision":"retry","note":"n","result":{"a":1}}`, 400, "Result is only stored with Done"},
		{`{"decision":"retry","note":"n","extra":1}`, 400, "unknown field"},
		{`{"decision":"retry","note":"n"} {}`, 400, "after the decision"},
		{`[1]`, 400, "not a decision"},
	} {
		if code := b.apiCall(t, "POST", resolve, tt.body, &e); code != tt.code || !strings.Contains(e.Error, tt.want) {
			t.Errorf("resolve %s: %d %q, want %d %q", tt.body, code, e.Error, tt.code, tt.want)
		}
	}
	// A form-encoded body, all a cross-site form can send, is refused.
	r := httptest.NewRequest("POST", b.url(resolve), strings.NewReader("decision=retry&note=n"))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if w := b.serve(r); w.Code != http.StatusUnsupportedMediaType {
		t.Errorf("form-encoded API resolve: %d, want 415", w.Code)
	}
	r = httptest.NewRequest("POST", b.url(resolve), strings.NewReader(`{"decision":"retry","note":"n"}`))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Origin", "https://evil.example")
	if w := b.serve(r); w.Code != http.StatusForbidden {
		t.Errorf("API resolve from a foreign Origin: %d, want 403", w.Code)
	}
	if got := b.status(t, b.review); got != once.StatusReview {
		t.Fatalf("after refused API calls the action is %s", got)
	}

	a = apiAction{}
	if code := b.apiCall(t, "POST", resolve, `{"decision":"done","note":"found it in the provider log","by":"ada","result":{"id":"m-9"}}`, &a); code != 200 ||
		a.Status != "succeeded" || a.ResolvedBy != "ada" || compact(t, a.Result) != `{"id":"m-9"}` {
		t.Errorf("resolve: %d %+v", code, a)
	}
	if got := b.status(t, b.review); got != once.StatusSucceeded {
		t.Errorf("after the API resolution the action is %s", got)
	}
	e = apiError{}
	if code := b.apiCall(t, "POST", resolve, `{"decision":"retry","note":"again"}`, &e); code != 409 || e.Action == nil || e.Action.Status != "succeeded" {
		t.Errorf("second resolve: %d %+v", code, e)
	}
	if code := b.apiCall(t, "POST", "/api/actions/feed/resolve", `{"decision":"retry","note":"n"}`, &e); code != 404 {
		t.Errorf("resolve unknown: %d", code)
	}
}

// A result over Config.MaxResultBytes is the client's to refuse, and the
// refusal is the user's mistake: a 400, from the form and from the API.
func TestResolveResultTooLarge(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{})
	const limit = 32
	client, err := once.New(once.Config{Store: b.store, MaxResultBytes: limit})
	if err != nil {
		t.Fatal(err)
	}
	b.mount(t, console.Config{Client: client})
	big := `{"id":"` + strings.Repeat("x", limit) + `"}`

	cookie, token := b.form(t, "/actions/"+string(b.review))
	w := b.serve(b.postForm("/actions/"+string(b.review)+"/resolve", url.Values{
		"decision": {"done"}, "note": {"sent by hand"}, "result": {big}, "csrf": {token},
	}, cookie))
	if body := w.Body.String(); w.Code != http.StatusBadRequest || !strings.Contains(body, "MaxResultBytes") || !strings.Contains(body, `class="error"`) {
		t.Errorf("form: %d, want 400 naming MaxResultBytes\n%s", w.Code, body)
	}

	var e apiError
	if code := b.apiCall(t, "POST", "/api/actions/"+string(b.review)+"/resolve",
		`{"decision":"done","note":"sent by hand","result":`+big+`}`, &e); code != http.StatusBadRequest || !strings.Contains(e.Error, "MaxResultBytes") {
		t.Errorf("API: %d %q, want 400 naming MaxResultBytes", code, e.Error)
	}
	if got := b.status(t, b.review); got != once.StatusReview {
		t.Errorf("after refused oversized results the action is %s, want review", got)
	}
}

// A released action that no delivery claimed within its kind's
// RedriveAfter is listed on the overview: it runs only if its job comes
// again.
func TestOverviewListsWaitingReleased(t *testing.T) {
	ctx := context.Background()
	const redriveAfter = 2 * time.Second
	client, _ := testdb.SQLiteClient(t, once.Config{Default: once.KindPolicy{RedriveAfter: redriveAfter}})
	in := once.Intent{Run: "run-9", Kind: "send_email", Target: "ada@example.com"}
	once.Do(ctx, client, in, func(context.Context, once.Attempt) (int, error) { return 0, errors.New("reset after DATA") })
	k, _, _ := once.KeyOf(in)
	released := time.Now()
	if _, err := client.Resolve(ctx, k, once.Resolution{Decision: once.DecisionRetry, By: "ada", Note: "send again"}); err != nil {
		t.Fatal(err)
	}
	h, err := console.New(console.Config{Client: client})
	if err != nil {
		t.Fatal(err)
	}
	get := func() string {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		if rec.Code != http.StatusOK {
			t.Fatalf("overview: %d %s", rec.Code, rec.Body)
		}
		return rec.Body.String()
	}
	// Read before RedriveAfter has passed since the release (the
	// clock is read after the page, so a slow machine cannot make a
	// late read count as early).
	body := get()
	if time.Since(released) < redriveAfter && strings.Contains(body, "waiting for a delivery") {
		t.Fatal("a just-released action is listed as waiting")
	}
	for deadline := time.Now().Add(redriveAfter + 10*time.Second); ; time.Sleep(100 * time.Millisecond) {
		body = get()
		if strings.Contains(body, "waiting for a delivery") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the overview does not list the released action waiting for a delivery:\n%s", body)
		}
	}
	if !strings.Contains(body, string(k[:12])) || !strings.Contains(body, "run-9") {
		t.Fatalf("the overview lists a waiting action but not this one:\n%s", body)
	}
}

// The kinds page lists every kind in the store with the recovery its
// actions recorded, this process's policy for it, and its counts.
func TestKindsPage(t *testing.T) {
	ctx := context.Background()
	store, err := sqlite.Open(filepath.Join(t.TempDir(), "once.db"), sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	verify := func(context.Context, once.Action) (bool, json.RawMessage, error) {
		return false, nil, errors.New("cannot tell")
	}
	app, err := once.New(once.Config{Store: store, Kinds: map[string]once.KindPolicy{
		"charge_card":  {Recovery: once.RetryWithProviderKey},
		"post_message": {Recovery: once.VerifyThenDecide, Verifier: verify},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for i, kind := range []string{"charge_card", "post_message", "send_email"} {
		once.Do(ctx, app, once.Intent{Run: "r", Step: int64(i), Kind: kind}, func(context.Context, once.Attempt) (int, error) { return 1, nil })
	}
	// The console of a process that knows no kinds (once serve).
	h := blindConsole(t, store)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/api/kinds", nil))
	var kinds []struct {
		Kind     string           `json:"kind"`
		Recorded []string         `json:"recorded_recovery"`
		Counts   map[string]int64 `json:"counts"`
		Policy   struct {
			Recovery string `json:"recovery"`
			Verifier bool   `json:"verifier"`
		} `json:"policy"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &kinds); err != nil || rec.Code != http.StatusOK {
		t.Fatalf("/api/kinds: %d %s (%v)", rec.Code, rec.Body, err)
	}
	want := map[string]string{"charge_card": "retry_with_provider_key", "post_message": "verify_then_decide", "send_email": "ask_person"}
	if len(kinds) != len(want) {
		t.Fatalf("kinds %+v, want %d", kinds, len(want))
	}
	for _, k := range kinds {
		if len(k.Recorded) != 1 || k.Recorded[0] != want[k.Kind] || k.Counts["succeeded"] != 1 || k.Policy.Recovery != "ask_person" || k.Policy.Verifier {
			t.Errorf("kind %+v; want recorded %s, one succeeded, and this process's own policy (ask_person, no verifier)", k, want[k.Kind])
		}
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/kinds", nil))
	body := rec.Body.String()
	for _, s := range []string{"charge_card", "retry_with_provider_key", "verify_then_decide", "not configured here"} {
		if !strings.Contains(body, s) {
			t.Errorf("the kinds page lacks %q", s)
		}
	}
}

// TestOriginAgainstAllowedHosts: with Config.AllowedHosts, a write's
// Origin is held to those names, not to the request's own Host: behind
// a proxy that sends the console 127.0.0.1, a form from an allowed name
// goes through, and one from any other name does not.
func TestOriginAgainstAllowedHosts(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{AllowedHosts: []string{"127.0.0.1", "console.example"}})
	page := httptest.NewRequest(http.MethodGet, "/actions/"+string(b.review), nil)
	page.Host = "127.0.0.1:7070"
	w := b.serve(page)
	m := csrfField.FindStringSubmatch(w.Body.String())
	var cookie *http.Cookie
	for _, c := range w.Result().Cookies() {
		if c.Name == "once_csrf" {
			cookie = c
		}
	}
	if w.Code != http.StatusOK || m == nil || cookie == nil {
		t.Fatalf("GET the action: %d, csrf field %v, cookie %v", w.Code, m != nil, cookie)
	}
	post := func(origin string) int {
		r := b.postForm("/actions/"+string(b.review)+"/resolve", url.Values{"decision": {"retry"}, "note": {"checked"}, "csrf": {m[1]}}, cookie)
		r.Host = "127.0.0.1:7070"
		r.Header.Set("Origin", origin)
		r.Header.Set("Sec-Fetch-Site", "same-origin")
		return b.serve(r).Code
	}
	for _, origin := range []string{"https://evil.example", "https://console.example.evil.example", "null", "http://rebind.attacker.example:7070"} {
		if code := post(origin); code != http.StatusForbidden {
			t.Errorf("POST with Origin %s: %d, want 403", origin, code)
		}
	}
	if got := b.status(t, b.review); got != once.StatusReview {
		t.Fatalf("after refused POSTs the action is %s, want review", got)
	}
	if code := post("https://console.example"); code != http.StatusSeeOther {
		t.Errorf("POST with Origin https://console.example, an allowed name: %d, want 303", code)
	}
}

// TestHostCheckedWithToken: AllowedHosts holds with a token too, for
// every route, /healthz included.
func TestHostCheckedWithToken(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{Token: "tok", AllowedHosts: []string{"localhost"}})
	for _, p := range []string{"/", "/review", "/api/stats", "/healthz", "/static/console.css"} {
		r := httptest.NewRequest(http.MethodGet, p, nil)
		r.Host = "rebind.attacker.example"
		r.Header.Set("Authorization", "Bearer tok")
		if w := b.serve(r); w.Code != http.StatusMisdirectedRequest {
			t.Errorf("GET %s with a foreign Host and the token: %d, want 421", p, w.Code)
		}
		r.Host = "localhost:7070"
		if w := b.serve(r); w.Code != http.StatusOK {
			t.Errorf("GET %s with Host localhost and the token: %d, want 200", p, w.Code)
		}
	}
}

var (
	reviewItem = regexp.MustCompile(`<tr id="item-([0-9a-f]+)">`)
	nextPage   = regexp.MustCompile(`<a href="([^"]+)"[^>]*>Next page`)
)

// TestReviewPages: the review queue pages through a backlog oldest
// first, a page at a time, each page linking to the next under the
// console's prefix, and says how many wait in all. Eight actions in
// review share two timestamps, so the pages must also order (and resume)
// by key.
func TestReviewPages(t *testing.T) {
	t.Parallel()
	forMounts(t, func(t *testing.T, m mount) {
		ctx := context.Background()
		store, path := testdb.NewSQLite(t)
		if err := store.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		client, err := once.New(once.Config{Store: store})
		if err != nil {
			t.Fatal(err)
		}
		for step := range int64(8) {
			in := once.Intent{Run: "run-p", Step: step, Kind: "send_email", Target: fmt.Sprintf("u%d@example.com", step)}
			once.Do(ctx, client, in, func(context.Context, once.Attempt) (string, error) { return "", errors.New("connection reset") })
		}
		db, err := sql.Open("sqlite", path)
		if err != nil {
			t.Fatal(err)
		}
		_, err = db.Exec(`UPDATE once_action SET updated_at = 1700000000000 + (rowid % 2)`)
		db.Close()
		if err != nil {
			t.Fatal(err)
		}
		want, err := client.List(ctx, once.Filter{Status: once.StatusReview, OldestFirst: true})
		if err != nil || len(want) != 8 {
			t.Fatalf("setup: %d actions in review, %v", len(want), err)
		}
		b := &bundle{client: client}
		b.mount(t, console.Config{Client: client, Prefix: m.Prefix})

		var got []string
		link := b.url("/review?limit=3")
		for pages := 0; link != ""; pages++ {
			if pages == 4 {
				t.Fatalf("more than 3 pages of 3 for 8 actions; seen %d", len(got))
			}
			w := b.serve(httptest.NewRequest(http.MethodGet, link, nil))
			body := w.Body.String()
			if w.Code != http.StatusOK {
				t.Fatalf("GET %s: %d\n%s", link, w.Code, body)
			}
			if !strings.Contains(body, "8 in all") {
				t.Errorf("GET %s does not say 8 in all", link)
			}
			items := reviewItem.FindAllStringSubmatch(body, -1)
			if len(items) == 0 || len(items) > 3 {
				t.Errorf("GET %s: %d items, want 1 to 3", link, len(items))
			}
			for _, it := range items {
				got = append(got, it[1])
			}
			link = ""
			if n := nextPage.FindStringSubmatch(body); n != nil {
				link = html.UnescapeString(n[1])
				if !strings.HasPrefix(link, b.url("/review?")) {
					t.Fatalf("the next page link %q is not the console's review page", link)
				}
			}
		}
		var keys []string
		for _, a := range want {
			keys = append(keys, string(a.Key))
		}
		if !slices.Equal(got, keys) {
			t.Errorf("the pages listed\n%q\nwant, oldest first then by key,\n%q", got, keys)
		}
		for _, bad := range []string{"/review?after=x", "/review?after=12-zz", "/review?limit=0", "/review?limit=501"} {
			if w := b.get(bad); w.Code != http.StatusBadRequest {
				t.Errorf("GET %s: %d, want 400", bad, w.Code)
			}
		}
	})
}

// blindConsole is the console of a process that knows none of the
// application's kinds (as once serve's), over store.
func blindConsole(t *testing.T, store once.Store) http.Handler {
	t.Helper()
	blind, err := once.New(once.Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	h, err := console.New(console.Config{Client: blind})
	if err != nil {
		t.Fatal(err)
	}
	return h
}
