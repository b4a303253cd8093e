package once

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Approval is a person's decision on an action awaiting approval
// (KindPolicy.Approval): Client.Approve or Client.Reject.
type Approval struct {
	// By names who decided. Required.
	By string
	// Note says why. Required to reject (every duplicate is told it);
	// optional to approve.
	Note string
	// Attempt, if not zero, is the attempt the person looked at, and
	// Fingerprint, if set, the payload: the decision applies only while
	// the action still stands there. A form sets both, so a decision
	// taken on a page loaded before the key was purged and claimed again
	// with another payload is refused instead of applying to what
	// nobody saw.
	Attempt     int
	Fingerprint Fingerprint
	// Since, if set, is when the wait the person looked at began
	// (Action.CreatedAt, AwaitingApprovalError.Since, the webhook's
	// since): the decision applies to that wait only. A key whose
	// action ran and was purged, and whose intent came back to wait
	// again, has the same attempt and payload; only Since tells the
	// two waits apart, so a form, an API call or a webhook's receiver
	// sent twice does not approve a wait nobody saw.
	Since time.Time
	// Via names the surface the decision came through, for the trail:
	// "console", "cli", "api". Empty means "client".
	Via string
}

// Approve approves an action awaiting approval: the next delivery of its
// job (or, once its job was dropped, the kind's Redrive hook) runs it,
// once, however many deliveries race. It is fenced by the attempt, the
// payload and the wait's expiry, by the database's clock: of two
// decisions, one applies, and the other is refused with a *ConflictError
// that names who decided; a decision after the wait expired is refused.
// A refusal is written to the trail beside what got there first.
func (c *Client) Approve(ctx context.Context, key Key, d Approval) (Action, error) {
	return c.decideApproval(ctx, key, d, approve)
}

// Reject rejects an action awaiting approval: it fails without running,
// and every duplicate gets the rejection, who and why (a *FailedError).
// It is fenced as Approve is.
func (c *Client) Reject(ctx context.Context, key Key, d Approval) (Action, error) {
	return c.decideApproval(ctx, key, d, reject)
}

// decideApproval makes m (approve or reject) on the action key, as d.
func (c *Client) decideApproval(ctx context.Context, key Key, d Approval, m move) (Action, error) {
	op := m.name
	if err := c.ValidateApproval(key, d, m.name == reject.name); err != nil {
		return Action{}, err
	}
	gctx, cancel := c.call(ctx)
	a, err := c.store.Get(gctx, key)
	cancel()
	if err != nil {
		return Action{}, err
	}
	if a.Status != StatusAwaitingApproval || !d.sees(a) {
		return a, c.refuseApproval(ctx, op, d, a)
	}
	via := d.Via
	if via == "" {
		via = "client"
	}
	t := m.of(a, d.By)
	t.Fingerprint, t.Unexpired = a.Fingerprint, true
	t.ResolvedBy, t.ResolveNote = d.By, d.Note
	t.Event.Note = op + "d via " + via
	if d.Note != "" {
		t.Event.Note += ": " + d.Note
	}
	if m.name == reject.name {
		t.Error = rejectedBy(d.By) + d.Note
	}
	ok, err := c.transition(ctx, t)
	if err != nil {
		return a, fmt.Errorf("once: %s action %s: %w", strings.TrimSuffix(op, "e")+"ing", key, err)
	}
	gctx, cancel = c.call(ctx)
	cur, gerr := c.store.Get(gctx, key)
	cancel()
	if gerr != nil {
		return cur, gerr
	}
	if !ok {
		return cur, c.refuseApproval(ctx, op, d, cur)
	}
	c.emit(ctx, Observation{Event: t.Event, Kind: a.Kind})
	c.log.Info("once: "+op+"d", "key", key, "kind", a.Kind, "by", d.By, "via", via)
	return cur, nil
}

// sees reports whether a is the action d was decided on: its attempt and
// payload, where d names them.
func (d Approval) sees(a Action) bool {
	return (d.Attempt == 0 || d.Attempt == a.Attempt) && (d.Fingerprint == "" || d.Fingerprint == a.Fingerprint) &&
		(d.Since.IsZero() || d.Since.Equal(a.CreatedAt))
}

// rejectedBy starts the error a rejection by who stores.
func rejectedBy(who string) string { return "rejected by " + who + ": " }

// rejected reports whether a failed because a person rejected it before
// it ran: its first claim waited for approval, and the failure is the
// rejection (an Abandon after it, or a failure of its own, is not).
func rejected(a Action) bool {
	return a.Status == StatusFailed && unapprovedUnrun(a) && a.ResolvedBy != "" && strings.HasPrefix(a.Error, rejectedBy(a.ResolvedBy))
}

// unapprovedUnrun reports whether a waited for approval and never ran:
// its first claim waited, and no claim after an approval took it on. A
// decision that leaves the wait (a rejection, an expiry) leaves it at
// attempt 1; only a claim of the approved row moves it on.
func unapprovedUnrun(a Action) bool { return a.OnExpiry != "" && a.Attempt == 1 }

// NeverRan reports whether a is a gated action whose effect has not run:
// it waits for approval, is approved and not yet claimed, or its wait
// ended unapproved (rejected, or expired to failed or to review). A
// person deciding it has nothing to check: it did not happen.
func (a Action) NeverRan() bool { return unapprovedUnrun(a) }

// refuseApproval writes a refused decision to the trail (once for a run
// of refusals of the same attempt and status, as refuseResolution does)
// and returns the *ConflictError that says why: who decided first, the
// wait's expiry, or where the action went.
func (c *Client) refuseApproval(ctx context.Context, op string, d Approval, cur Action) error {
	conflict := &ConflictError{Op: op, Current: cur, why: approvalRefusal(d, cur, c.approver(ctx, cur))}
	refused := Event{Key: cur.Key, Type: EventRefused, Attempt: cur.Attempt, From: cur.Status, Actor: d.By, Origin: c.origin,
		Note: fmt.Sprintf("%s refused: %s", op, conflict.why)}
	if d.Note != "" {
		refused.Note += ": " + d.Note
	}
	c.writeRefusal(ctx, refused, cur, op)
	return conflict
}

// approver is the approved event of cur's trail, when a person approved
// it: its row's resolved_by names whoever decided last, which, once the
// action ran, may be a person who resolved it since. Zero when the trail
// holds none, or cannot be read.
func (c *Client) approver(ctx context.Context, cur Action) Event {
	if cur.OnExpiry == "" || cur.Status == StatusAwaitingApproval {
		return Event{}
	}
	if cur.Status == StatusApproved {
		return Event{Type: EventApproved, Actor: cur.ResolvedBy, At: cur.ResolvedAt}
	}
	gctx, cancel := c.call(ctx)
	defer cancel()
	// The approval is the trail's second event, after the claim: the
	// first page holds it.
	p, err := c.store.EventPage(gctx, EventQuery{Key: cur.Key, Limit: 10})
	if err != nil {
		return Event{}
	}
	for _, e := range p.Events {
		if e.Type == EventApproved {
			return e
		}
	}
	return Event{}
}

// approvalRefusal says why a decision d on cur was refused; approved is
// the approval in its trail, if any.
func approvalRefusal(d Approval, cur Action, approved Event) string {
	when := func(t time.Time) string { return t.UTC().Format(time.RFC3339) }
	switch {
	case d.Fingerprint != "" && d.Fingerprint != cur.Fingerprint:
		return fmt.Sprintf("action %s holds another payload than the one decided on; reload it and decide again", cur.Key)
	case !d.Since.IsZero() && !d.Since.Equal(cur.CreatedAt):
		return fmt.Sprintf("action %s began waiting at %s, not at %s when the wait decided on began: that wait is over (the action ran and was purged, and its intent came back); look at this one and decide again",
			cur.Key, when(cur.CreatedAt), when(d.Since))
	case d.Attempt != 0 && d.Attempt != cur.Attempt:
		return fmt.Sprintf("it was decided on attempt %d, and action %s is at attempt %d (%s) now", d.Attempt, cur.Key, cur.Attempt, cur.Status)
	case cur.Status == StatusAwaitingApproval:
		return fmt.Sprintf("action %s waited for approval until %s, and its wait expired; nothing runs, and the reaper records it %s", cur.Key, when(cur.LeaseUntil), orFailed(cur.OnExpiry))
	case approved.Type == EventApproved:
		return fmt.Sprintf("action %s was approved by %s at %s, and is %s now (attempt %d)", cur.Key, approved.Actor, when(approved.At), cur.Status, cur.Attempt)
	case rejected(cur):
		return fmt.Sprintf("action %s was rejected by %s at %s: %s", cur.Key, cur.ResolvedBy, when(cur.ResolvedAt), strings.TrimPrefix(cur.Error, rejectedBy(cur.ResolvedBy)))
	case cur.OnExpiry == "":
		return fmt.Sprintf("action %s never waited for approval; it is %s (attempt %d)", cur.Key, cur.Status, cur.Attempt)
	case cur.Attempt > 1:
		return fmt.Sprintf("action %s no longer waits for approval: nobody approved it in time, and it is %s now (attempt %d), as a person's decision on its review left it", cur.Key, cur.Status, cur.Attempt)
	}
	return fmt.Sprintf("action %s is %s now (attempt %d): %s", cur.Key, cur.Status, cur.Attempt, cur.Error)
}

// orFailed is what an expired wait becomes: s, or StatusFailed.
func orFailed(s Status) Status {
	if s == "" {
		return StatusFailed
	}
	return s
}

// MaxNoteBytes bounds a person's note on a decision (Resolution.Note,
// Approval.Note).
const MaxNoteBytes = 4096

// ValidateApproval checks a decision on the action key as Approve (or,
// with reject, Reject) would, without any I/O, and returns a
// *ResolutionError naming the field that is wrong. A form or a command
// checks with it before it asks anything of the store.
func (c *Client) ValidateApproval(key Key, d Approval, reject bool) error {
	bad := func(field, reason string) error { return &ResolutionError{Field: field, Reason: reason} }
	if err := checkKey(key); err != nil {
		return err
	}
	if d.Attempt < 0 {
		return bad("Attempt", fmt.Sprintf("is %d; attempts are numbered from 1, and zero means whatever attempt stands", d.Attempt))
	}
	if d.Fingerprint != "" && (len(d.Fingerprint) > 128 || strings.ContainsFunc(string(d.Fingerprint), func(r rune) bool { return r <= ' ' || r > '~' })) {
		return bad("Fingerprint", "is not a fingerprint; pass the one the action's row holds, or none")
	}
	return checkDecisionText(
		textField{"By", d.By, "say who decided", MaxIDBytes, true},
		textField{"Note", d.Note, "say why: every duplicate is told it", MaxNoteBytes, reject},
		textField{"Via", d.Via, "", 64, false},
	)
}

// checkKey refuses a key no action can have (keys are printable ASCII,
// as KeyOf makes them), so a hostile one from a form or a URL never
// reaches the database.
func checkKey(key Key) error {
	if key == "" || len(key) > MaxIDBytes || strings.ContainsFunc(string(key), func(r rune) bool { return r <= ' ' || r > '~' }) {
		return &ResolutionError{Field: "Key", Reason: fmt.Sprintf("%.40q is not an action's key: keys are at most %d bytes of printable ASCII, as once key prints them", string(key), MaxIDBytes)}
	}
	return nil
}
