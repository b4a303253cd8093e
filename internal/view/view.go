// Package view is how actions and events look outside the library, in
// one place for the once command and the console: the JSON the command
// prints and the console's API serves (snake_case, times in RFC 3339 UTC,
// absent times left out), and the formatting both show people (times,
// durations, short keys, status lists).
package view

import (
	"encoding/json"
	"time"
	"unicode/utf8"

	"github.com/oncehq/once"
)

// Action is an action as JSON.
type Action struct {
	Key         string `json:"key"`
	Fingerprint string `json:"fingerprint"`
	Run         string `json:"run"`
	Step        int64  `json:"step"`
	Kind        string `json:"kind"`
	Target      string `json:"target"`
	// Payload is the canonical payload when it is JSON; PayloadText
	// holds other UTF-8 text, PayloadBase64 anything else.
	Payload        json.RawMessage `json:"payload,omitempty"`
	PayloadText    string          `json:"payload_text,omitempty"`
	PayloadBase64  []byte          `json:"payload_base64,omitempty"`
	Status         once.Status     `json:"status"`
	Attempt        int             `json:"attempt"`
	Result         json.RawMessage `json:"result,omitempty"`
	Error          string          `json:"error,omitempty"`
	LeaseUntil     *time.Time      `json:"lease_until,omitempty"`
	CreatedAt      time.Time       `json:"created_at"`
	ClaimedAt      time.Time       `json:"claimed_at"`
	UpdatedAt      time.Time       `json:"updated_at"`
	CompletedAt    *time.Time      `json:"completed_at,omitempty"`
	VerifyFailures int             `json:"verify_failures,omitempty"`
	ResolvedBy     string          `json:"resolved_by,omitempty"`
	ResolvedAt     *time.Time      `json:"resolved_at,omitempty"`
	ResolveNote    string          `json:"resolve_note,omitempty"`
	Events         []Event         `json:"events,omitempty"`
	// EventsTotal is how many events the whole trail holds, and
	// EventsNext the cursor of the page after Events, when Events is one
	// page of the trail; both absent otherwise.
	EventsTotal int64 `json:"events_total,omitempty"`
	EventsNext  int64 `json:"events_next,omitempty"`
	// PayloadCut is how many bytes of the payload were left out, when
	// it was cut to a bound; what is left is shown as text or base64.
	PayloadCut int `json:"payload_cut,omitempty"`
}

// FromActionPage converts an action with one page of its trail.
func FromActionPage(a once.Action, p once.EventPage) Action {
	v := FromAction(a, p.Events)
	v.EventsTotal, v.EventsNext = p.Total, p.Next
	return v
}

// CutPayload converts an action whose payload is cut to at most max
// bytes: a cut payload is no longer JSON, so it is shown as text, or
// base64 if the cut part is not UTF-8, and PayloadCut says how much is
// missing.
func CutPayload(v Action, a once.Action, max int) Action {
	if len(a.Payload) <= max {
		return v
	}
	head := a.Payload[:max]
	v.Payload, v.PayloadText, v.PayloadBase64, v.PayloadCut = nil, "", nil, len(a.Payload)-max
	if text := TrimSplitRune(head); utf8.Valid(text) {
		v.PayloadText, v.PayloadCut = string(text), len(a.Payload)-len(text)
	} else {
		v.PayloadBase64 = head
	}
	return v
}

// TrimSplitRune drops from the end of b a rune that cutting b to a
// bound split in two. The console's pages and its JSON API both cut.
func TrimSplitRune(b []byte) []byte {
	for i := 0; i < utf8.UTFMax && len(b) > 0 && !utf8.Valid(b); i++ {
		b = b[:len(b)-1]
	}
	return b
}

// Event is an event as JSON.
type Event struct {
	ID      int64          `json:"id"`
	At      time.Time      `json:"at"`
	Type    once.EventType `json:"type"`
	Attempt int            `json:"attempt"`
	From    once.Status    `json:"from,omitempty"`
	To      once.Status    `json:"to,omitempty"`
	Actor   string         `json:"actor,omitempty"`
	Note    string         `json:"note,omitempty"`
	// Origin is the process that wrote the event (host:pid by default).
	Origin string `json:"origin,omitempty"`
}

func opt(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

// FromAction converts an action; a payload that is JSON is shown as
// JSON, other UTF-8 text as text, anything else as base64.
func FromAction(a once.Action, events []once.Event) Action {
	v := Action{
		Key: string(a.Key), Fingerprint: string(a.Fingerprint), Run: a.Run, Step: a.Step, Kind: a.Kind, Target: a.Target,
		Status: a.Status, Attempt: a.Attempt, Result: a.Result, Error: a.Error,
		LeaseUntil: opt(a.LeaseUntil), CreatedAt: a.CreatedAt.UTC(), ClaimedAt: a.ClaimedAt.UTC(), UpdatedAt: a.UpdatedAt.UTC(),
		CompletedAt: opt(a.CompletedAt), VerifyFailures: a.VerifyFailures, ResolvedBy: a.ResolvedBy, ResolvedAt: opt(a.ResolvedAt),
		ResolveNote: a.ResolveNote,
	}
	switch {
	case len(a.Payload) == 0:
	case json.Valid(a.Payload):
		v.Payload = json.RawMessage(a.Payload)
	case utf8.Valid(a.Payload):
		v.PayloadText = string(a.Payload)
	default:
		v.PayloadBase64 = a.Payload
	}
	for _, e := range events {
		v.Events = append(v.Events, FromEvent(e))
	}
	return v
}

// Actions converts a list of actions, without their events.
func Actions(as []once.Action) []Action {
	out := make([]Action, len(as))
	for i, a := range as {
		out[i] = FromAction(a, nil)
	}
	return out
}

// FromEvent converts an event.
func FromEvent(e once.Event) Event {
	return Event{ID: e.ID, At: e.At.UTC(), Type: e.Type, Attempt: e.Attempt, From: e.From, To: e.To, Actor: e.Actor, Note: e.Note, Origin: e.Origin}
}
