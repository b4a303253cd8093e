package console_test

import (
	"html"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/oncehq/once/console"
)

// linkAttr finds the URLs a page hands the browser.
var linkAttr = regexp.MustCompile(`(href|action|src)="([^"]*)"`)

// TestLinksStayUnderMount reads every page the console has and follows
// every link on it: each must point under the console's path, and each
// page it points to must load. A link that forgot the prefix would lead
// into the application's own routes.
func TestLinksStayUnderMount(t *testing.T) {
	t.Parallel()
	forMounts(t, func(t *testing.T, m mount) {
		b := setup(t, console.Config{Prefix: m.Prefix, Reaper: new(console.ReaperStatus)})
		pages := []string{"/", "/review", "/actions", "/actions?status=review", "/actions/" + string(b.review),
			"/actions/" + string(b.ok), "/runs/run-1", "/actions/0123abcd", "/runs/nope"}
		followed := map[string]bool{}
		for _, p := range pages {
			w := b.get(p)
			if w.Code != http.StatusOK && w.Code != http.StatusNotFound {
				t.Fatalf("GET %s: %d", b.url(p), w.Code)
			}
			for _, l := range linkAttr.FindAllStringSubmatch(w.Body.String(), -1) {
				attr, link := l[1], html.UnescapeString(l[2])
				if strings.HasPrefix(link, "data:") {
					continue // the empty favicon
				}
				if !strings.HasPrefix(link, b.url("/")) {
					t.Errorf("GET %s: %s=%q is not under %s", b.url(p), attr, link, b.url("/"))
					continue
				}
				if attr == "action" && strings.HasSuffix(link, "/resolve") || followed[link] {
					continue // a POST form, tested on its own
				}
				followed[link] = true
				if lw := b.serve(httptest.NewRequest(http.MethodGet, link, nil)); lw.Code != http.StatusOK {
					t.Errorf("GET %s, linked from %s: %d", link, b.url(p), lw.Code)
				}
			}
		}
		if len(followed) < 10 {
			t.Errorf("followed only %d links: %v", len(followed), followed)
		}
	})
}

// TestMountedUnderPrefix: mounted on an application's mux, the console
// answers under its prefix and nowhere else, and the application keeps
// the rest of its paths.
func TestMountedUnderPrefix(t *testing.T) {
	t.Parallel()
	const prefix = "/ops/once"
	b := setup(t, console.Config{Prefix: prefix + "/"}) // a trailing slash is dropped
	if b.prefix != prefix {
		t.Fatalf("bundle prefix %q", b.prefix)
	}
	if w := b.serve(httptest.NewRequest(http.MethodGet, "/", nil)); w.Code != 200 || w.Body.String() != appHome {
		t.Errorf("GET / on the application's mux: %d %q, want the application's page", w.Code, w.Body)
	}

	direct := func(path string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		b.console.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		return w
	}
	if w := direct(prefix + "?status=review"); w.Code != http.StatusMovedPermanently || w.Header().Get("Location") != prefix+"/?status=review" {
		t.Errorf("GET %s: %d to %q, want a redirect to %s/", prefix, w.Code, w.Header().Get("Location"), prefix)
	}
	for _, p := range []string{"/", "/review", "/api/stats", "/healthz", prefix + "x/review", "/ops/review"} {
		if w := direct(p); w.Code != http.StatusNotFound {
			t.Errorf("GET %s straight to the console mounted at %s: %d, want 404", p, prefix, w.Code)
		}
	}
	if w := direct(prefix + "/review"); w.Code != http.StatusOK || !strings.Contains(w.Body.String(), short(b.review)) {
		t.Errorf("GET %s/review: %d", prefix, w.Code)
	}
}
