// Package idemhttp brings once to HTTP: a server middleware for the
// Idempotency-Key header field (the IETF httpapi draft "The
// Idempotency-Key HTTP Header Field"), and a client transport that sends a
// once provider key as that header, so a provider that honours it absorbs
// a retried call.
//
// The middleware runs a handler at most once per key and tenant and
// replays its stored response to every repeat, through once.Do: the
// database arbitrates concurrent requests, and a crash mid-handler is
// recovered by the route's kind policy like any other effect.
//
// # Handlers that call once.Do
//
// A handler may carry out its effects through once.Do calls of its own:
// an email, a charge at a provider. One request then has two kinds of
// record: the key's, which holds the handler's answer, and each inner
// action's, which holds that effect's outcome. They combine so:
//
//   - the key's record is read first: a repeat of a key with a stored
//     answer gets that answer, and no inner action is asked again;
//   - each inner action has its own kind, lease and recovery, and a
//     person reviews it on its own: resolving it changes the inner
//     record, not the key's;
//   - so a handler whose answer reports an inner action not settled
//     (in review, in flight, released) calls Release: its answer goes
//     out but is not stored, and the retry runs the handler again, whose
//     inner Do then replays what was decided. Stored instead, a 202 "in
//     review" is replayed for good, after a person resolves Done too;
//   - run again, the handler's inner Do calls replay instead of acting,
//     so a route whose effects are all inner actions can recover by
//     RetryWithProviderKey: after a crash, the retry runs the handler
//     again rather than waiting for a person;
//   - the inner calls run on the handler's context, which ends at the
//     route's kind's MaxExecution: make it at least as long as they take.
package idemhttp

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/oncehq/once"
)

// DefaultMaxBodyBytes bounds a request body unless Config.MaxBodyBytes
// says otherwise. The body is read in full before the handler runs (it
// is fingerprinted), so it must be bounded.
const DefaultMaxBodyBytes = 1 << 20

// Config configures Middleware. Only Scope is required.
type Config struct {
	// Scope names whose keys a request's key is among: the tenant, the
	// account, the API client. It becomes the intent's Run, so the same
	// key sent by two tenants names two actions; without it one tenant
	// could be served another's stored response. Take it from the
	// authenticated identity, never from anything the client merely
	// asserts. An empty scope is refused with 400. Required.
	Scope func(*http.Request) string
	// Kind names the action's kind, which selects the once kind policy
	// (lease, execution time, recovery) and labels every metric series
	// of the action, so it must come from a small fixed set: the routes
	// you registered, never the path or anything else a client sends.
	// Nil means "http:" followed by the ServeMux pattern with its
	// method ("http:POST /orders/{id}"): the pattern that matched
	// (Request.Pattern) when the middleware wraps one route; the one the
	// mux would match when it wraps a whole *http.ServeMux, which then
	// leaves a request it routes nowhere unkeyed, for the mux to answer
	// 404 or 405; and, when no pattern can be known (another router),
	// the one fallback kind "http:" and the method ("http:POST"), shared
	// by every route behind the middleware.
	Kind func(*http.Request) string
	// Fingerprint returns what must be the same on every request with a
	// key: a repeat whose fingerprint differs is refused with 422 and
	// the handler does not run. It becomes the intent's Payload (see
	// once.Intent). Nil means the method, the path, the raw query and a
	// SHA-256 of the body's bytes. Return json.RawMessage(body) instead to
	// let JSON bodies differ in key order and whitespace.
	//
	// The payload is also what a person deciding a gated request
	// (once.KindPolicy.Approval) reads: the console's action page,
	// /api/approvals, the webhook. So, when it is nil, a gated kind's
	// payload adds the body itself to those fields: as JSON under
	// "body" when it is JSON once takes as written, as a string under
	// "body_text" when it is other UTF-8 text, in base64 under
	// "body_base64" otherwise; what the bytes are decides, not the
	// Content-Type. The hash stays, so the same bytes make the same
	// fingerprint and any other bytes another, as without a gate. A
	// body too large to show within the client's MaxPayloadBytes is
	// refused with 413 body-too-large-to-approve, before anything is
	// claimed. A key first used while its kind was not gated (or the
	// other way round) is still the same request: its record answers
	// it. An ungated kind's payload is as it always was. A Fingerprint
	// you set is the payload, gated or not: make it one a person can
	// read.
	Fingerprint func(r *http.Request, body []byte) any
	// Methods are the methods the middleware acts on; any other request
	// passes straight to the handler, but one whose kind asks for a
	// person's approval (once.KindPolicy.Approval, Always or When):
	// a gate is never skipped, so a DELETE, a PUT or any other method
	// HTTP does not make safe is keyed and held for approval as a POST
	// is, whatever Methods says. A safe method (GET, HEAD, OPTIONS,
	// TRACE) outside Methods passes, gated or not: list it here to gate
	// it. They match in any case ("post" too), and the request is keyed
	// and handled under the method in upper case, so one key sent with
	// two spellings runs once. Nil means POST and PATCH, the methods
	// HTTP does not already make idempotent.
	Methods []string
	// Optional lets a request without a key through to the handler, run
	// as it would be without the middleware. By default a missing key is
	// refused with 400, because a client that forgot the key has lost the
	// protection it needs on a route that asks for one. A request whose
	// kind asks for a person's approval is refused with 400 key-missing
	// without a key, Optional or not: the approval is the key's, and
	// without one the handler would run with nobody asked. That holds
	// for a kind whose When would not have asked for this request too:
	// When is asked about a keyed request only.
	Optional bool
	// Keep says which handler statuses are stored and replayed. Nil
	// keeps every status below 500 but 408, 425 and 429: a 2xx, 3xx or
	// 4xx is the answer to this request and the next repeat gets it too,
	// while those three tell the client to send the same request again
	// later, which a stored answer would never let happen. A status it
	// does not keep releases the key (once.RetryLater), so a retry runs
	// the handler again: a 5xx says the server failed, not that the
	// operation happened. Only release statuses your handler sends when
	// it has changed nothing.
	Keep func(status int) bool
	// ReplayHeaders are the response headers stored and sent again on a
	// replay. Nil means Content-Type and Location. Headers that describe
	// one response only (Date, tracing ids) do not belong here, and
	// those that frame one message on one connection (Content-Length,
	// Transfer-Encoding, Connection, Trailer, Upgrade), Set-Cookie and
	// Idempotent-Replayed are refused: Middleware panics. A replay sends
	// only these, whatever the stored response holds (a person's Done
	// with a result in its shape, a record made under an older list),
	// and only values a header may carry.
	ReplayHeaders []string
	// MaxBodyBytes bounds a request body; a larger one is refused with
	// 413 before anything runs. Zero means DefaultMaxBodyBytes (1 MiB).
	MaxBodyBytes int64
	// RetryAfter is the Retry-After sent with a 503 when the key was
	// released or the store could not be reached, and with a 409 while
	// the first request with the key is still running. Zero means 1
	// second.
	RetryAfter time.Duration
	// Wait is how long a repeat that arrives while the first request
	// with its key still runs waits for that request's outcome (see
	// once.WaitFor), instead of being answered 409 at once: the first
	// request's response, replayed, when it is stored; the handler run
	// for the repeat itself when the first was released (a response
	// Keep does not store). After Wait, or when the repeat's own request
	// ends first, it gets the 409 with Retry-After as without it. A
	// client that retries on a timeout sends its repeat while the first
	// still runs; waiting answers it with the response it was waiting
	// for. Keep it under the client's own timeout. Zero answers 409 at
	// once.
	Wait time.Duration
}

// Response is a handler's response as it is stored and replayed: the
// result of the action once.Do records.
type Response struct {
	Status int         `json:"status"`
	Header http.Header `json:"header,omitempty"`
	Body   []byte      `json:"body,omitempty"`
	// sent is every header the handler set, for the response that goes
	// out from the request that ran it; only Header is stored.
	sent http.Header
}

// Middleware returns middleware that runs the handler at most once per
// Idempotency-Key and scope, through once.Do on client:
//
//   - a request with a key runs the handler once; its response (status,
//     the ReplayHeaders, body) is stored, and every repeat is answered with
//     it, marked Idempotent-Replayed: true, without running the handler;
//   - a repeat with a different fingerprint (another body, say): 422;
//   - a repeat while the first is still running: 409, or, with
//     Config.Wait, the first's response once it is stored;
//   - a request a wrapped *http.ServeMux routes nowhere, or redirects
//     (to add a trailing slash, or to clean the path): passed to the mux
//     unkeyed, which answers 404, 405 or the redirect (see Config.Kind);
//   - no key on a route that requires one, or whose kind asks for
//     approval (Optional or not), or a malformed key: 400;
//   - a body over MaxBodyBytes: 413;
//   - a response Keep refuses (a 5xx, 408, 425 or 429 by default)
//     releases the key;
//   - an action whose outcome is unknown (the process died mid-handler)
//     follows its kind's recovery: a person decides (409) by default;
//   - an action confirmed done without the handler's response on record
//     (a person resolved it Done, or a verifier found it landed): 409,
//     and the handler does not run again;
//   - a route whose kind asks for a person's approval (once.KindPolicy.Approval):
//     202 awaiting-approval, with Retry-After (a minute at most, or just
//     past the wait's expiry) and the expiry in the body, to the first
//     request and every repeat, and the handler does not run; once
//     approved, the next repeat runs it, once, and the ones after replay
//     its answer; rejected, 409 key-rejected with the person's reason
//     (not their name); unanswered past the expiry, 409
//     approval-expired, which says to ask again under a new key when
//     the kind's OnExpiry is StatusFailed, and that a person decides
//     when it is StatusReview (before the reaper's pass and after it).
//     With Config.Wait, a request waits that long for the decision
//     first. A gated kind is gated on every method but the safe ones
//     (see Config.Methods), its payload shows the body to the person
//     deciding (see Config.Fingerprint), and a body too large to show
//     is refused with 413 body-too-large-to-approve.
//
// The handler's context (Request.Context) outlives its client. A client
// that times out and leaves does not cancel it: the handler finishes its
// work, and its answer is recorded for the client's retry. It ends at
// the kind's MaxExecution (once.KindPolicy, 5 minutes by default) or
// when the claim is lost, and carries the request's values but not its
// deadline. So do the work on Request.Context, and bound its calls by
// MaxExecution, not by the client's patience. A client that leaves
// before the handler starts ends the request: nothing ran, and the key
// is released.
//
// Errors are application/problem+json (RFC 9457). The handler's response
// is buffered, and stored when it fits in the client's MaxResultBytes.
// One that does not (an echo of a large body, say: MaxBodyBytes may well
// be over MaxResultBytes) goes whole to the client that ran it, and the
// key is settled with a small stand-in that every repeat gets: 500
// response-too-large, saying the request was carried out, with its
// status and Location. No person is asked. Handlers that stream, flush
// or hijack do not belong behind it.
//
// The body is read whole before the key is claimed, and MaxBodyBytes
// bounds its size, not its time: a client that sends it a byte a second
// holds the request for as long as the server lets it. Bound that with
// the http.Server's ReadTimeout (and ReadHeaderTimeout), as
// examples/payments does (TestSlowClientsAreCut there holds it).
//
// Middleware panics when cfg.Scope is nil, cfg.ReplayHeaders names a
// header that cannot be replayed, or the client's MaxResultBytes is too
// small for that stand-in (under 700 bytes): those are wiring
// mistakes, found at startup, not requests to answer.
func Middleware(client *once.Client, cfg Config) func(http.Handler) http.Handler {
	if client == nil {
		panic("idemhttp: Middleware called with a nil *once.Client; build one with once.New")
	}
	if cfg.Scope == nil {
		panic("idemhttp: Config.Scope is nil; pass a function that names the request's tenant (from its authenticated identity), so two tenants' keys never meet")
	}
	if cfg.MaxBodyBytes < 0 || cfg.RetryAfter < 0 || cfg.Wait < 0 {
		panic("idemhttp: Config.MaxBodyBytes, RetryAfter and Wait must not be negative; zero means the default")
	}
	m := &middleware{client: client, cfg: cfg}
	// A nil Fingerprint stays nil: the default payload depends on the
	// request's kind (see payload).
	if m.cfg.Methods == nil {
		m.cfg.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	if m.cfg.Keep == nil {
		m.cfg.Keep = defaultKeep
	}
	if m.cfg.ReplayHeaders == nil {
		m.cfg.ReplayHeaders = []string{"Content-Type", "Location"}
	}
	m.replay = make(map[string]bool, len(m.cfg.ReplayHeaders))
	for _, h := range m.cfg.ReplayHeaders {
		if why := unreplayable(h); why != "" {
			panic(fmt.Sprintf("idemhttp: Config.ReplayHeaders names %q, which %s; list only headers that describe the stored answer itself (Content-Type, Location)", h, why))
		}
		m.replay[http.CanonicalHeaderKey(h)] = true
	}
	if m.cfg.MaxBodyBytes == 0 {
		m.cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if m.cfg.RetryAfter == 0 {
		m.cfg.RetryAfter = time.Second
	}
	if n := len(tooLarge(Response{Status: 999, Header: http.Header{}}, 1<<62, 1<<62, false)); n > client.MaxResultBytes() {
		panic(fmt.Sprintf("idemhttp: the client's Config.MaxResultBytes (%d) cannot hold the %d bytes the middleware stores for a response too large to store; give it at least that, and room for the responses you mean to replay (the default is %d)", client.MaxResultBytes(), n, once.DefaultMaxResultBytes))
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, next) })
	}
}

type middleware struct {
	client *once.Client
	cfg    Config
	// replay is the set of ReplayHeaders, canonical.
	replay map[string]bool
}

// unreplayable says why header h may not be replayed, or "".
func unreplayable(h string) string {
	if !validHeaderName(h) {
		return "is not a header name"
	}
	switch http.CanonicalHeaderKey(h) {
	case "Content-Length", "Transfer-Encoding", "Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Upgrade":
		return "frames one message on one connection, and a replay frames its own"
	case "Set-Cookie":
		return "would hand one response's cookie to whoever repeats the key"
	case ReplayedHeader:
		return "the middleware sets itself"
	}
	return ""
}

// validHeaderName reports whether s is a field name: an RFC 9110 token.
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// validHeaderValue reports whether s may be a field value: no control
// byte but a tab, so no line break to start another header with.
func validHeaderValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// replayable is what of a stored response's header is sent again: the
// ReplayHeaders, with values a header may carry. The stored header is
// not trusted to be the middleware's own: a person's Done may hold
// any result in a Response's shape (TestReplayedHeadersAreTheReplayHeaders).
func (m *middleware) replayable(stored http.Header) http.Header {
	out := make(http.Header, len(m.replay))
	for k, vs := range stored {
		k = http.CanonicalHeaderKey(k)
		if !m.replay[k] {
			continue
		}
		for _, v := range vs {
			if validHeaderValue(v) {
				out[k] = append(out[k], v)
			}
		}
	}
	return out
}

// defaultKeep stores every answer below 500 except the ones that ask
// for the same request again later: replayed, they would answer every
// retry with "try again" for good.
func defaultKeep(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return status < 500
}

// redirectType is the type of the handler a mux returns for a request
// it redirects.
var redirectType = reflect.TypeOf(http.RedirectHandler("/", http.StatusTemporaryRedirect))

// kindOf is the kind of r when Config.Kind is nil, from the pattern
// it matches; routed is false when next is a mux that routes r
// nowhere. The kind is never made of the path a client sent: that
// would make a kind, a policy lookup and a set of metric series per
// distinct path (TestKindComesFromABoundedSet).
func kindOf(r *http.Request, next http.Handler) (kind string, routed bool) {
	p := r.Pattern
	if mux, ok := next.(*http.ServeMux); ok && p == "" && r.Method != http.MethodConnect {
		// Wrapping a whole mux: the pattern is the one it would route
		// r to. (A CONNECT's is its raw path, so it is not asked.) A
		// redirect (to a path with a trailing slash, or a cleaned one)
		// is the mux's answer, not the route's: keyed, it would take
		// the key, and the client that follows it with the key would
		// be refused 422 for another path (TestMuxRedirectIsNotKeyed).
		var h http.Handler
		if h, p = mux.Handler(r); p == "" || reflect.TypeOf(h) == redirectType {
			return "", false
		}
	}
	if p == "" {
		return "http:" + r.Method, true
	}
	if !strings.Contains(strings.SplitN(p, "/", 2)[0], " ") {
		// A pattern without a method ("/orders") matches every method.
		p = r.Method + " " + p
	}
	return "http:" + p, true
}

// fingerprint is the default payload: the body is hashed, so a 1 MiB
// body makes a small payload, not one over the client's limit.
type fingerprint struct {
	Method string `json:"method"`
	Path   string `json:"path"`
	Query  string `json:"query,omitempty"`
	Body   string `json:"body_sha256"`
}

func defaultFingerprint(r *http.Request, body []byte) any {
	sum := sha256.Sum256(body)
	return fingerprint{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Body: hex.EncodeToString(sum[:])}
}

// shown is the default payload on a kind that asks for approval: the
// fingerprint's fields, which keep it the same for the same bytes and
// different for any other, and the body itself, for the person who
// decides to read (TestApprovalPayloadShowsTheRequest). The body is in
// one of three fields, by what its bytes are, never by what the
// request's Content-Type claims: JSON, as JSON; other UTF-8 text, as a
// string; anything else, in base64.
type shown struct {
	Method string          `json:"method"`
	Path   string          `json:"path"`
	Query  string          `json:"query,omitempty"`
	Sum    string          `json:"body_sha256"`
	JSON   json.RawMessage `json:"body,omitempty"`
	Text   string          `json:"body_text,omitempty"`
	Base64 []byte          `json:"body_base64,omitempty"`
}

// shownPayload is the default payload of r on a gated kind.
func shownPayload(r *http.Request, body []byte) any {
	fp := defaultFingerprint(r, body).(fingerprint)
	p := shown{Method: fp.Method, Path: fp.Path, Query: fp.Query, Sum: fp.Body}
	switch {
	case len(body) == 0:
	case json.Valid(body) && canonicalJSON(body):
		p.JSON = json.RawMessage(body)
	case utf8.Valid(body):
		p.Text = string(body)
	default:
		p.Base64 = body
	}
	return p
}

// canonicalJSON reports whether once takes JSON text b into a payload:
// not when it has duplicate keys, or numbers a double does not hold as
// written (see once.Intent). Such a body is shown as text.
func canonicalJSON(b []byte) bool {
	_, _, err := once.KeyOf(once.Intent{Run: "idemhttp", Kind: "idemhttp", Payload: json.RawMessage(b)})
	return err == nil
}

func (m *middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	acts := m.acts(r.Method)
	if !acts && safeMethod(r.Method) {
		// A method HTTP makes safe changes nothing: gated or not, it is
		// not keyed unless Methods names it.
		next.ServeHTTP(w, r)
		return
	}
	sent := r
	if upper := strings.ToUpper(r.Method); upper != r.Method {
		// The middleware acts on any spelling of a method it names, so
		// the key, the fingerprint and the handler see one spelling:
		// "post" and "POST" with one key are one request, run once
		// (TestMethodCaseIsOneKey).
		r = r.WithContext(r.Context())
		r.Method = upper
	}
	var kind string
	if m.cfg.Kind != nil {
		kind = m.cfg.Kind(r)
	} else if k, routed := kindOf(r, next); routed {
		kind = k
	} else {
		// No route: the mux answers 404 or 405, and nothing runs that a
		// key would guard.
		if !acts {
			r = sent
		}
		next.ServeHTTP(w, r)
		return
	}
	// A kind that asks for a person's approval is never run without
	// the gate: not on a method Methods leaves out
	// (TestApprovalGateNotBypassedByMethod), not without a key
	// (TestApprovalGateNotBypassedWithoutKey).
	gated := m.gated(kind)
	if !acts && !gated {
		next.ServeHTTP(w, sent)
		return
	}
	key, err := keyOf(r)
	switch {
	case errors.Is(err, errNoKey) && gated:
		writeProblem(w, http.StatusBadRequest, "key-missing", "this endpoint's requests wait for a person's approval before they run, and the approval is tied to the request's Idempotency-Key: a request without one is refused, not run. Send a unique value, such as a random UUID, and send the same value again to learn the decision and get the answer")
		return
	case errors.Is(err, errNoKey) && m.cfg.Optional:
		next.ServeHTTP(w, r)
		return
	case errors.Is(err, errNoKey):
		writeProblem(w, http.StatusBadRequest, "key-missing", "this endpoint requires an Idempotency-Key header; send a unique value, such as a random UUID, and send the same value again when you retry")
		return
	case err != nil:
		writeProblem(w, http.StatusBadRequest, "key-malformed", err.Error())
		return
	}
	scope := m.cfg.Scope(r)
	if scope == "" {
		writeProblem(w, http.StatusBadRequest, "no-scope", "the request names no tenant for its Idempotency-Key; authenticate the request")
		return
	}
	body, err := readBody(w, r, m.cfg.MaxBodyBytes)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeProblem(w, http.StatusRequestEntityTooLarge, "body-too-large", fmt.Sprintf("the request body is over the limit of %d bytes; send a smaller body", tooLarge.Limit))
			return
		}
		writeProblem(w, http.StatusBadRequest, "body-unreadable", "the request body could not be read: "+err.Error()+"; send the request again")
		return
	}
	in := once.Intent{
		Run:  scope,
		Kind: kind,
		// The key goes in Target: it must be part of the action's
		// identity, Run holds the scope, and Target is the field wide
		// enough for any key. The path is in the fingerprint, so a key
		// reused on another resource is refused, not run as a new action.
		Target:  key,
		Payload: m.payload(r, body, gated),
	}
	// ran is the response of the handler if it ran in this request. Do
	// returns the value with most errors, but not when the key was
	// released; the handler's own answer still goes out then.
	var ran atomic.Pointer[Response]
	// The stored result is taken as JSON and decoded here, not by Do: an
	// action a person resolved Done, or a verifier found landed, holds
	// whatever they stored (often nothing), not a Response.
	//
	// The handler's work outlives its client: a client that times out
	// and leaves must not cut an effect off half-way, which makes its
	// outcome unknown (a person's review, by default) though nothing
	// failed (TestClientLeavingDoesNotCancelTheHandler). Until the
	// handler starts, the client leaving ends the call (nothing has run:
	// the claim is released); from then on the handler's context ends
	// only at the kind's MaxExecution, or when the claim is lost.
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(r.Context()))
	defer cancel(nil)
	const waiting, running, left = 0, 1, 2
	var state atomic.Int32
	stop := context.AfterFunc(r.Context(), func() {
		if state.CompareAndSwap(waiting, left) {
			cancel(context.Cause(r.Context()))
		}
	})
	defer stop()
	run := func(ctx context.Context, _ once.Attempt) (json.RawMessage, error) {
		if !state.CompareAndSwap(waiting, running) {
			return nil, once.RetryLater(fmt.Errorf("the client left before the handler started: %w", context.Cause(r.Context())))
		}
		rec := &recorder{header: make(http.Header)}
		released := new(atomic.Bool)
		req := r.Clone(context.WithValue(ctx, releaseKey{}, released))
		req.Body = http.NoBody
		if len(body) > 0 {
			req.Body = readCloser{bytes.NewReader(body)}
		}
		req.ContentLength = int64(len(body))
		next.ServeHTTP(rec, req)
		resp := rec.response(m.replay)
		ran.Store(&resp)
		stored, err := json.Marshal(resp)
		if err != nil {
			// Not reached: a Response is a status, strings and bytes.
			return nil, fmt.Errorf("idemhttp: encoding the response: %w", err)
		}
		if !m.cfg.Keep(resp.Status) {
			return stored, once.RetryLater(fmt.Errorf("the handler answered %d, which Config.Keep does not store", resp.Status))
		}
		if released.Load() {
			return stored, once.RetryLater(fmt.Errorf("the handler answered %d and released the key (idemhttp.Release): its answer is not final", resp.Status))
		}
		if limit := m.client.MaxResultBytes(); len(stored) > limit {
			// The handler's work is done, and this request's client
			// gets its answer whole; a repeat gets a stand-in that says
			// so. Storing the answer would fail, and put the key up for
			// a person to review for nothing a person could decide
			// (TestResponseTooLargeToStore).
			stored = tooLarge(resp, len(stored), limit, true)
			if len(stored) > limit {
				stored = tooLarge(resp, len(stored), limit, false)
			}
		}
		return stored, nil
	}
	res, err := once.Do(ctx, m.client, in, run, once.WaitFor(m.cfg.Wait))
	var mismatch *once.FingerprintError
	if errors.As(err, &mismatch) && m.cfg.Fingerprint == nil {
		// The key may have been first used while the kind was gated and
		// is not now, or the other way round (or before the body was
		// shown for approval): the same request, with the other default
		// payload. Its record answers it, rather than a 422 for a
		// request that did not change. The claim is asked again only
		// when the other payload is the one on record.
		if other := m.payload(r, body, !gated); sameFingerprint(in, other, mismatch.Stored) {
			in.Payload = other
			res, err = once.Do(ctx, m.client, in, run, once.WaitFor(m.cfg.Wait))
		}
	}
	if resp := ran.Load(); resp != nil && !res.Replayed {
		// The handler ran in this request: its answer goes out as it
		// is, whole, even when it was released or could not be stored
		// (the error says what became of the key; a repeat is answered
		// from there).
		resp.write(w, resp.sent, false)
		return
	}
	if err == nil {
		stored, ok := storedResponse(res.Value)
		if !ok {
			writeProblem(w, http.StatusConflict, "response-not-recorded", "the request with this Idempotency-Key was carried out, but its response was not recorded (its outcome was confirmed afterwards, by a person or a check with the provider); retrying will not run it again: look up what it created, or use a new key for a new request")
			return
		}
		stored.write(w, m.replayable(stored.Header), true)
		return
	}
	var intent *once.IntentError
	if gated && m.cfg.Fingerprint == nil && errors.As(err, &intent) && intent.Field == "Payload" && validPayload(in, defaultFingerprint(r, body)) {
		// The body is shown as JSON once takes, as UTF-8 text or in
		// base64, and without it the payload is valid (no path of
		// invalid UTF-8, say): its fault is its size
		// (TestApprovalBodyTooLargeToShow).
		writeProblem(w, http.StatusRequestEntityTooLarge, "body-too-large-to-approve", fmt.Sprintf("this endpoint's requests wait for a person's approval, and the person is shown the request's body to decide; this body (%d bytes) is too large to show in the action they approve, and the request was not processed. Send a smaller body, or store the content elsewhere and send a reference to it", len(body)))
		return
	}
	m.writeError(r.Context(), w, err)
}

// gated reports whether kind asks for a person's approval: always, or
// for the intents its When picks. Without a key, or on a method
// Methods leaves out, a request of such a kind would skip the gate,
// When or not: no When can be asked about a request that is not made
// into an intent.
func (m *middleware) gated(kind string) bool {
	a := m.client.Policy(kind).Approval
	return a.Always || a.When != nil
}

// safeMethod reports whether method is one HTTP defines as safe (RFC
// 9110, 9.2.1): it asks for no change, so there is none to gate.
func safeMethod(method string) bool {
	switch strings.ToUpper(method) {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// payload is the intent's payload for r: Config.Fingerprint's, or the
// default one, which on a gated kind shows the body (see shownPayload).
func (m *middleware) payload(r *http.Request, body []byte, gated bool) any {
	switch {
	case m.cfg.Fingerprint != nil:
		return m.cfg.Fingerprint(r, body)
	case gated:
		return shownPayload(r, body)
	}
	return defaultFingerprint(r, body)
}

// sameFingerprint reports whether in with payload p has the
// fingerprint fp.
func sameFingerprint(in once.Intent, p any, fp once.Fingerprint) bool {
	in.Payload = p
	_, got, err := once.KeyOf(in)
	return err == nil && got == fp
}

// validPayload reports whether in with payload p is a valid intent.
func validPayload(in once.Intent, p any) bool {
	in.Payload = p
	_, _, err := once.KeyOf(in)
	return err == nil
}

// storedResponse decodes a stored result into the Response the
// middleware stored, and reports false for anything else: no result, or
// one a person or a verifier recorded in its own shape, or with a status
// that is no final answer (1xx) or no status at all (over 599).
func storedResponse(raw json.RawMessage) (Response, bool) {
	var resp Response
	if len(raw) == 0 || json.Unmarshal(raw, &resp) != nil || resp.Status < 200 || resp.Status > 599 {
		return Response{}, false
	}
	return resp, true
}

// tooLarge is the stored stand-in for resp, whose stored form is size
// bytes, over limit: a 500 problem that says the request was carried
// out, with resp's status and, with headers, its Location and other
// ReplayHeaders but Content-Type.
func tooLarge(resp Response, size, limit int, headers bool) json.RawMessage {
	b, _ := json.Marshal(problem{
		Type: "about:blank", Title: http.StatusText(http.StatusInternalServerError), Status: http.StatusInternalServerError, Code: "response-too-large",
		Detail: fmt.Sprintf("the request with this Idempotency-Key was carried out and answered %d, but its response (%d bytes stored) was over the %d bytes that can be stored, so it cannot be replayed; retrying will not run it again: look up what it created (the Location header, when there is one), or use a new key for a new request", resp.Status, size, limit),
	})
	h := http.Header{"Content-Type": {"application/problem+json"}}
	if headers {
		for k, vs := range resp.Header {
			if k != "Content-Type" {
				h[k] = vs
			}
		}
	}
	stored, _ := json.Marshal(Response{Status: http.StatusInternalServerError, Header: h, Body: b})
	return stored
}

func (m *middleware) acts(method string) bool {
	for _, x := range m.cfg.Methods {
		if strings.EqualFold(x, method) {
			return true
		}
	}
	return false
}

// writeError answers a request whose handler did not run here.
func (m *middleware) writeError(ctx context.Context, w http.ResponseWriter, err error) {
	var (
		unknown  *once.UnknownOutcomeError
		intent   *once.IntentError
		held     *once.InFlightError
		awaiting *once.AwaitingApprovalError
		review   *once.ReviewError
		failed   *once.FailedError
	)
	retryAfter := m.cfg.RetryAfter
	switch {
	case errors.As(err, &intent):
		writeProblem(w, http.StatusBadRequest, "request-invalid", "the request cannot be made into an action: "+intent.Field+" "+intent.Reason)
	case errors.Is(err, once.ErrFingerprintMismatch):
		writeProblem(w, http.StatusUnprocessableEntity, "key-reused", "this Idempotency-Key was first used with a different request (method, path or body); use a new key for a different request, or send the first request unchanged")
	case errors.As(err, &awaiting) && awaiting.Expired && m.expiresTo(ctx, awaiting) == once.StatusReview:
		// The reaper has not passed yet, but it will put the request up
		// for review, and a person may still run it: the client is told
		// what it is told after the pass, not to ask again under a new
		// key (TestApprovalExpiredToReviewNotToldDead).
		writeProblem(w, http.StatusConflict, "approval-expired", approvalExpiredReview)
	case errors.As(err, &awaiting) && awaiting.Expired:
		writeProblem(w, http.StatusConflict, "approval-expired", fmt.Sprintf("the request with this Idempotency-Key waited for a person's approval until %s, and nobody approved it; it does not run: use a new key to ask again", awaiting.Expires.UTC().Format(time.RFC3339)))
	case errors.As(err, &awaiting):
		// The client comes back when a queue's job would: now and then,
		// and just after the wait expires. A request has no job for a
		// Redrive hook to bring back, so the client is told to return
		// whatever the kind's hooks are.
		asked := *awaiting
		asked.Redrive = false
		retryAfter = max(retryAfter, once.Dispose(&asked).After)
		w.Header().Set("Retry-After", seconds(retryAfter))
		writeAwaiting(w, awaiting.Expires)
	case errors.As(err, &failed) && failed.RejectedBy != "":
		writeProblem(w, http.StatusConflict, "key-rejected", "the request with this Idempotency-Key was rejected by a person before it ran, and it does not run: "+rejectionNote(failed.Reason)+"; use a new key to try a new request")
	case errors.Is(err, once.ErrInFlight), errors.Is(err, once.ErrFenced):
		// Fenced, here, is a claim taken over by another attempt before
		// this request's handler ran (this process stalled past the
		// lease): the key's request is that attempt's now.
		w.Header().Set("Retry-After", seconds(retryAfter))
		still := "is still being processed"
		if errors.As(err, &held) && held.Waited > 0 {
			still += fmt.Sprintf(" after waiting %v for it", held.Waited.Round(time.Millisecond))
		}
		writeProblem(w, http.StatusConflict, "key-in-flight", "a request with this Idempotency-Key "+still+"; wait for it to finish and retry, and you will get its response")
	case errors.As(err, &unknown) && unknown.Status == once.StatusUnknown:
		if d := time.Until(unknown.Due); d > retryAfter {
			retryAfter = d
		}
		w.Header().Set("Retry-After", seconds(retryAfter))
		writeProblem(w, http.StatusServiceUnavailable, "outcome-unknown", "the first request with this Idempotency-Key stopped before its outcome was known; it is being checked, retry after the Retry-After delay")
	case errors.Is(err, once.ErrRetryLater):
		w.Header().Set("Retry-After", seconds(retryAfter))
		writeProblem(w, http.StatusServiceUnavailable, "key-released", "the request with this Idempotency-Key did not complete and changed nothing; retry it with the same key")
	case errors.As(err, &review) && review.ApprovalExpired:
		writeProblem(w, http.StatusConflict, "approval-expired", approvalExpiredReview)
	case errors.Is(err, once.ErrReview), errors.Is(err, once.ErrOutcomeUnknown):
		writeProblem(w, http.StatusConflict, "outcome-review", "the first request with this Idempotency-Key stopped before its outcome was known, and a person decides what became of it; retrying will not run it again. Contact the operator, quoting the key")
	case errors.Is(err, once.ErrFailed):
		writeProblem(w, http.StatusConflict, "key-failed", "the request with this Idempotency-Key failed for good; use a new key to try a new request")
	case errors.Is(err, once.ErrUnavailable):
		w.Header().Set("Retry-After", seconds(retryAfter))
		writeProblem(w, http.StatusServiceUnavailable, "unavailable", "the idempotency store could not be reached, and the request was not processed; retry it with the same key")
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		w.Header().Set("Retry-After", seconds(retryAfter))
		writeProblem(w, http.StatusServiceUnavailable, "unavailable", "the request ended before it was processed; retry it with the same key")
	default:
		// The store could not be reached, or answered what this version
		// does not know: nothing ran here.
		w.Header().Set("Retry-After", seconds(retryAfter))
		writeProblem(w, http.StatusServiceUnavailable, "unavailable", "the idempotency store could not be reached; retry with the same key")
	}
}

// approvalExpiredReview is the answer to a request whose wait for
// approval expired into review (ApprovalPolicy.OnExpiry StatusReview),
// before the reaper's pass and after it.
const approvalExpiredReview = "the request with this Idempotency-Key waited for a person's approval, nobody approved it in time, and it did not run; a person decides what then. Contact the operator, quoting the key"

// expiresTo is what the action of an expired wait becomes at the
// reaper's pass: what its row recorded at the claim, or, when the row
// cannot be read, what its kind's policy says now.
func (m *middleware) expiresTo(ctx context.Context, e *once.AwaitingApprovalError) once.Status {
	if a, err := m.client.Get(ctx, e.Key); err == nil && a.OnExpiry != "" {
		return a.OnExpiry
	}
	return m.client.Policy(e.Kind).Approval.OnExpiry
}

// rejectionNote is the why of a rejection (FailedError.Reason). Who
// decided stays in the action's trail: an operator's name is not the API
// client's to see.
func rejectionNote(reason string) string {
	if strings.TrimSpace(reason) == "" {
		return "no reason was given"
	}
	return reason
}

// writeAwaiting answers 202 for a request that waits for a person's
// approval: accepted, not yet carried out. The body has a problem's
// fields, so a client reads its code as it reads an error's, and says
// until when the wait lasts.
func writeAwaiting(w http.ResponseWriter, expires time.Time) {
	until := expires.UTC().Format(time.RFC3339)
	b, _ := json.Marshal(problem{Type: "about:blank", Title: http.StatusText(http.StatusAccepted), Status: http.StatusAccepted, Code: "awaiting-approval", Expires: until,
		Detail: "the request with this Idempotency-Key waits for a person's approval before it runs, until " + until + "; nothing ran yet. Send it again with the same key after the Retry-After delay: once it is approved it runs, once, and you get its answer; rejected, you are told why"})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusAccepted)
	w.Write(b)
}

func seconds(d time.Duration) string {
	return strconv.Itoa(int(max((d+time.Second-1)/time.Second, 1)))
}

// readBody reads r's body up to limit; a larger body is an
// *http.MaxBytesError.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	if r.ContentLength > limit {
		return nil, &http.MaxBytesError{Limit: limit}
	}
	var buf bytes.Buffer
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, limit))
	return buf.Bytes(), err
}

type readCloser struct{ *bytes.Reader }

func (readCloser) Close() error { return nil }

// recorder captures a handler's response instead of sending it, so the
// response can be stored before it goes out.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 && status >= 200 {
		r.status = status
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(p)
}

// response is what the handler answered: every header it set, to send
// now, and of those the ones in keep (canonical), to store.
func (r *recorder) response(keep map[string]bool) Response {
	if _, ok := r.header["Content-Type"]; !ok && r.body.Len() > 0 {
		// What net/http would have sniffed, so a replay says the same.
		r.header.Set("Content-Type", http.DetectContentType(r.body.Bytes()))
	}
	resp := Response{Status: r.status, Body: bytes.Clone(r.body.Bytes()), sent: r.header.Clone()}
	if resp.Status == 0 {
		resp.Status = http.StatusOK
	}
	for k, vs := range resp.sent {
		if keep[k] && len(vs) > 0 {
			if resp.Header == nil {
				resp.Header = make(http.Header)
			}
			resp.Header[k] = vs
		}
	}
	return resp
}

// write sends resp with header.
func (resp Response) write(w http.ResponseWriter, header http.Header, replayed bool) {
	for k, vs := range header {
		w.Header()[k] = vs
	}
	if replayed {
		w.Header().Set(ReplayedHeader, "true")
		// A stored body is not sniffed into a type it was not given.
		w.Header().Set("X-Content-Type-Options", "nosniff")
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(resp.Body)))
	w.WriteHeader(resp.Status)
	w.Write(resp.Body)
}

// problem is an RFC 9457 problem detail. Code names the problem for a
// program, stable across wording changes of Detail.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Code   string `json:"code"`
	// Expires, on a 202 awaiting-approval, is when the wait for a
	// decision ends (RFC 3339).
	Expires string `json:"expires,omitempty"`
}

func writeProblem(w http.ResponseWriter, status int, code, detail string) {
	b, _ := json.Marshal(problem{Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: detail, Code: code})
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	w.Write(b)
}
