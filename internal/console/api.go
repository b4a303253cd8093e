package console

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/oncehq/once"
)

// actionJSON is an action as the API shows it. The root package's types
// carry no JSON tags on purpose (they are not a wire format); this is
// the console's, in snake_case, with zero times left out.
type actionJSON struct {
	Key         once.Key         `json:"key"`
	Fingerprint once.Fingerprint `json:"fingerprint"`
	Run         string           `json:"run"`
	Step        int64            `json:"step"`
	Kind        string           `json:"kind"`
	Target      string           `json:"target"`
	// Payload is the payload itself when it is JSON (it usually is: the
	// canonical form of a Go value); PayloadText when it is other UTF-8
	// text; PayloadBase64 otherwise.
	Payload        json.RawMessage `json:"payload,omitempty"`
	PayloadText    string          `json:"payload_text,omitempty"`
	PayloadBase64  string          `json:"payload_base64,omitempty"`
	Status         once.Status     `json:"status"`
	Attempt        int             `json:"attempt"`
	Result         json.RawMessage `json:"result,omitempty"`
	Error          string          `json:"error,omitempty"`
	LeaseUntil     *time.Time      `json:"lease_until,omitempty"`
	CreatedAt      *time.Time      `json:"created_at,omitempty"`
	ClaimedAt      *time.Time      `json:"claimed_at,omitempty"`
	UpdatedAt      *time.Time      `json:"updated_at,omitempty"`
	CompletedAt    *time.Time      `json:"completed_at,omitempty"`
	VerifyFailures int             `json:"verify_failures"`
	ResolvedBy     string          `json:"resolved_by,omitempty"`
	ResolvedAt     *time.Time      `json:"resolved_at,omitempty"`
	ResolveNote    string          `json:"resolve_note,omitempty"`
}

type eventJSON struct {
	ID      int64          `json:"id"`
	Key     once.Key       `json:"key"`
	At      time.Time      `json:"at"`
	Type    once.EventType `json:"type"`
	Attempt int            `json:"attempt"`
	From    once.Status    `json:"from,omitempty"`
	To      once.Status    `json:"to,omitempty"`
	Actor   string         `json:"actor,omitempty"`
	Note    string         `json:"note,omitempty"`
}

func utcPtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func toJSON(a once.Action) actionJSON {
	j := actionJSON{
		Key: a.Key, Fingerprint: a.Fingerprint, Run: a.Run, Step: a.Step, Kind: a.Kind, Target: a.Target,
		Status: a.Status, Attempt: a.Attempt, Error: a.Error,
		LeaseUntil: utcPtr(a.LeaseUntil), CreatedAt: utcPtr(a.CreatedAt), ClaimedAt: utcPtr(a.ClaimedAt),
		UpdatedAt: utcPtr(a.UpdatedAt), CompletedAt: utcPtr(a.CompletedAt),
		VerifyFailures: a.VerifyFailures,
		ResolvedBy:     a.ResolvedBy, ResolvedAt: utcPtr(a.ResolvedAt), ResolveNote: a.ResolveNote,
	}
	switch {
	case len(a.Payload) == 0:
	case json.Valid(a.Payload):
		j.Payload = a.Payload
	case utf8.Valid(a.Payload):
		j.PayloadText = string(a.Payload)
	default:
		j.PayloadBase64 = base64.StdEncoding.EncodeToString(a.Payload)
	}
	if len(a.Result) > 0 && json.Valid(a.Result) {
		j.Result = a.Result
	}
	return j
}

func eventsJSON(es []once.Event) []eventJSON {
	out := make([]eventJSON, len(es))
	for i, e := range es {
		out[i] = eventJSON{ID: e.ID, Key: e.Key, At: e.At.UTC(), Type: e.Type, Attempt: e.Attempt, From: e.From, To: e.To, Actor: e.Actor, Note: e.Note}
	}
	return out
}

func actionsJSON(as []once.Action) []actionJSON {
	out := make([]actionJSON, len(as))
	for i, a := range as {
		out[i] = toJSON(a)
	}
	return out
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		writeJSONError(w, http.StatusInternalServerError, "encoding the response: "+err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	w.Write(buf.Bytes())
}

type errorJSON struct {
	Error string `json:"error"`
	// Action is the action as it now stands, with a 409.
	Action *actionJSON `json:"action,omitempty"`
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
	acts, err := s.store.List(r.Context(), f)
	if err != nil {
		s.apiFail(w, r, "listing actions", err)
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Actions []actionJSON `json:"actions"`
	}{actionsJSON(acts)})
}

type actionWithEvents struct {
	actionJSON
	Events []eventJSON `json:"events"`
}

func (s *server) apiAction(w http.ResponseWriter, r *http.Request) {
	key := once.Key(r.PathValue("key"))
	a, err := s.client.Get(r.Context(), key)
	if errors.Is(err, once.ErrNotFound) {
		writeJSONError(w, http.StatusNotFound, fmt.Sprintf("no action has the key %q", key))
		return
	}
	if err != nil {
		s.apiFail(w, r, "reading the action", err)
		return
	}
	events, err := s.client.Events(r.Context(), key)
	if err != nil {
		s.apiFail(w, r, "reading the action's trail", err)
		return
	}
	writeJSON(w, http.StatusOK, actionWithEvents{toJSON(a), eventsJSON(events)})
}

// apiResolve takes a decision as JSON. It insists on Content-Type
// application/json even when a token guards the API: a cross-site HTML
// form cannot send that type, and a cross-site script cannot send it
// without a CORS preflight the console never grants.
func (s *server) apiResolve(w http.ResponseWriter, r *http.Request) {
	key := once.Key(r.PathValue("key"))
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		writeJSONError(w, http.StatusUnsupportedMediaType, `send the decision as JSON with "Content-Type: application/json": {"decision": "done|retry|abandon", "note": "why", "by": "who", "result": <optional JSON, done only>}`)
		return
	}
	var in resolveInput
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		if tooBig := (*http.MaxBytesError)(nil); errors.As(err, &tooBig) {
			writeJSONError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is over %d bytes", tooBig.Limit))
			return
		}
		writeJSONError(w, http.StatusBadRequest, "the body is not a decision: "+err.Error())
		return
	}
	if _, err := dec.Token(); err != io.EOF {
		writeJSONError(w, http.StatusBadRequest, "the body has data after the decision object")
		return
	}
	a, code, err := s.resolve(r.Context(), key, in)
	switch code {
	case http.StatusOK:
		writeJSON(w, code, toJSON(a))
	case http.StatusConflict:
		cur := toJSON(a)
		writeJSON(w, code, errorJSON{Error: err.Error(), Action: &cur})
	default:
		writeJSONError(w, code, err.Error())
	}
}

type statsJSON struct {
	ByStatus      map[once.Status]int64            `json:"by_status"`
	ByKind        map[string]map[once.Status]int64 `json:"by_kind"`
	Total         int64                            `json:"total"`
	ReviewBacklog int64                            `json:"review_backlog"`
	Unknown       int64                            `json:"unknown"`
}

func (s *server) apiStats(w http.ResponseWriter, r *http.Request) {
	st, err := s.store.Stats(r.Context())
	if err != nil {
		s.apiFail(w, r, "reading the counts", err)
		return
	}
	c := tally(st)
	writeJSON(w, http.StatusOK, statsJSON{
		ByStatus: c.ByStatus, ByKind: c.ByKind, Total: c.Total,
		ReviewBacklog: c.ByStatus[once.StatusReview], Unknown: c.ByStatus[once.StatusUnknown],
	})
}

func (s *server) apiRun(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("run")
	steps, err := s.client.RunSteps(r.Context(), id)
	if err != nil {
		s.apiFail(w, r, "reading the run", err)
		return
	}
	if len(steps) == 0 {
		writeJSONError(w, http.StatusNotFound, fmt.Sprintf("no actions belong to the run %q", id))
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Run   string       `json:"run"`
		Steps []actionJSON `json:"steps"`
	}{id, actionsJSON(steps)})
}
