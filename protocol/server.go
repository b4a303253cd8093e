// Package protocol serves the attempt over HTTP, as /v1: a client in any
// language claims an intent, heartbeats the claim and records the
// outcome, and every rule of once (keys, fencing, recovery, approval)
// is applied here, in Go, by a *once.Client. The client is thin: it
// holds the attempt's key, number and token, and the server rebuilds the
// attempt from them for each call (once.Client.Attempt).
//
// Every write can be sent again after its reply was lost and gets the
// same answer, applying nothing twice: a claim carries a token the
// client made (its write token, once.ClaimID), and an outcome is the
// attempt's own (settling again answers as the first did). Durations
// are relative, counted by the client from when it sent the request,
// so no wall clock is compared across the wire.
//
// docs/protocol.md describes the protocol; openapi.json is its OpenAPI
// document, served at /v1/openapi.json.
package protocol

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/connlimit"
)

//go:embed openapi.json
var openAPI []byte

// OpenAPI returns the protocol's OpenAPI document.
func OpenAPI() []byte { return append([]byte(nil), openAPI...) }

// Defaults.
const (
	// DefaultMaxBody bounds a request's body: an intent's payload and
	// an outcome's result fit with room to spare at the client's
	// default bounds (1 MiB and 256 KiB).
	DefaultMaxBody = 2 << 20
	// DefaultMaxWait bounds a claim's wait_ms.
	DefaultMaxWait = time.Minute
	// maxErrorText bounds an outcome's error text.
	maxErrorText = 16 << 10
)

// Config configures a Server.
type Config struct {
	// Client applies the rules: its store, its kinds' policies (which
	// a client of the protocol cannot change) and its hooks. Required.
	Client *once.Client
	// Workers are the bearer tokens of workers: claim, heartbeat,
	// outcome, and reading an action. Operators' tokens may do all of
	// that and decide approvals too. At least one token is required:
	// the protocol is not served open.
	Workers, Operators []string
	// MaxBody bounds a request's body; zero means DefaultMaxBody.
	MaxBody int64
	// MaxWait bounds a claim's wait; zero means DefaultMaxWait.
	MaxWait time.Duration
	// Logger logs what the server could not answer; nil discards.
	Logger *slog.Logger
	// Verifiers, when set, serves /v1/verify to client verifiers of the
	// kinds whose KindPolicy.Verifier is its For.
	Verifiers *Verifiers
}

// Server is the /v1 handler.
type Server struct {
	c         *once.Client
	workers   [][32]byte
	operators [][32]byte
	maxBody   int64
	maxWait   time.Duration
	log       *slog.Logger
	mux       *http.ServeMux
	verifiers *Verifiers
	carriers  carriers
	failures  failures
	held      held
}

// scope is what a token may do.
type scope int

const (
	worker scope = iota + 1
	operator
)

// New returns the protocol's handler, to be mounted at the root of a
// server (its routes begin with /v1/).
func New(cfg Config) (*Server, error) {
	if cfg.Client == nil {
		return nil, errors.New("protocol: Config.Client is required")
	}
	if len(cfg.Workers)+len(cfg.Operators) == 0 {
		return nil, errors.New("protocol: no token: give workers' or operators' bearer tokens; the protocol is not served open")
	}
	s := &Server{c: cfg.Client, maxBody: cfg.MaxBody, maxWait: cfg.MaxWait, log: cfg.Logger, verifiers: cfg.Verifiers}
	for _, list := range []struct {
		in  []string
		out *[][32]byte
	}{{cfg.Workers, &s.workers}, {cfg.Operators, &s.operators}} {
		for i, t := range list.in {
			if len(t) < 16 || strings.ContainsFunc(t, func(r rune) bool { return r <= ' ' || r > '~' }) {
				return nil, fmt.Errorf("protocol: token %d is %d bytes or not printable ASCII: a token needs 16 or more printable bytes, hard to guess", i+1, len(t))
			}
			*list.out = append(*list.out, sha256.Sum256([]byte(t)))
		}
	}
	if s.maxBody <= 0 {
		s.maxBody = DefaultMaxBody
	}
	if s.maxWait <= 0 {
		s.maxWait = DefaultMaxWait
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	m := http.NewServeMux()
	for _, r := range routes(s) {
		m.Handle(r.method+" "+r.path, s.guard(r.scope, r.h))
	}
	m.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, http.StatusNotFound, Problem{Code: "no_such_route", Detail: fmt.Sprintf("%s %s is not a route of /v1; GET /v1/openapi.json lists them", r.Method, r.URL.Path)})
	})
	s.mux = m
	return s, nil
}

// route is one route of /v1: the mux and the OpenAPI document are
// checked to list the same ones (TestRoutesAreDocumented).
type route struct {
	method, path string
	scope        scope // zero: open
	h            http.HandlerFunc
}

func routes(s *Server) []route {
	return []route{
		{"GET", "/v1/openapi.json", 0, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Write(openAPI)
		}},
		{"POST", "/v1/keys", worker, s.keys},
		{"POST", "/v1/claim", worker, s.claim},
		{"POST", "/v1/heartbeat", worker, s.heartbeat},
		{"POST", "/v1/outcome", worker, s.outcome},
		{"GET", "/v1/actions/{key}", worker, s.get},
		{"POST", "/v1/verify/take", worker, s.verifyTake},
		{"POST", "/v1/verify/answer", worker, s.verifyAnswer},
		{"POST", "/v1/actions/{key}/approve", operator, s.decide(false)},
		{"POST", "/v1/actions/{key}/reject", operator, s.decide(true)},
	}
}

// Routes lists the routes /v1 serves, as "METHOD /path".
func Routes() []string {
	var out []string
	for _, r := range routes(&Server{}) {
		out = append(out, r.method+" "+r.path)
	}
	return out
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// guard admits a request whose bearer token has the scope, and bounds
// its body.
func (s *Server) guard(need scope, h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if need != 0 {
			// The token is checked first, in constant time (a hash and
			// a compare per token): a request that shows a right one is
			// never slowed, so a guesser beside a worker cannot make
			// the worker's heartbeats and outcomes fail.
			have := s.scopeOf(r)
			if have == 0 {
				now := time.Now()
				// A connection that showed a right token before is no
				// guesser's: it is told its token is wrong, not to wait.
				if wait := s.failures.blocked(host(r), now); wait > 0 && !connlimit.Shown(r) {
					s.failures.tarpit(r.Context(), host(r))
					writeProblem(w, http.StatusTooManyRequests, Problem{Code: "too_many_failures", RetryAfterMS: ms(wait),
						Detail: fmt.Sprintf("%d requests from this address (an IPv6 address: its /64) came with a wrong or no token within %v; its requests with a wrong or no token are refused until the window ends", maxFailures, failureWindow)})
					return
				}
				s.failures.failed(host(r), now)
				w.Header().Set("WWW-Authenticate", `Bearer realm="once"`)
				writeProblem(w, http.StatusUnauthorized, Problem{Code: "unauthorized", Detail: "send a worker's or an operator's token: Authorization: Bearer <token>"})
				return
			}
			switch {
			case have < need:
				writeProblem(w, http.StatusForbidden, Problem{Code: "forbidden", Detail: "this route is for operators; a worker's token cannot decide an approval"})
				return
			}
			// A connection that showed a token is no guest of a
			// connection limit in front (once serve's): a pool of
			// workers on one host keeps its connections.
			connlimit.Authorized(w, r)
		}
		r.Body = http.MaxBytesReader(w, r.Body, s.maxBody)
		h(w, r)
	})
}

func (s *Server) scopeOf(r *http.Request) scope {
	// The scheme is case-insensitive (RFC 9110 §11.1).
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" {
		return 0
	}
	sum := sha256.Sum256([]byte(tok))
	got := scope(0)
	// Every token is compared, in constant time, whatever matches.
	for _, t := range s.operators {
		if subtle.ConstantTimeCompare(sum[:], t[:]) == 1 {
			got = operator
		}
	}
	for _, t := range s.workers {
		if subtle.ConstantTimeCompare(sum[:], t[:]) == 1 && got == 0 {
			got = worker
		}
	}
	return got
}

// read decodes the body into v, strictly: an unknown field is a
// mistake the client should hear of (a misspelt "payload" would
// otherwise claim an intent without one).
func (s *Server) read(w http.ResponseWriter, r *http.Request, v any) bool {
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		writeProblem(w, http.StatusUnsupportedMediaType, Problem{Code: "bad_request", Detail: fmt.Sprintf("the body is %q; send application/json", ct)})
		return false
	}
	d := json.NewDecoder(r.Body)
	d.DisallowUnknownFields()
	err := d.Decode(v)
	if err == nil && d.More() {
		err = errors.New("more than one JSON value")
	}
	if err == nil {
		if _, e := d.Token(); e != io.EOF {
			err = errors.New("text after the JSON value")
		}
	}
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		writeProblem(w, http.StatusRequestEntityTooLarge, Problem{Code: "too_large", Detail: fmt.Sprintf("the body is over %d bytes; a payload or a result that large is refused by the client's bounds too", tooBig.Limit)})
		return false
	case err != nil:
		writeProblem(w, http.StatusBadRequest, Problem{Code: "bad_request", Detail: "the body is not the JSON this route takes: " + err.Error()})
		return false
	}
	return true
}

// intentOf is the once.Intent of a wire intent.
func intentOf(in Intent) (once.Intent, *Problem) {
	out := once.Intent{Run: in.Run, Step: in.Step, Kind: in.Kind, Target: in.Target, PayloadInKey: in.PayloadInKey}
	hasJSON := len(in.Payload) > 0
	switch {
	case hasJSON && in.PayloadBase64 != nil:
		return out, &Problem{Code: "invalid_intent", Field: "payload", Reason: "is given twice: send payload (JSON) or payload_base64 (raw bytes), not both"}
	case hasJSON:
		out.Payload = in.Payload
	case in.PayloadBase64 != nil:
		b, err := base64.StdEncoding.DecodeString(*in.PayloadBase64)
		if err != nil {
			return out, &Problem{Code: "invalid_intent", Field: "payload_base64", Reason: "is not standard base64 (RFC 4648, with padding): " + err.Error()}
		}
		out.Payload = b
	}
	return out, nil
}

// keyed is the intent of a request, with its key and fingerprint; a key
// or fingerprint the client sent must be the same.
func (s *Server) keyed(w http.ResponseWriter, wire Intent, key, fp string) (once.Intent, once.Key, once.Fingerprint, bool) {
	in, p := intentOf(wire)
	if p != nil {
		p.Detail = "invalid intent: " + p.Field + " " + p.Reason
		writeProblem(w, http.StatusBadRequest, *p)
		return in, "", "", false
	}
	k, f, err := once.KeyOf(in)
	if err != nil {
		s.fail(w, err, "")
		return in, "", "", false
	}
	if (key != "" && key != string(k)) || (fp != "" && fp != string(f)) {
		writeProblem(w, http.StatusUnprocessableEntity, Problem{Code: "key_mismatch", Key: string(k),
			Detail: fmt.Sprintf("the client computed key %.16s… and fingerprint %.16s…, the server %.16s… and %.16s… from the same intent: the client's canonical form (KEYS.md) differs; nothing was claimed", key, fp, k, f)})
		return in, "", "", false
	}
	return in, k, f, true
}

func (s *Server) keys(w http.ResponseWriter, r *http.Request) {
	var req KeysRequest
	if !s.read(w, r, &req) {
		return
	}
	if _, k, f, ok := s.keyed(w, req.Intent, req.Key, req.Fingerprint); ok {
		writeJSON(w, http.StatusOK, KeysAnswer{Key: string(k), Fingerprint: string(f)})
	}
}

func (s *Server) claim(w http.ResponseWriter, r *http.Request) {
	received := time.Now()
	var req ClaimRequest
	if !s.read(w, r, &req) {
		return
	}
	if !writeToken(w, req.Write) {
		return
	}
	if req.WaitMS < 0 || time.Duration(req.WaitMS)*time.Millisecond > s.maxWait {
		writeProblem(w, http.StatusBadRequest, Problem{Code: "bad_request", Detail: fmt.Sprintf("wait_ms is %d; it must be 0 to %d", req.WaitMS, s.maxWait.Milliseconds())})
		return
	}
	in, k, f, ok := s.keyed(w, req.Intent, req.Key, req.Fingerprint)
	if !ok {
		return
	}
	c, p, status := s.clientFor(in.Kind, req.Policy)
	if p != nil {
		writeProblem(w, status, *p)
		return
	}
	// A claim on its way goes on if the client goes away, and one won
	// is kept: the same request sent again (its write token) finds it,
	// and may be answering it already (once.ClaimID). The wait ends
	// with the client: nothing is claimed for nobody.
	wait := time.Duration(req.WaitMS) * time.Millisecond
	ctx, cancel := context.WithTimeout(r.Context(), wait+time.Minute)
	defer cancel()
	a, err := c.Claim(ctx, in, once.ClaimID(req.Write), once.WaitFor(wait))
	if err != nil {
		var rep *once.ReplayedError
		var failed *once.FailedError
		switch {
		case errors.As(err, &rep):
			writeJSON(w, http.StatusOK, ClaimAnswer{Answer: AnswerReplayed, Key: string(k), Fingerprint: string(f), Attempt: rep.Attempt, Result: rep.Result})
		case errors.As(err, &failed):
			writeJSON(w, http.StatusOK, ClaimAnswer{Answer: AnswerFailed, Key: string(k), Fingerprint: string(f), Attempt: failed.Attempt,
				Message: failed.Message, RejectedBy: failed.RejectedBy, Reason: failed.Reason})
		default:
			s.fail(w, err, in.Kind)
		}
		return
	}
	size := len(req.Intent.Payload)
	if req.Intent.PayloadBase64 != nil {
		size += len(*req.Intent.PayloadBase64)
	}
	s.held.hold(a, size)
	pol := c.Policy(in.Kind)
	writeJSON(w, http.StatusOK, ClaimAnswer{
		Answer: AnswerClaimed, Key: string(a.Key), Fingerprint: string(f), Attempt: a.Number,
		Token: a.Token, ProviderKey: a.ProviderKey,
		StopAfterMS:      ms(a.Deadline().Sub(received)),
		HeartbeatEveryMS: ms(pol.Lease / 3),
		MaxExecutionMS:   ms(pol.MaxExecution),
	})
}

// writeToken checks a write token's shape (once.ClaimID's).
func writeToken(w http.ResponseWriter, t string) bool {
	if len(t) < 16 || len(t) > 128 || strings.ContainsFunc(t, func(r rune) bool { return r <= ' ' || r > '~' }) {
		writeProblem(w, http.StatusBadRequest, Problem{Code: "bad_request",
			Detail: fmt.Sprintf("write is %d bytes; a write token is 16 to 128 printable ASCII bytes the client makes at random for this write, and sends again only with the same request", len(t))})
		return false
	}
	return true
}

// attempt rebuilds the attempt a request names.
func (s *Server) attempt(w http.ResponseWriter, ctx context.Context, ref AttemptRef) (*once.Attempt, bool) {
	if ref.Key == "" || ref.Attempt < 1 || ref.Token == "" {
		writeProblem(w, http.StatusBadRequest, Problem{Code: "bad_request", Detail: "name the attempt: key, attempt and token, as the claim answered them"})
		return nil, false
	}
	a, err := s.c.Attempt(ctx, once.Key(ref.Key), ref.Attempt, ref.Token)
	if err != nil {
		s.fail(w, err, "")
		return nil, false
	}
	c, p, status := s.clientFor(a.Intent.Kind, ref.Policy)
	switch {
	case p != nil:
		writeProblem(w, status, *p)
		return nil, false
	case c != s.c:
		// Rebuilt again under the carried policy: a heartbeat renews
		// the lease the claim carried.
		if a, err = c.Attempt(ctx, once.Key(ref.Key), ref.Attempt, ref.Token); err != nil {
			s.fail(w, err, "")
			return nil, false
		}
	}
	return a, true
}

func (s *Server) heartbeat(w http.ResponseWriter, r *http.Request) {
	received := time.Now()
	var ref AttemptRef
	if !s.read(w, r, &ref) {
		return
	}
	a, ok := s.attempt(w, r.Context(), ref)
	if !ok {
		return
	}
	if err := a.Heartbeat(r.Context()); err != nil {
		s.fail(w, err, a.Intent.Kind)
		return
	}
	writeJSON(w, http.StatusOK, HeartbeatAnswer{StopAfterMS: ms(a.Deadline().Sub(received))})
}

func (s *Server) outcome(w http.ResponseWriter, r *http.Request) {
	var req OutcomeRequest
	if !s.read(w, r, &req) {
		return
	}
	if !writeToken(w, req.Write) {
		return
	}
	needsError := req.Outcome != OutcomeSucceeded
	switch {
	case req.Outcome != OutcomeSucceeded && req.Outcome != OutcomePermanent && req.Outcome != OutcomeRetryLater && req.Outcome != OutcomeUnknown:
		writeProblem(w, http.StatusBadRequest, Problem{Code: "bad_request", Detail: fmt.Sprintf("outcome is %.40q; it is one of succeeded, permanent, retry_later, unknown", req.Outcome)})
		return
	case needsError && strings.TrimSpace(req.Error) == "":
		writeProblem(w, http.StatusBadRequest, Problem{Code: "bad_request", Detail: "an outcome other than succeeded needs its error: what happened, for the trail and for every duplicate"})
		return
	case len(req.Error) > maxErrorText:
		writeProblem(w, http.StatusBadRequest, Problem{Code: "bad_request", Detail: fmt.Sprintf("error is %d bytes; at most %d are kept", len(req.Error), maxErrorText)})
		return
	case !needsError && len(req.Result) == 0:
		req.Result = json.RawMessage("null")
	}
	// The outcome is recorded even if the client goes away: it was
	// asked for, and the same request sent again reads it back.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), time.Minute)
	defer cancel()
	a := s.held.attempt(req.AttemptRef)
	if a == nil {
		var ok bool
		if a, ok = s.attempt(w, ctx, req.AttemptRef); !ok {
			return
		}
	}
	var err error
	cause := errors.New(req.Error)
	switch req.Outcome {
	case OutcomeSucceeded:
		err = a.Succeed(ctx, req.Result)
	case OutcomePermanent:
		err = a.Fail(ctx, cause)
	case OutcomeRetryLater:
		err = a.Release(ctx, cause)
	case OutcomeUnknown:
		err = a.Unknown(ctx, cause)
	}
	if err != nil {
		s.fail(w, err, a.Intent.Kind)
		return
	}
	if st, ok := a.Settled(); ok {
		writeJSON(w, http.StatusOK, OutcomeAnswer{Status: string(st)})
		return
	}
	cur, err := s.c.Get(ctx, a.Key)
	if err != nil {
		// Recorded, and the read after it failed: the status the
		// outcome asked for is the answer; an unknown one is what the
		// recovery makes of it, which a GET shows.
		writeJSON(w, http.StatusOK, OutcomeAnswer{Status: statusAsked(req.Outcome)})
		return
	}
	writeJSON(w, http.StatusOK, OutcomeAnswer{Status: string(cur.Status)})
}

func statusAsked(outcome string) string {
	switch outcome {
	case OutcomeSucceeded:
		return string(once.StatusSucceeded)
	case OutcomePermanent:
		return string(once.StatusFailed)
	case OutcomeRetryLater:
		return string(once.StatusReleased)
	}
	return string(once.StatusUnknown)
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	a, err := s.c.Get(r.Context(), once.Key(r.PathValue("key")))
	if err != nil {
		s.fail(w, err, "")
		return
	}
	writeJSON(w, http.StatusOK, actionOf(a))
}

func actionOf(a once.Action) Action {
	out := Action{Key: string(a.Key), Fingerprint: string(a.Fingerprint), Run: a.Run, Step: a.Step, Kind: a.Kind, Target: a.Target,
		Status: string(a.Status), Attempt: a.Attempt, Result: a.Result, Error: a.Error}
	if a.Status == once.StatusInFlight || a.Status == once.StatusAwaitingApproval {
		out.LeaseLeftMS = ms(time.Until(a.LeaseUntil))
	}
	return out
}

func (s *Server) decide(reject bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req DecisionRequest
		if !s.read(w, r, &req) {
			return
		}
		key := once.Key(r.PathValue("key"))
		d := once.Approval{By: req.By, Note: req.Note, Attempt: req.Attempt, Fingerprint: once.Fingerprint(req.Fingerprint), Via: "api"}
		if err := s.c.ValidateApproval(key, d, reject); err != nil {
			writeProblem(w, http.StatusBadRequest, Problem{Code: "bad_request", Key: string(key), Detail: err.Error()})
			return
		}
		decide := s.c.Approve
		if reject {
			decide = s.c.Reject
		}
		a, err := decide(context.WithoutCancel(r.Context()), key, d)
		if err != nil {
			s.fail(w, err, "")
			return
		}
		writeJSON(w, http.StatusOK, actionOf(a))
	}
}

// fail answers err as a problem. The store's own errors stay in the
// log: they name its address and its internals, which are not the
// client's to know.
func (s *Server) fail(w http.ResponseWriter, err error, kind string) {
	p, status := problemOf(err, s.retryHint(kind))
	if status >= 500 {
		s.log.Warn("protocol: could not answer", "code", p.Code, "err", err)
		p.Detail = serverDetail[p.Code]
	}
	writeProblem(w, status, p)
}

// serverDetail is what a client is told of an error of the server's.
var serverDetail = map[string]string{
	"store_unavailable": "the store did not answer in time: send the same request again after retry_after_ms; sent again, it applies once",
	"not_recorded":      "the store did not answer while the outcome was written, and it may not be recorded: send the same request again; it is recorded once",
	"internal":          "the server could not answer this request, and logged why: send the same request again later, or ask its operator",
}

// retryHint is when to ask again about an action of kind that another
// attempt holds: a third of the kind's lease, as a heartbeat would
// renew it, and at least 100ms.
func (s *Server) retryHint(kind string) time.Duration {
	d := s.c.Policy(kind).Lease / 3
	return max(d, 100*time.Millisecond)
}

func problemOf(err error, hint time.Duration) (Problem, int) {
	var (
		intent   *once.IntentError
		fp       *once.FingerprintError
		awaiting *once.AwaitingApprovalError
		inFlight *once.InFlightError
		unknown  *once.UnknownOutcomeError
		review   *once.ReviewError
		fenced   *once.FencedError
		conflict *once.ConflictError
	)
	detail := err.Error()
	switch {
	case errors.As(err, &intent):
		return Problem{Code: "invalid_intent", Field: intent.Field, Reason: intent.Reason, Detail: detail}, http.StatusBadRequest
	case errors.As(err, &fp):
		return Problem{Code: "fingerprint_mismatch", Key: string(fp.Key), Detail: detail}, http.StatusUnprocessableEntity
	case errors.As(err, &awaiting):
		return Problem{Code: "awaiting_approval", Key: string(awaiting.Key), Attempt: awaiting.Attempt, RetryAfterMS: ms(min(time.Until(awaiting.Expires), 30*time.Second, max(hint, time.Second))), Detail: detail}, http.StatusConflict
	case errors.As(err, &inFlight):
		return Problem{Code: "in_flight", Key: string(inFlight.Key), Attempt: inFlight.Attempt, RetryAfterMS: ms(hint), Detail: detail}, http.StatusConflict
	case errors.As(err, &unknown):
		return Problem{Code: "outcome_unknown", Key: string(unknown.Key), Attempt: unknown.Attempt, RetryAfterMS: ms(hint), Detail: detail}, http.StatusConflict
	case errors.As(err, &review):
		return Problem{Code: "review", Key: string(review.Key), Attempt: review.Attempt, Reason: review.Reason, Detail: detail}, http.StatusConflict
	case errors.As(err, &fenced):
		return Problem{Code: "fenced", Key: string(fenced.Key), Attempt: fenced.Attempt, ActionStatus: string(fenced.Outcome), Detail: detail + "; stop the effect: another attempt, recovery or a person has the action now"}, http.StatusConflict
	case errors.As(err, &conflict):
		return Problem{Code: "conflict", Detail: detail}, http.StatusConflict
	case errors.Is(err, once.ErrNotFound):
		return Problem{Code: "not_found", Detail: detail}, http.StatusNotFound
	case errors.Is(err, once.ErrResultTooLarge):
		return Problem{Code: "result_too_large", Detail: detail}, http.StatusUnprocessableEntity
	case errors.Is(err, once.ErrRetryLater):
		// The action was released under VerifyThenDecide and this
		// server has not its verifier: a process that has claims it.
		return Problem{Code: "needs_verifier", RetryAfterMS: ms(max(hint, time.Second)), Detail: detail}, http.StatusConflict
	case errors.Is(err, once.ErrNotRecorded):
		return Problem{Code: "not_recorded", RetryAfterMS: ms(time.Second), Detail: detail + "; send the same request again"}, http.StatusServiceUnavailable
	case errors.Is(err, once.ErrUnavailable):
		return Problem{Code: "store_unavailable", RetryAfterMS: ms(time.Second), Detail: detail}, http.StatusServiceUnavailable
	case errors.Is(err, once.ErrInvalidIntent), errors.Is(err, once.ErrInvalidResolution):
		return Problem{Code: "bad_request", Detail: detail}, http.StatusBadRequest
	}
	return Problem{Code: "internal", Detail: detail}, http.StatusInternalServerError
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeProblem(w, http.StatusInternalServerError, Problem{Code: "internal", Detail: err.Error()})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b)
}

func writeProblem(w http.ResponseWriter, status int, p Problem) {
	p.Type, p.Title, p.Status = "about:blank", http.StatusText(status), status
	if p.Detail == "" {
		p.Detail = p.Code
	}
	b, _ := json.Marshal(p)
	w.Header().Set("Content-Type", "application/problem+json")
	if p.RetryAfterMS > 0 {
		w.Header().Set("Retry-After", fmt.Sprint((p.RetryAfterMS+999)/1000))
	}
	w.WriteHeader(status)
	w.Write(b)
}
