// Package console is once's web console: the operator's view of the action
// log and the place a person resolves the actions nobody else can.
//
// An action lands in review because the machine cannot know whether its
// effect happened; only a person who looks at the mail log, the provider's
// dashboard or the customer can. The console exists to make that person's
// job short: the backlog on the front page, the reason and the payload
// beside the decision, and every decision written to the action's trail.
//
// It is server-rendered HTML (html/template, one embedded stylesheet, no
// JavaScript), so it works in any browser, through any proxy, and forms
// post without scripts. A JSON API under /api/ mirrors the pages for
// scripts, and /metrics serves a Prometheus registry when one is given.
//
// Writes are guarded twice: every POST is checked for a cross-origin
// Origin (and Sec-Fetch-Site), and page forms carry a CSRF token bound to
// a per-browser cookie. With Config.Token set, every request but /healthz
// must also carry the token.
package console

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"html/template"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/oncehq/once"
)

// Config configures the console. Only Client is required.
type Config struct {
	// Client is the once client whose store the console reads and through
	// which it resolves actions. Required.
	Client *once.Client
	// Registry, if not nil, is served at /metrics. Nil means no /metrics.
	Registry *prometheus.Registry
	// Token, if not empty, must accompany every request except /healthz:
	// as "Authorization: Bearer TOKEN", or as the once_token cookie that
	// opening any page with ?token=TOKEN sets. Empty means no
	// authentication: bind the console to a trusted address.
	Token string
	// Logger receives request failures and resolutions. Nil discards.
	Logger *slog.Logger
	// Reaper, if not nil, returns the last reaper pass's report, shown on
	// the overview. Nil hides it.
	Reaper func() once.ReapReport
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
	reaper func() once.ReapReport

	// tokenHash is the SHA-256 of Config.Token; comparing hashes in
	// constant time hides the token's length as well as its bytes.
	tokenHash [32]byte
	hasToken  bool

	// csrfSecret keys the CSRF tokens. It is per process: a restart
	// invalidates open forms, which then fail with a message to reload.
	csrfSecret []byte
	cop        *http.CrossOriginProtection

	pages  map[string]*template.Template
	cssURL string
}

// New validates cfg and returns the console's handler. It does no I/O.
func New(cfg Config) (http.Handler, error) {
	if cfg.Client == nil {
		return nil, errors.New("console: Config.Client is nil; pass the *once.Client whose actions the console shows")
	}
	if err := checkToken(cfg.Token); err != nil {
		return nil, err
	}
	s := &server{
		client:     cfg.Client,
		log:        cfg.Logger,
		reaper:     cfg.Reaper,
		csrfSecret: make([]byte, 32),
		cop:        http.NewCrossOriginProtection(),
	}
	if s.log == nil {
		s.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Token != "" {
		s.tokenHash, s.hasToken = sha256.Sum256([]byte(cfg.Token)), true
	}
	if _, err := rand.Read(s.csrfSecret); err != nil {
		return nil, fmt.Errorf("console: reading randomness for the CSRF secret: %w", err)
	}
	var err error
	if s.pages, err = parsePages(); err != nil {
		return nil, err
	}
	s.cssURL = "/static/console.css?v=" + cssVersion

	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", s.overview)
	mux.HandleFunc("GET /actions", s.actions)
	mux.HandleFunc("GET /actions/{key}", s.action)
	mux.HandleFunc("POST /actions/{key}/resolve", s.resolveForm)
	mux.HandleFunc("GET /runs/{run}", s.run)
	mux.HandleFunc("GET /review", s.review)
	mux.HandleFunc("GET /static/console.css", serveCSS)

	mux.HandleFunc("GET /api/actions", s.apiActions)
	mux.HandleFunc("GET /api/actions/{key}", s.apiAction)
	mux.HandleFunc("POST /api/actions/{key}/resolve", s.apiResolve)
	mux.HandleFunc("GET /api/stats", s.apiStats)
	mux.HandleFunc("GET /api/runs/{run}", s.apiRun)

	mux.HandleFunc("GET /healthz", s.healthz)
	if cfg.Registry != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{}))
	}
	return securityHeaders(s.authenticate(s.guardWrites(mux))), nil
}

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
		if err := checkOrigin(r); err != nil {
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
// with the reason otherwise. Version is a cheap schema check, unlike
// Stats, which scans the action table. It never needs the token, so load
// balancers and orchestrators can probe it.
func (s *server) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), healthTimeout)
	defer cancel()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	v, err := s.client.SchemaVersion(ctx)
	switch {
	case err != nil:
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "store unavailable: %v\n", err)
	case v <= 0:
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, "store not migrated: the schema is missing; run `once migrate`\n")
	default:
		io.WriteString(w, "ok\n")
	}
}
