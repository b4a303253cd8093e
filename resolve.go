package once

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// Decision is what a person decided about an action.
type Decision string

const (
	// DecisionDone: the effect happened (the person checked); store
	// Result, if any, and replay it to every duplicate.
	DecisionDone Decision = "done"
	// DecisionRetry: the effect did not happen; release the action so the
	// next delivery runs it again.
	DecisionRetry Decision = "retry"
	// DecisionAbandon: do not do it at all; the action fails permanently.
	DecisionAbandon Decision = "abandon"
)

// Decisions returns every decision, in the order a form offers them.
func Decisions() []Decision { return []Decision{DecisionDone, DecisionRetry, DecisionAbandon} }

// Resolution is a person's decision about an action awaiting review.
type Resolution struct {
	Decision Decision
	// Result is stored with Done; it must be JSON. Optional.
	Result json.RawMessage
	// By names who decided. Required.
	By string
	// Note says why. Required: the trail is for the next person.
	Note string
	// Attempt, if not zero, is the attempt the person looked at: the
	// decision applies only while the action is still at it. A decision
	// taken on a page loaded before a newer attempt ran is refused with
	// a *ConflictError, instead of deciding an attempt nobody looked at
	// (a Retry would run the effect once more). Forms and the command
	// set it; zero decides whatever attempt stands.
	Attempt int
}

// ResolvableStatuses returns the statuses a person may resolve: an action
// in review, one whose outcome is unknown, and one that failed.
func ResolvableStatuses() []Status { return []Status{StatusReview, StatusUnknown, StatusFailed} }

// Resolvable reports whether a person may resolve an action in status s.
func (s Status) Resolvable() bool { return slices.Contains(ResolvableStatuses(), s) }

// Resolve records a person's decision on an action in review, with an
// unknown outcome, or failed. It races safely with a late worker: both
// are fenced by the attempt number and status, one wins, and the loser is
// refused with a *ConflictError (for the resolution) or a *FencedError
// (for the worker), both written to the trail.
func (c *Client) Resolve(ctx context.Context, key Key, r Resolution) (Action, error) {
	if err := c.ValidateResolution(r); err != nil {
		return Action{}, err
	}
	gctx, cancel := c.call(ctx)
	a, err := c.store.Get(gctx, key)
	cancel()
	if err != nil {
		return Action{}, err
	}
	if !a.Status.Resolvable() || r.Attempt != 0 && r.Attempt != a.Attempt || abandoned(a, r) || unapproved(a, r) {
		return a, c.refuseResolution(ctx, r, a)
	}
	var t Transition
	switch r.Decision {
	case DecisionDone:
		t = resolveDone.of(a, r.By)
		t.Result = r.Result
		if len(t.Result) == 0 {
			t.Result = json.RawMessage("null")
		}
	case DecisionRetry:
		t = resolveRetry.of(a, r.By)
		t.Error = "released by " + r.By + ": " + r.Note
	case DecisionAbandon:
		t = resolveAbandon.of(a, r.By)
		t.Error = abandonedBy(r.By) + r.Note
	}
	t.ResolvedBy, t.ResolveNote, t.Event.Note = r.By, r.Note, string(r.Decision)+": "+r.Note
	ok, err := c.transition(ctx, t)
	if err != nil {
		return a, fmt.Errorf("once: resolving action %s: %w", key, err)
	}
	gctx, cancel = c.call(ctx)
	cur, gerr := c.store.Get(gctx, key)
	cancel()
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

// refuseResolution writes the refused decision to the trail
// (writeRefusal), so the person's attempt stands beside whatever got
// there first, and returns the *ConflictError the caller gets.
func (c *Client) refuseResolution(ctx context.Context, r Resolution, cur Action) error {
	refused := Event{Key: cur.Key, Type: EventRefused, Attempt: cur.Attempt, From: cur.Status, Actor: r.By, Origin: c.origin,
		Note: fmt.Sprintf("%s refused: the action is %s: %s", r.Decision, cur.Status, r.Note)}
	if abandoned(cur, r) {
		refused.Note = fmt.Sprintf("%s refused: %s abandoned it already: %s", r.Decision, cur.ResolvedBy, r.Note)
	}
	if r.Attempt != 0 && r.Attempt != cur.Attempt {
		refused.Note = fmt.Sprintf("%s refused: it was decided on attempt %d, and the action is at attempt %d (%s) now: %s", r.Decision, r.Attempt, cur.Attempt, cur.Status, r.Note)
	}
	var why string
	if unapproved(cur, r) && cur.Status == StatusReview {
		why = fmt.Sprintf("action %s never ran: its wait for approval expired unanswered, and Done would tell every duplicate it happened. Retry to run it now, or Abandon it",
			cur.Key)
		refused.Note = fmt.Sprintf("%s refused: it never ran: %s", r.Decision, r.Note)
	} else if unapproved(cur, r) {
		why = fmt.Sprintf("action %s failed before it ran, because nobody approved it (%s); a %s would run or record what nobody approved. Abandon it, or ask again with a new intent",
			cur.Key, cur.Error, r.Decision)
		refused.Note = fmt.Sprintf("%s refused: it was never approved: %s", r.Decision, r.Note)
	}
	c.writeRefusal(ctx, refused, cur, "resolve "+string(r.Decision))
	return &ConflictError{Op: "resolve " + string(r.Decision), Current: cur, why: why}
}

// writeRefusal appends a person's refused decision, op, to cur's trail,
// beside whatever got there first, unless the trail's newest event is a
// refusal of the same attempt and status: nothing happened in between
// that it could stand beside, and a script (or a stale page posted again
// and again) would otherwise grow the trail without bound. It is logged
// and reaches the hooks either way.
func (c *Client) writeRefusal(ctx context.Context, refused Event, cur Action, op string) {
	actx, cancel := c.call(ctx)
	defer cancel()
	if c.refusedLast(actx, cur) {
		c.log.Warn("once: refused decision not written: the trail's last event is a refusal of the same attempt",
			"key", cur.Key, "op", op, "by", refused.Actor)
	} else if err := c.store.AppendEvent(actx, storableEvent(refused)); err != nil {
		c.log.Warn("once: could not record a refused decision", "key", cur.Key, "op", op, "err", err)
	}
	c.emit(ctx, Observation{Event: refused, Kind: cur.Kind})
}

// textField is one text field of a person's decision, as checkDecisionText
// checks it.
type textField struct {
	name, v, why string
	max          int
	required     bool
}

// checkDecisionText returns a *ResolutionError for the first field that is
// empty when required, too long, not UTF-8, or holds a NUL.
func checkDecisionText(fields ...textField) error {
	for _, f := range fields {
		bad := func(reason string) error { return &ResolutionError{Field: f.name, Reason: reason} }
		switch {
		case strings.TrimSpace(f.v) == "" && f.required:
			return bad("is empty; " + f.why)
		case len(f.v) > f.max:
			return bad(fmt.Sprintf("is %d bytes, over the limit of %d", len(f.v), f.max))
		case !utf8.ValidString(f.v):
			return bad("is not valid UTF-8 text")
		case strings.IndexByte(f.v, 0) >= 0:
			return bad("contains a NUL byte, which PostgreSQL text cannot hold; remove it")
		}
	}
	return nil
}

// unapproved reports whether r would run or record as done an action
// that failed because nobody approved it (rejected, or its wait expired
// to failed): a Retry would run what a person refused, a Done record an
// effect that never happened (TestClient/ApprovalRejectedNotRunByRetry).
// Abandon changes nothing that matters, and is let through. A wait that
// expired to review is a person's to decide, Retry (run it) and Abandon,
// but not Done: it never ran, and every duplicate would be told it had
// (TestClient/ApprovalExpiredToReviewNotRecordedDone).
func unapproved(a Action, r Resolution) bool {
	if !unapprovedUnrun(a) {
		return false
	}
	return a.Status == StatusFailed && r.Decision != DecisionAbandon || a.Status == StatusReview && r.Decision == DecisionDone
}

// abandoned reports whether r abandons an action a person already
// abandoned at its attempt: that changes nothing, and written each time
// would grow the trail by a resolved event per request. The error must
// still be the abandon's: a person who retried, and the worker's late
// outcome that failed the action after, abandoned nothing.
func abandoned(a Action, r Resolution) bool {
	return r.Decision == DecisionAbandon && a.Status == StatusFailed && a.ResolvedBy != "" && !a.ResolvedAt.Before(a.ClaimedAt) &&
		strings.HasPrefix(a.Error, abandonedBy(a.ResolvedBy))
}

// abandonedBy starts the error an Abandon by who stores.
func abandonedBy(who string) string { return "abandoned by " + who + ": " }

// refusedLast reports whether the newest event of cur's trail is a
// person's refused resolution of cur's attempt and status. When the
// trail cannot be read it answers false: the refusal is then written.
func (c *Client) refusedLast(ctx context.Context, cur Action) bool {
	p, err := c.store.EventPage(ctx, EventQuery{Key: cur.Key, Newest: true, Limit: 1})
	if err != nil || len(p.Events) == 0 {
		return false
	}
	e := p.Events[0]
	return e.Type == EventRefused && e.Attempt == cur.Attempt && e.From == cur.Status && e.Actor != ActorWorker
}

// ValidateResolution checks r as Resolve would, without any I/O, and
// returns a *ResolutionError naming the field that is wrong. A form or a
// command checks with it before it asks anything of the store.
func (c *Client) ValidateResolution(r Resolution) error {
	bad := func(field, reason string) error { return &ResolutionError{Field: field, Reason: reason} }
	if r.Attempt < 0 {
		return bad("Attempt", fmt.Sprintf("is %d; attempts are numbered from 1, and zero means whatever attempt stands", r.Attempt))
	}
	switch r.Decision {
	case DecisionDone, DecisionRetry, DecisionAbandon:
	default:
		return bad("Decision", fmt.Sprintf("is %q; use once.DecisionDone, DecisionRetry or DecisionAbandon", r.Decision))
	}
	if err := checkDecisionText(
		textField{"By", r.By, "say who decided", MaxIDBytes, true},
		textField{"Note", r.Note, "say why, for the next person who reads the trail", MaxNoteBytes, true},
	); err != nil {
		return err
	}
	if len(r.Result) > 0 {
		switch {
		case r.Decision != DecisionDone:
			return bad("Result", "is only stored with Done, not "+string(r.Decision))
		case resultProblem(r.Result) != "":
			return bad("Result", resultProblem(r.Result))
		case len(r.Result) > c.maxResult:
			return bad("Result", fmt.Sprintf("is %d bytes, over Config.MaxResultBytes (%d)", len(r.Result), c.maxResult))
		}
	}
	return nil
}
