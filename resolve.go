package once

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Decision is what a person decided about an action.
type Decision string

const (
	// Done: the effect happened (the person checked); store Result, if
	// any, and replay it to every duplicate.
	Done Decision = "done"
	// Retry: the effect did not happen; release the action so the next
	// delivery runs it again.
	Retry Decision = "retry"
	// Abandon: do not do it at all; the action fails permanently.
	Abandon Decision = "abandon"
)

// Resolution is a person's decision about an action awaiting review.
type Resolution struct {
	Decision Decision
	// Result is stored with Done; it must be JSON. Optional.
	Result json.RawMessage
	// By names who decided. Required.
	By string
	// Note says why. Required: the trail is for the next person.
	Note string
}

// ResolvableStatuses are the statuses a person may resolve: an action in
// review, one whose outcome is unknown, and one that failed.
var ResolvableStatuses = []Status{StatusReview, StatusUnknown, StatusFailed}

// Resolve records a person's decision on an action in review, with an
// unknown outcome, or failed. It races safely with a late worker: both
// are fenced by the attempt number and status, one wins, and the loser is
// refused with a *ConflictError (for the resolution) or a *FencedError
// (for the worker), both written to the trail.
func (c *Client) Resolve(ctx context.Context, key Key, r Resolution) (Action, error) {
	if err := c.checkResolution(r); err != nil {
		return Action{}, err
	}
	a, err := c.store.Get(ctx, key)
	if err != nil {
		return Action{}, err
	}
	if !resolvable(a.Status) {
		return a, c.refuseResolution(ctx, r, a)
	}
	t := Transition{Key: a.Key, Attempt: a.Attempt, From: []Status{a.Status}, ResolvedBy: r.By, ResolveNote: r.Note,
		Event: Event{Key: a.Key, Attempt: a.Attempt, Type: EventResolved, From: a.Status, Actor: r.By, Note: string(r.Decision) + ": " + r.Note}}
	switch r.Decision {
	case Done:
		t.To, t.Result = StatusSucceeded, r.Result
		if len(t.Result) == 0 {
			t.Result = json.RawMessage("null")
		}
	case Retry:
		t.To, t.Error = StatusReleased, "released by "+r.By+": "+r.Note
	case Abandon:
		t.To, t.Error = StatusFailed, "abandoned by "+r.By+": "+r.Note
	}
	t.Event.To = t.To
	ok, err := c.store.Transition(ctx, t)
	if err != nil {
		return a, fmt.Errorf("once: resolving action %s: %w", key, err)
	}
	cur, gerr := c.store.Get(ctx, key)
	if gerr != nil {
		return cur, gerr
	}
	if !ok {
		return cur, c.refuseResolution(ctx, r, cur)
	}
	c.emit(ctx, Observation{Event: t.Event, Kind: a.Kind})
	c.log.Info("once: resolved", "key", key, "kind", a.Kind, "decision", r.Decision, "by", r.By)
	return cur, nil
}

// refuseResolution writes the refused decision to the trail, so the
// person's attempt stands beside whatever got there first.
func (c *Client) refuseResolution(ctx context.Context, r Resolution, cur Action) error {
	refused := Event{Key: cur.Key, Type: EventRefused, Attempt: cur.Attempt, From: cur.Status, Actor: r.By,
		Note: fmt.Sprintf("%s refused: the action is %s: %s", r.Decision, cur.Status, r.Note)}
	if err := c.store.AppendEvent(ctx, refused); err != nil {
		c.log.Warn("once: could not record a refused resolution", "key", cur.Key, "err", err)
	}
	return &ConflictError{Op: "resolve " + string(r.Decision), Current: cur}
}

func resolvable(s Status) bool {
	for _, r := range ResolvableStatuses {
		if s == r {
			return true
		}
	}
	return false
}

func (c *Client) checkResolution(r Resolution) error {
	bad := func(field, reason string) error { return &ResolutionError{Field: field, Reason: reason} }
	switch r.Decision {
	case Done, Retry, Abandon:
	default:
		return bad("Decision", fmt.Sprintf("is %q; use once.Done, once.Retry or once.Abandon", r.Decision))
	}
	for _, f := range []struct {
		name, v, why string
		max          int
	}{
		{"By", r.By, "say who decided", MaxIDBytes},
		{"Note", r.Note, "say why, for the next person who reads the trail", 4096},
	} {
		switch {
		case strings.TrimSpace(f.v) == "":
			return bad(f.name, "is empty; "+f.why)
		case len(f.v) > f.max:
			return bad(f.name, fmt.Sprintf("is %d bytes, over the limit of %d", len(f.v), f.max))
		case !utf8.ValidString(f.v) || strings.IndexByte(f.v, 0) >= 0:
			return bad(f.name, "is not valid UTF-8 text")
		}
	}
	if len(r.Result) > 0 {
		switch {
		case r.Decision != Done:
			return bad("Result", "is only stored with Done, not "+string(r.Decision))
		case !json.Valid(r.Result):
			return bad("Result", "is not valid JSON")
		case len(r.Result) > c.maxResult:
			return bad("Result", fmt.Sprintf("is %d bytes, over Config.MaxResultBytes (%d)", len(r.Result), c.maxResult))
		}
	}
	return nil
}

// Events returns an action's trail, oldest first.
func (c *Client) Events(ctx context.Context, key Key) ([]Event, error) {
	return c.store.Events(ctx, key)
}
