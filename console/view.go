package console

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/view"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static/console.css
var css []byte

// cssVersion changes whenever the stylesheet does, so it can be cached
// for long and still never be stale.
var cssVersion = func() string {
	sum := sha256.Sum256(css)
	return hex.EncodeToString(sum[:6])
}()

func serveCSS(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/css; charset=utf-8")
	w.Header().Set("Cache-Control", "public, max-age=86400")
	w.Write(css)
}

// funcs are the templates' functions. The URLs they make carry the
// console's prefix, so the templates are parsed per console.
func (s *server) funcs() template.FuncMap {
	return template.FuncMap{
		"path":       s.path,
		"short":      view.ShortKey,
		"time":       view.Time,
		"rfc3339":    func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
		"ago":        view.Ago,
		"duration":   view.Duration,
		"actionURL":  s.actionURL,
		"runURL":     s.runURL,
		"resolvable": once.Status.Resolvable,
		"awaiting":   func(s once.Status) bool { return s == once.StatusAwaitingApproval },
		"prettyJSON": prettyJSON,
		"form": func(csrf string, a once.Action, next string) formView {
			return formView{Key: a.Key, Attempt: a.Attempt, CSRF: csrf, Next: next, NeverRan: a.NeverRan()}
		},
		"withCSRF": func(f formView, csrf string) formView { f.CSRF = csrf; return f },
	}
}

// pageNames are the templates under templates/, each rendered inside
// layout.html with the shared partials.
var pageNames = []string{"overview", "actions", "action", "run", "review", "approvals", "kinds", "error"}

func (s *server) parsePages() (map[string]*template.Template, error) {
	pages := make(map[string]*template.Template, len(pageNames))
	for _, name := range pageNames {
		t, err := template.New(name).Funcs(s.funcs()).ParseFS(templateFS,
			"templates/layout.html", "templates/partials.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: parsing template %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}

// page is what every template gets: the layout's needs and the page's
// own Data.
type page struct {
	Title string
	Nav   string
	CSS   string
	CSRF  string
	Flash string
	Error string
	Data  any
}

// render executes a page into a buffer first, so a template error becomes
// a clean 500 instead of half a page.
func (s *server) render(w http.ResponseWriter, r *http.Request, code int, name string, p page) {
	p.CSS = s.cssURL
	p.CSRF = s.csrfToken(w, r)
	p.Flash = s.takeFlash(w, r)
	var buf bytes.Buffer
	if err := s.pages[name].ExecuteTemplate(&buf, "layout", p); err != nil {
		s.log.Error("console: rendering page", "page", name, "err", err)
		http.Error(w, "console: rendering the page failed: "+err.Error(), http.StatusInternalServerError)
		return
	}
	// Stored text may hold ESC, BEL and other control characters; the
	// page shows them as Go escapes, as once show prints them.
	send(w, code, "text/html; charset=utf-8", view.EscapeControls(buf.Bytes()))
}

// send writes a response rendered in full beforehand, so that a failure
// while rendering can still answer 500 instead of half a page.
func send(w http.ResponseWriter, code int, contentType string, body []byte) {
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	w.Write(body)
}

type errorPage struct {
	Heading string
	Message string
}

func (s *server) renderError(w http.ResponseWriter, r *http.Request, code int, heading, msg string) {
	if code >= 500 {
		s.log.Error("console: request failed", "method", r.Method, "path", r.URL.Path, "err", msg)
	}
	s.render(w, r, code, "error", page{Title: heading, Data: errorPage{Heading: heading, Message: msg}})
}

func (s *server) actionURL(k once.Key) string { return s.path("/actions/" + url.PathEscape(string(k))) }

// runURL links to a run's page. A run id made only of dots would be read
// as "." or ".." by every URL parser on the way, so it gets the filtered
// list instead.
func (s *server) runURL(run string) string {
	if strings.Trim(run, ".") == "" {
		return s.path("/actions?" + url.Values{"run": {run}}.Encode())
	}
	return s.path("/runs/" + url.PathEscape(run))
}

// maxShown caps how much of a payload or result a page prints; the JSON
// API has the rest.
const maxShown = 64 << 10

// maxApprovalShown is how much of the payload of an action awaiting
// approval its page prints: all of it up to the default
// Config.MaxPayloadBytes, since Approve applies to every byte of it. A
// larger payload (a client configured for more) is cut, and the page
// then offers Reject only, saying how to read the payload whole.
const maxApprovalShown = once.DefaultMaxPayloadBytes

type payloadView struct {
	Format string // "json", "text" or "hex"
	Text   string
	Size   int
	Cut    int // bytes not shown
}

// showPayload renders a payload for a person: indented if it is JSON,
// as text if it is UTF-8, as a hex dump otherwise.
func showPayload(b []byte) payloadView { return cutPayload(b, maxShown) }

// cutPayload renders at most max bytes of a payload, as showPayload
// does: a queue's preview is shorter than an action page's payload.
func cutPayload(b []byte, max int) payloadView {
	v := payloadView{Size: len(b)}
	if len(b) > max {
		v.Cut = len(b) - max
		b = b[:max]
	}
	text := b
	if v.Cut > 0 {
		text = view.TrimSplitRune(b)
	}
	switch {
	case v.Cut == 0 && json.Valid(b):
		v.Format, v.Text = "json", prettyJSON(b)
	case utf8.Valid(text):
		v.Format, v.Text = "text", string(text)
	default:
		v.Format, v.Text = "hex", hex.Dump(b)
	}
	return v
}

func prettyJSON(b []byte) string {
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return string(b)
	}
	return out.String()
}

// counts is Stats arranged for the overview and /api/stats.
type counts struct {
	ByStatus map[once.Status]int64
	Kinds    []string
	ByKind   map[string]map[once.Status]int64
	KindSum  map[string]int64
	Total    int64
	// FinishedAsOf is when the oldest count among them was made, when
	// the store took it from an earlier count (a large log's finished
	// actions, StatusCount.AsOf); zero when all were counted now.
	FinishedAsOf time.Time
}

func tally(cs []once.StatusCount) counts {
	c := counts{ByStatus: map[once.Status]int64{}, ByKind: map[string]map[once.Status]int64{}, KindSum: map[string]int64{}}
	for _, s := range once.Statuses() {
		c.ByStatus[s] = 0
	}
	for _, sc := range cs {
		if c.ByKind[sc.Kind] == nil {
			c.ByKind[sc.Kind] = map[once.Status]int64{}
			c.Kinds = append(c.Kinds, sc.Kind)
		}
		c.ByKind[sc.Kind][sc.Status] += sc.Count
		c.ByStatus[sc.Status] += sc.Count
		c.KindSum[sc.Kind] += sc.Count
		c.Total += sc.Count
	}
	slices.Sort(c.Kinds)
	c.FinishedAsOf = countedAsOf(cs)
	return c
}

// countedAsOf is when the oldest of cs was counted, when the store took
// it from an earlier count (StatusCount.AsOf), or zero.
func countedAsOf(cs []once.StatusCount) time.Time {
	var at time.Time
	for _, sc := range cs {
		if !sc.AsOf.IsZero() && (at.IsZero() || sc.AsOf.Before(at)) {
			at = sc.AsOf
		}
	}
	return at
}
