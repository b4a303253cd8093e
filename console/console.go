// Package console is once's web console: the operator's view of the action
// log and the place a person resolves the actions nobody else can.
//
// An action lands in review because the machine cannot know whether its
// effect happened; only a person who looks at the mail log, the provider's
// dashboard or the customer can. The console exists to make that person's
// job short: the backlog on the front page, the reason and the payload
// beside the decision, and every decision written to the action's trail.
//
// New returns an http.Handler. `once serve` runs it on its own; an
// application that registers verifiers and policies mounts it on its own
// mux, under a path of its choosing (Config.Prefix), so the console
// resolves through the application's client:
//
//	h, err := console.New(console.Config{Client: client, Prefix: "/ops/once"})
//	mux.Handle("/ops/once/", h)
//
// It is server-rendered HTML (html/template, one embedded stylesheet, no
// JavaScript), so it works in any browser, through any proxy, and forms
// post without scripts. A JSON API under /api/ mirrors the pages for
// scripts, and /metrics serves a Prometheus registry when one is given.
// It reads only through the client's read API and writes only through
// Client.Resolve, Client.Approve and Client.Reject.
//
// Writes are guarded twice: every POST is checked for a cross-origin
// Origin (and Sec-Fetch-Site), and page forms carry a CSRF token bound to
// a per-browser cookie. With Config.Token set, every request but /healthz
// must also carry the token; /healthz then answers only "ok" or
// "unavailable".
//
// Connections are the server's to bound, not the handler's. `once serve`
// holds at most 256 open (and one it accepted while it makes room: when
// all are taken, a connection that has sent no request for a second is
// closed for the next one); a connection that has not yet carried the
// token (a /healthz probe, a 401) is a guest: one client address may
// hold 16 guests, guests may fill only 224 of the 256 slots, so 32 stay
// for requests with the token, and a guest idle for 5 s is closed. Each
// request must send its headers within 5 s and its body within 30 s.
// An application that mounts the console sets its own http.Server's
// limits; without them a flood of keep-alive connections can keep out
// the operator.
package console

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"html/template"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/oncehq/once"
)

// Config configures the console. Only Client is required.
type Config struct {
	// Client is the once client whose actions the console reads and
	// through which it resolves them. Required. Use the application's own
	// client, so that a resolution sees its policies.
	Client *once.Client
	// Prefix is the path the console is mounted under, such as
	// "/ops/once": every link, form, redirect and cookie carries it, and
	// the handler expects the full request path, so mount it at
	// Prefix+"/" without stripping the prefix. It must start with "/";
	// a trailing "/" is dropped. Empty means the root of the host.
	Prefix string
	// Registry, if not nil, is served at /metrics. Nil means no /metrics.
	// The console serves whatever the registry holds: the metrics
	// package's counters there count only what this process did (its
	// reaper's passes, the decisions made here), while its once_actions
	// gauges are read from the store and cover every process.
	Registry prometheus.Gatherer
	// Token, if not empty, must accompany every request except /healthz
	// (which then tells only "ok" or "unavailable", never why):
	// as "Authorization: Bearer TOKEN", or as the once_token cookie that
	// opening any page with ?token=TOKEN sets. Empty means no
	// authentication: bind the console to a trusted address, or guard
	// the mount with the application's own authentication.
	//
	// Wrong tokens are limited per client address (an IPv6 address by
	// its /64): after 10, one more every 6 s. Past that, every request
	// from the address that carries a token gets 429 with Retry-After,
	// right token or wrong, until its attempts refill; under `once
	// serve`, a connection that showed the right token before is
	// answered still, so a guesser beside the operator (any local
	// process, for a console on loopback) does not cut off the
	// operator's open connection, though a new one waits. Behind a proxy
	// the address is the proxy's, so a guesser there slows everyone
	// down. Wrong tokens are logged (Warn, at most one line a minute per
	// address and 60 a minute in all), and so is each ?token= login
	// (Info); the token itself never is.
	Token string
	// Logger receives request failures and resolutions. Nil discards.
	Logger *slog.Logger
	// Reaper, if not nil, is where the overview reads the last reaper
	// pass: pass its OnPass to once.ReaperConfig. Nil hides the pass.
	Reaper *ReaperStatus
	// AllowedHosts, if not empty, are the only host names (the Host
	// header, without its port) the console answers, on every route;
	// any other gets 421. A write's Origin must name one of them too.
	// Name the names browsers use for the console (127.0.0.1 and
	// localhost on loopback), so that a web page whose DNS name an
	// attacker rebinds to the console's address can neither read it nor
	// post to it. Empty answers any host, and holds a write's Origin to
	// the request's own Host; only a Token then keeps a rebound page out.
	AllowedHosts []string
}

// Request body limit for POSTs: room for a resolution's result (256 KiB by
// default) several times over, and no room for a memory attack.
const maxBody = 4 << 20

// healthTimeout bounds /healthz: a load balancer wants a quick no rather
// than a hung probe.
const healthTimeout = 2 * time.Second

type server struct {
	client *once.Client
	log    *slog.Logger
	reaper *ReaperStatus
	// prefix is Config.Prefix, without a trailing slash: "" at the root.
	prefix string

	// tokenHash is the SHA-256 of Config.Token; comparing hashes in
	// constant time hides the token's length as well as its bytes.
	tokenHash [32]byte
	hasToken  bool
	guesses   *guessLimit

	// csrfSecret keys the CSRF tokens. It is per process: a restart
	// invalidates open forms, which then fail with a message to reload.
	csrfSecret []byte
	cop        *http.CrossOriginProtection

	pages  map[string]*template.Template
	cssURL string
	// hosts are Config.AllowedHosts, lowercased; nil allows any.
	hosts map[string]bool
}

// New validates cfg and returns the console's handler. It does no I/O.
func New(cfg Config) (http.Handler, error) {
	if cfg.Client == nil {
		return nil, errors.New("console: Config.Client is nil; pass the *once.Client whose actions the console shows")
	}
	if err := checkToken(cfg.Token); err != nil {
		return nil, err
	}
	prefix, err := cleanPrefix(cfg.Prefix)
	if err != nil {
		return nil, err
	}
	s := &server{
		client:     cfg.Client,
		log:        cfg.Logger,
		reaper:     cfg.Reaper,
		prefix:     prefix,
		csrfSecret: make([]byte, 32),
		cop:        http.NewCrossOriginProtection(),
	}
	if s.log == nil {
		s.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Token != "" {
		s.tokenHash, s.hasToken = sha256.Sum256([]byte(cfg.Token)), true
		s.guesses = newGuessLimit()
	}
	if _, err := rand.Read(s.csrfSecret); err != nil {
		return nil, fmt.Errorf("console: reading randomness for the CSRF secret: %w", err)
	}
	if s.pages, err = s.parsePages(); err != nil {
		return nil, err
	}
	s.cssURL = s.path("/static/console.css?v=" + cssVersion)

	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", s.overview)
	mux.HandleFunc("GET /actions", s.actions)
	mux.HandleFunc("GET /actions/{key}", s.action)
	mux.HandleFunc("POST /actions/{key}/resolve", s.resolveForm)
	mux.HandleFunc("POST /actions/{key}/approve", s.approvalForm(false))
	mux.HandleFunc("POST /actions/{key}/reject", s.approvalForm(true))
	mux.HandleFunc("GET /runs/{run}", s.run)
	mux.HandleFunc("GET /review", s.review)
	mux.HandleFunc("GET /approvals", s.approvals)
	mux.HandleFunc("GET /kinds", s.kinds)
	mux.HandleFunc("GET /static/console.css", serveCSS)

	mux.HandleFunc("GET /api/actions", s.apiActions)
	mux.HandleFunc("GET /api/actions/{key}", s.apiAction)
	mux.HandleFunc("GET /api/actions/{key}/events", s.apiEvents)
	mux.HandleFunc("POST /api/actions/{key}/resolve", s.apiResolve)
	mux.HandleFunc("GET /api/approvals", s.apiApprovals)
	mux.HandleFunc("POST /api/actions/{key}/approve", s.apiDecide(false))
	mux.HandleFunc("POST /api/actions/{key}/reject", s.apiDecide(true))
	mux.HandleFunc("GET /api/stats", s.apiStats)
	mux.HandleFunc("GET /api/kinds", s.apiKinds)
	mux.HandleFunc("GET /api/runs/{run}", s.apiRun)

	mux.HandleFunc("GET /healthz", s.healthz)
	if cfg.Registry != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{}))
	}
	if len(cfg.AllowedHosts) > 0 {
		s.hosts = map[string]bool{}
		for _, h := range cfg.AllowedHosts {
			h = strings.Trim(h, "[]")
			if h == "" || net.ParseIP(h) == nil && strings.ContainsAny(h, ":/ ") {
				return nil, fmt.Errorf("console: Config.AllowedHosts has %q; give host names or addresses without a port", h)
			}
			s.hosts[strings.ToLower(h)] = true
		}
	}
	return s.checkHost(textOnly(s.mount(securityHeaders(s.authenticate(s.guardWrites(mux)))))), nil
}

// cleanPrefix checks Config.Prefix: a path of plain segments, so that it
// needs no escaping in a URL, a cookie's Path or a redirect.
func cleanPrefix(p string) (string, error) {
	p = strings.TrimSuffix(p, "/")
	if p == "" {
		return "", nil
	}
	bad := func(why string) (string, error) {
		return "", fmt.Errorf("console: Config.Prefix %q %s; use a path such as /ops/once", p, why)
	}
	if !strings.HasPrefix(p, "/") {
		return bad("does not start with /")
	}
	for _, seg := range strings.Split(p[1:], "/") {
		if seg == "" || seg == "." || seg == ".." {
			return bad("has an empty, . or .. segment")
		}
		for _, r := range seg {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-._~", r)) {
				return bad(fmt.Sprintf("has %q; only letters, digits and -._~ may stand between the slashes", r))
			}
		}
	}
	return p, nil
}

// textOnly answers 400 for a request whose path or query, decoded, is not
// text: no key, run id or kind holds invalid UTF-8 or NUL, so such a
// request names nothing, and the database would refuse it as data.
func textOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		bad := !isText(r.URL.Path)
		for _, vs := range r.URL.Query() {
			for _, v := range vs {
				bad = bad || !isText(v)
			}
		}
		if bad {
			http.Error(w, "bad request: the URL holds bytes that are not text (invalid UTF-8 or NUL); no key, run or kind has them", http.StatusBadRequest)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func isText(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

// checkHost answers 421 Misdirected Request for a Host that
// Config.AllowedHosts does not name: a DNS name rebound to this machine
// is not the console's.
func (s *server) checkHost(h http.Handler) http.Handler {
	if s.hosts == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if hh, _, err := net.SplitHostPort(host); err == nil {
			host = hh
		}
		if !s.hosts[strings.ToLower(strings.Trim(host, "[]"))] {
			http.Error(w, "misdirected request: this console answers only to "+strings.Join(slices.Sorted(maps.Keys(s.hosts)), ", "), http.StatusMisdirectedRequest)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// mount serves the console's routes under the prefix: the handler sees
// paths as if the console were at the root, and s.path puts the prefix
// back on every URL it writes. The bare prefix is sent to prefix + "/",
// and a path that only starts with the same letters ("/ops/oncex") is
// not the console's.
func (s *server) mount(h http.Handler) http.Handler {
	if s.prefix == "" {
		return h
	}
	inner := http.StripPrefix(s.prefix, h)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest, ok := strings.CutPrefix(r.URL.Path, s.prefix)
		switch {
		case !ok || rest != "" && rest[0] != '/':
			http.NotFound(w, r)
		case rest == "":
			loc := s.prefix + "/"
			if r.URL.RawQuery != "" {
				loc += "?" + r.URL.RawQuery
			}
			http.Redirect(w, r, loc, http.StatusMovedPermanently)
		default:
			inner.ServeHTTP(w, r)
		}
	})
}

// path is the URL of the console's page p ("/review"), prefix included.
func (s *server) path(p string) string { return s.prefix + p }

// cookiePath scopes the console's cookies to its own pages.
func (s *server) cookiePath() string { return cmp.Or(s.prefix, "/") }

// checkToken refuses tokens that cannot travel in an Authorization
// header: whitespace would be trimmed and control bytes rejected on the
// way, so such a token could never match.
func checkToken(tok string) error {
	for _, r := range tok {
		if unicode.IsSpace(r) || unicode.IsControl(r) {
			return errors.New("console: Config.Token contains whitespace or control characters; use a random string of letters and digits (e.g. `openssl rand -hex 32`)")
		}
	}
	return nil
}

// csp allows nothing but this origin's stylesheet: the pages carry no
// script at all, so an injected one has nothing to hide behind.
const csp = "default-src 'self'; script-src 'none'; style-src 'self'; img-src 'self' data:; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "same-origin")
		h.Set("X-Frame-Options", "DENY")
		next.ServeHTTP(w, r)
	})
}

// guardWrites refuses every cross-origin write before it reaches a
// handler. It is the first of two CSRF defences (page forms also carry a
// token): an Origin header naming another host, or a browser's
// Sec-Fetch-Site saying cross-site, is refused. Behind a reverse proxy,
// the proxy must pass the Host header through unchanged.
func (s *server) guardWrites(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions:
			next.ServeHTTP(w, r)
			return
		}
		if err := s.checkOrigin(r); err != nil {
			s.forbidden(w, r, err.Error())
			return
		}
		if err := s.cop.Check(r); err != nil {
			s.forbidden(w, r, "cross-origin request refused: "+err.Error())
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		next.ServeHTTP(w, r)
	})
}

func (s *server) forbidden(w http.ResponseWriter, r *http.Request, msg string) {
	if isAPI(r) {
		writeJSONError(w, http.StatusForbidden, msg)
		return
	}
	s.renderError(w, r, http.StatusForbidden, "Forbidden", msg)
}

func isAPI(r *http.Request) bool {
	return r.URL.Path == "/api" || strings.HasPrefix(r.URL.Path, "/api/")
}

// healthz answers whether the store answers and its schema is in place:
// 200 if Version returns a migrated schema within healthTimeout, 503
// otherwise. Version is a cheap schema check, unlike Stats, which scans
// the action table. It never needs the token, so load balancers and
// orchestrators can probe it; for that reason it tells the reason for a
// 503 (which names the database, its user and its server) only to a
// caller on this machine of a console without a token. Everyone else
// reads "unavailable", and the reason goes to the log.
func (s *server) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), healthTimeout)
	defer cancel()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	err := s.client.CheckSchema(ctx)
	var why string
	switch {
	case errors.Is(err, once.ErrSchema):
		why = strings.TrimPrefix(err.Error(), once.ErrSchema.Error()+": ")
		if strings.Contains(why, "missing") {
			why = "store not migrated: " + why
		}
	case err != nil:
		why = fmt.Sprintf("store unavailable: %v", err)
	default:
		io.WriteString(w, "ok\n")
		return
	}
	s.log.Warn("console: health check failed", "remote", r.RemoteAddr, "err", why)
	w.WriteHeader(http.StatusServiceUnavailable)
	if s.hasToken || !fromLoopback(r) {
		io.WriteString(w, "unavailable\n")
		return
	}
	io.WriteString(w, why+"\n")
}

// fromLoopback says whether the request came from this machine's
// loopback interface.
func fromLoopback(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
