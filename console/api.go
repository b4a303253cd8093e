package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/view"
)

// The API shows actions and events as internal/view does, so that a
// script reading the console's JSON and one reading the once command's
// JSON see the same shape.

func writeJSON(w http.ResponseWriter, code int, v any) {
	var buf bytes.Buffer
	if err := view.Encode(&buf, v); err != nil {
		writeJSONError(w, http.StatusInternalServerError, "encoding the response: "+err.Error())
		return
	}
	send(w, code, "application/json", buf.Bytes())
}

type errorJSON struct {
	Error string `json:"error"`
	// Field names the field of the input that is wrong, with a 400 to
	// an approval, as the client's ResolutionError does.
	Field string `json:"field,omitempty"`
	// Action is the action as it now stands, with a 409.
	Action *view.Action `json:"action,omitempty"`
}

func writeJSONError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, errorJSON{Error: msg})
}

func (s *server) apiFail(w http.ResponseWriter, r *http.Request, what string, err error) {
	s.log.Error("console: request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	writeJSONError(w, http.StatusInternalServerError, what+": "+err.Error())
}

func (s *server) apiActions(w http.ResponseWriter, r *http.Request) {
	f, _, err := parseFilter(r.URL.Query())
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, err.Error())
		return
	}
	acts, err := s.client.List(r.Context(), f)
	if err != nil {
		s.apiFail(w, r, "listing actions", err)
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Actions []view.Action `json:"actions"`
	}{view.Actions(acts)})
}

// apiFind finds the action the path's key names: the key, or 8 or
// more of its first characters, as the command takes them. It answers
// the request itself when there is none.
func (s *server) apiFind(w http.ResponseWriter, r *http.Request) (once.Action, bool) {
	key := r.PathValue("key")
	a, err := s.client.Find(r.Context(), key)
	switch {
	case errors.Is(err, once.ErrNotFound), errors.Is(err, once.ErrNotAKey):
		writeJSONError(w, http.StatusNotFound, fmt.Sprintf("no action has the key %q; give the key, or at least 8 of its first characters", key))
		return a, false
	case errors.Is(err, once.ErrAmbiguousKey):
		writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("more than one key starts with %q; give more of it", key))
		return a, false
	case err != nil:
		s.apiFail(w, r, "reading the action", err)
		return a, false
	}
	return a, true
}

func (s *server) apiAction(w http.ResponseWriter, r *http.Request) {
	a, ok := s.apiFind(w, r)
	if !ok {
		return
	}
	trail, err := s.client.EventPage(r.Context(), once.EventQuery{Key: a.Key, Limit: trailPage})
	if err != nil {
		s.apiFail(w, r, "reading the action's trail", err)
		return
	}
	writeJSON(w, http.StatusOK, view.CutPayload(view.FromActionPage(a, trail), a, maxAPIPayload))
}

// maxAPIPayload bounds the payload /api/actions/{key} shows: the default
// Config.MaxPayloadBytes; a larger one is cut, and payload_cut says by
// how much.
const maxAPIPayload = once.DefaultMaxPayloadBytes

// maxEventLimit is the most events /api/actions/{key}/events gives at
// once.
const maxEventLimit = 1000

// apiEvents serves one page of an action's trail: limit events (100
// unless it says, at most maxEventLimit), oldest first or, with
// order=newest, newest first, after the event numbered after (the page
// before's next).
func (s *server) apiEvents(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	a, ok := s.apiFind(w, r)
	if !ok {
		return
	}
	eq := once.EventQuery{Key: a.Key, Limit: trailPage}
	switch q.Get("order") {
	case "", "oldest":
	case "newest":
		eq.Newest = true
	default:
		writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("order %q is not oldest or newest", q.Get("order")))
		return
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxEventLimit {
			writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("limit %q must be a whole number from 1 to %d", v, maxEventLimit))
			return
		}
		eq.Limit = n
	}
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("after %q is not an event's id; pass the next of the page before", v))
			return
		}
		eq.After = n
	}
	p, err := s.client.EventPage(r.Context(), eq)
	if err != nil {
		s.apiFail(w, r, "reading the action's trail", err)
		return
	}
	out := struct {
		Events []view.Event `json:"events"`
		Total  int64        `json:"total"`
		Next   int64        `json:"next,omitempty"`
	}{Events: []view.Event{}, Total: p.Total, Next: p.Next}
	for _, e := range p.Events {
		out.Events = append(out.Events, view.FromEvent(e))
	}
	writeJSON(w, http.StatusOK, out)
}

// apiResolve takes a decision as JSON. It insists on Content-Type
// application/json even when a token guards the API: a cross-site HTML
// form cannot send that type, and a cross-site script cannot send it
// without a CORS preflight the console never grants.
func (s *server) apiResolve(w http.ResponseWriter, r *http.Request) {
	key := once.Key(r.PathValue("key"))
	var in resolveInput
	if !decodeDecision(w, r, &in, `{"decision": "done|retry|abandon", "note": "why", "by": "who", "result": <optional JSON, done only>}`) {
		return
	}
	a, code, err := s.resolve(r.Context(), key, in)
	writeDecision(w, a, code, "", err)
}

// decodeDecision reads a decision's JSON body into in, as the API's
// writes all take it: Content-Type application/json, no unknown field,
// nothing after the object, within the body's bound. It answers the
// request itself (415, 413 or 400, saying what to send: shape) when
// the body is not one.
func decodeDecision(w http.ResponseWriter, r *http.Request, in any, shape string) bool {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		writeJSONError(w, http.StatusUnsupportedMediaType, `send the decision as JSON with "Content-Type: application/json": `+shape)
		return false
	}
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(in); err != nil {
		if tooBig := (*http.MaxBytesError)(nil); errors.As(err, &tooBig) {
			writeJSONError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is over %d bytes", tooBig.Limit))
			return false
		}
		writeJSONError(w, http.StatusBadRequest, "the body is not a decision: "+err.Error()+"; send "+shape)
		return false
	}
	if _, err := dec.Token(); err != io.EOF {
		writeJSONError(w, http.StatusBadRequest, "the body has data after the decision object")
		return false
	}
	return true
}

// approvalShape is what an approval's body holds, for the messages that
// refuse one.
const approvalShape = `{"note": "why (required to reject)", "by": "who", "attempt": <the attempt you looked at>, "fingerprint": "<the payload's, as /api/approvals lists it>"}`

// approvalJSON is an action of the approvals queue: the action, its
// payload cut to previewBytes (payload_cut says how much is left out),
// the origin of the claim that asked, and its wait.
type approvalJSON struct {
	view.Action
	Origin string `json:"origin,omitempty"`
	// Since is when the wait began; ExpiresAt, when it expires; Expired
	// says it has, by the database's clock, and OnExpiry what the
	// reaper then records.
	Since     time.Time   `json:"since"`
	ExpiresAt time.Time   `json:"expires_at"`
	Expired   bool        `json:"expired"`
	OnExpiry  once.Status `json:"on_expiry"`
}

// apiApprovals serves one page of the approvals queue, oldest first:
// limit actions (50 unless it says, at most approvalsLimit) after the
// cursor the page before gave as next, and how many wait in all.
func (s *server) apiApprovals(w http.ResponseWriter, r *http.Request) {
	size, after, err := queueQuery(r.URL.Query(), approvalsPage, approvalsLimit)
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, err.Error())
		return
	}
	ctx := r.Context()
	total, err := s.client.Count(ctx, once.Filter{Status: once.StatusAwaitingApproval})
	if err != nil {
		s.apiFail(w, r, "counting the approvals queue", err)
		return
	}
	items, more, last, err := s.approvalQueue(ctx, after, size)
	if err != nil {
		s.apiFail(w, r, "reading the approvals queue", err)
		return
	}
	out := struct {
		Approvals []approvalJSON `json:"approvals"`
		Total     int64          `json:"total"`
		Next      string         `json:"next,omitempty"`
	}{Approvals: []approvalJSON{}, Total: total}
	for _, it := range items {
		a := it.Action
		out.Approvals = append(out.Approvals, approvalJSON{Action: it.json, Origin: it.Origin, Since: a.CreatedAt.UTC(),
			ExpiresAt: a.LeaseUntil.UTC(), Expired: it.Expired, OnExpiry: orFailed(a.OnExpiry)})
	}
	if more {
		out.Next = last.String()
	}
	writeJSON(w, http.StatusOK, out)
}

// orFailed is what an expired wait becomes: s, or failed where the row
// recorded none.
func orFailed(s once.Status) once.Status {
	if s == "" {
		return once.StatusFailed
	}
	return s
}

// apiDecide takes an approval (or, with reject, a rejection) as JSON,
// as apiResolve takes a resolution, through Client.Approve or
// Client.Reject via "api". Pass the attempt and the fingerprint you
// looked at, so the decision applies only to that payload; a refusal
// is a 409 that names who decided first, or that the wait expired, with
// the action as it stands.
func (s *server) apiDecide(reject bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key := once.Key(r.PathValue("key"))
		var in approvalInput
		if !decodeDecision(w, r, &in, approvalShape) {
			return
		}
		a, code, field, err := s.decide(r.Context(), key, in, reject, "api")
		writeDecision(w, a, code, field, err)
	}
}

// writeDecision answers a person's decision through the API: the action
// with a 200, the error and the action as it stands with a 409, the
// error and the wrong field (if known) otherwise.
func writeDecision(w http.ResponseWriter, a once.Action, code int, field string, err error) {
	switch code {
	case http.StatusOK:
		writeJSON(w, code, view.FromAction(a, nil))
	case http.StatusConflict:
		cur := view.FromAction(a, nil)
		writeJSON(w, code, errorJSON{Error: err.Error(), Action: &cur})
	default:
		writeJSON(w, code, errorJSON{Error: err.Error(), Field: strings.ToLower(field)})
	}
}

type statsJSON struct {
	ByStatus      map[once.Status]int64            `json:"by_status"`
	ByKind        map[string]map[once.Status]int64 `json:"by_kind"`
	Total         int64                            `json:"total"`
	ReviewBacklog int64                            `json:"review_backlog"`
	Unknown       int64                            `json:"unknown"`
	// FinishedAsOf is when succeeded and failed were counted, when that
	// was earlier than this request (a large log); absent otherwise.
	FinishedAsOf *time.Time `json:"finished_as_of,omitempty"`
}

func (s *server) apiStats(w http.ResponseWriter, r *http.Request) {
	st, err := s.client.Stats(r.Context())
	if err != nil {
		s.apiFail(w, r, "reading the counts", err)
		return
	}
	c := tally(st)
	out := statsJSON{
		ByStatus: c.ByStatus, ByKind: c.ByKind, Total: c.Total,
		ReviewBacklog: c.ByStatus[once.StatusReview], Unknown: c.ByStatus[once.StatusUnknown],
	}
	if !c.FinishedAsOf.IsZero() {
		out.FinishedAsOf = &c.FinishedAsOf
	}
	writeJSON(w, http.StatusOK, out)
}

// apiRun serves one page of a run's steps, in step order: limit (100
// unless it says, at most maxLimit) after the cursor the page before
// gave as next, and how many steps the run has.
func (s *server) apiRun(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("run")
	rq, err := parseRunQuery(r.URL.Query())
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, err.Error())
		return
	}
	p, err := s.client.RunPage(r.Context(), id, rq.afterStep, rq.afterKey, rq.limit)
	if err != nil {
		s.apiFail(w, r, "reading the run", err)
		return
	}
	if p.Total == 0 {
		writeJSONError(w, http.StatusNotFound, fmt.Sprintf("no actions belong to the run %q", id))
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Run   string        `json:"run"`
		Steps []view.Action `json:"steps"`
		Total int64         `json:"total"`
		Next  string        `json:"next,omitempty"`
	}{id, view.Actions(p.Steps), p.Total, runCursor(p)})
}
