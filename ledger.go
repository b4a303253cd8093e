package once

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// wrote reads an action back after a write whose reply was lost, through
// a fresh call with a deadline of its own, and reports whether the row
// carries token: whether the write applied (and nothing has written over
// it since). It tries for up to patience while the database cannot be
// reached; known is false when no read got through.
func (c *Client) wrote(ctx context.Context, key Key, token string, patience time.Duration) (a Action, mine, known bool) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), patience)
	defer cancel()
	backoff := 20 * time.Millisecond
	for {
		gctx, cancelTry := context.WithTimeout(rctx, max(patience/3, time.Second))
		a, err := c.store.Get(gctx, key)
		cancelTry()
		switch {
		case err == nil:
			return a, a.Token == token, true
		case errors.Is(err, ErrNotFound):
			return Action{}, false, true
		}
		select {
		case <-rctx.Done():
			return Action{}, false, false
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, time.Second)
	}
}

// How the ledger writes a transition. Every write is fenced by its
// attempt (and hold), carries a token, and is read back when a reply is
// lost; the two differ in how hard they try and what counts as theirs.
type writing int

const (
	// aDecision is recovery's, a person's or a reaper's: one try within
	// ClaimTimeout, read back by its token when the reply is lost. Not
	// written, the caller decides again later.
	aDecision writing = iota
	// anOutcome is an attempt's: an effect that happened must be
	// recorded, so it is tried for RecordTimeout, what the database
	// refuses is replaced by a placeholder, and a lost reply is read
	// back by its token or by the worker's event in the trail.
	anOutcome
)

// transition writes a decision (see aDecision) and reports whether it
// applied: one that committed is reported applied, not failed or refused.
func (c *Client) transition(ctx context.Context, t Transition) (bool, error) {
	_, ok, err := c.write(ctx, t, aDecision)
	return ok, err
}

// lateStatuses are where a decision taken while an attempt was cut off
// leaves the action: a late outcome of the same attempt is recorded from
// them.
var lateStatuses = fromDecided

// recordLate records t from the status the action stands in now, if it
// is still at t's attempt and in one of lateStatuses. A decision that
// lands between the read and the write (a person resolving the review
// item just then) is read again, a few times.
func (c *Client) recordLate(ctx context.Context, a Action, t Transition) (Transition, bool, error) {
	note := t.Event.Note
	for range 3 {
		gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.recordTimeout)
		cur, err := c.store.Get(gctx, a.Key)
		cancel()
		if errors.Is(err, ErrNotFound) {
			// Purged since: the action is gone, and no record of this
			// attempt can stand. The outcome is refused, not unrecorded
			// (nothing is in flight to wait for).
			return t, false, nil
		}
		if err != nil {
			return t, false, err
		}
		if cur.Attempt != a.Attempt || !slices.Contains(lateStatuses, cur.Status) {
			return t, false, nil
		}
		m := succeedLate
		if t.To == StatusFailed {
			m = failLate
		}
		late := m.of(cur, ActorWorker)
		t.From, t.Event.From = late.From, late.Event.From
		t.Event.Note = strings.TrimPrefix(fmt.Sprintf("%s; late outcome of attempt %d, recorded after the action was %s", note, a.Attempt, cur.Status), "; ")
		ok, err := c.record(ctx, t)
		if ok || err != nil {
			return t, ok, err
		}
	}
	return t, false, nil
}

// record writes an attempt's outcome (see anOutcome) on a context
// detached from the caller's: an effect that happened must be recorded
// even if the caller has given up waiting. It reports false when the
// attempt was fenced out.
func (c *Client) record(ctx context.Context, t Transition) (bool, error) {
	_, ok, err := c.write(ctx, t, anOutcome)
	return ok, err
}

// write is the ledger's one write: t, stamped and tokened, as how says.
// It returns the transition written: t, or a placeholder for what the
// database refused.
func (c *Client) write(ctx context.Context, t Transition, how writing) (Transition, bool, error) {
	t = storableTransition(c.stamp(t))
	if t.Token == "" {
		t.Token = newToken()
	}
	if how == aDecision {
		cctx, cancel := c.call(ctx)
		ok, err := c.store.Transition(cctx, t)
		cancel()
		if err != nil {
			if _, mine, _ := c.wrote(ctx, t.Key, t.Token, c.recordTimeout); mine {
				return t, true, nil
			}
		}
		return t, ok, err
	}
	detached := context.WithoutCancel(ctx)
	deadline := time.Now().Add(c.recordTimeout)
	// rctx bounds all the tries. It is made when a try fails: the first
	// try's deadline is the earlier of its own and RecordTimeout's, and
	// most outcomes are recorded by it.
	var rctx context.Context
	try := max(c.recordTimeout/3, time.Second)
	backoff := 20 * time.Millisecond
	// cause is the first try's error that was not its deadline: what
	// kept the outcome out (a full disk, the database gone), where the
	// last try may only have waited out its time behind it.
	var lastErr, cause error
	for {
		// Each try has a deadline of its own, so one hung connection
		// does not use up the whole RecordTimeout: the next try may
		// get a healthy one.
		var tctx context.Context
		var cancelTry context.CancelFunc
		if rctx == nil {
			end := time.Now().Add(try)
			if deadline.Before(end) {
				end = deadline
			}
			tctx, cancelTry = context.WithDeadline(detached, end)
		} else {
			tctx, cancelTry = context.WithTimeout(rctx, try)
		}
		ok, err := c.store.Transition(tctx, t)
		cancelTry()
		if err == nil {
			if !ok && lastErr != nil {
				// Refused after a try whose reply was lost: that try
				// may have committed, and be what refuses this one.
				switch applied, known := c.recorded(rctx, t); {
				case applied:
					return t, true, nil
				case !known:
					return t, false, fmt.Errorf("gave up after %v: a try's reply was lost (%w), and whether it applied could not be read back", c.recordTimeout, lastErr)
				}
			}
			return t, ok, nil
		}
		lastErr = err
		if cause == nil && !ranOutOfTime(err) {
			cause = err
		}
		if rctx == nil {
			var cancel context.CancelFunc
			rctx, cancel = context.WithDeadline(detached, deadline)
			defer cancel()
		}
		if errors.Is(err, ErrRejected) {
			// The database refused what this outcome says, not the
			// connection: sending it again gets the same answer. Record
			// that the outcome could not be stored, once, rather than
			// leave the claim in flight (to be run again after its
			// lease) or retry until RecordTimeout.
			p, ok := placeholder(t, err)
			if !ok {
				return t, false, fmt.Errorf("the database refused even a placeholder: %w", err)
			}
			c.log.Warn("once: the database refused the outcome; recording a placeholder", "key", t.Key, "outcome", t.To, "err", err)
			t = p
			continue
		}
		c.log.Warn("once: recording outcome failed; retrying", "key", t.Key, "outcome", t.To, "err", err)
		select {
		case <-rctx.Done():
			if cause != nil && ranOutOfTime(lastErr) {
				return t, false, fmt.Errorf("gave up after %v: %w (the last try: %w)", c.recordTimeout, cause, lastErr)
			}
			return t, false, fmt.Errorf("gave up after %v: %w", c.recordTimeout, lastErr)
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 2*time.Second)
	}
}

// ranOutOfTime reports whether err is a context's end: a try that ran out
// of time, which says nothing of why.
func ranOutOfTime(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// stamp names this process as the origin of t's event.
func (c *Client) stamp(t Transition) Transition {
	t.Event.Origin = c.origin
	return t
}

// recorded reports whether t, tried before with a lost reply, was
// applied: the row still carries its token, or, if anything has written
// over the row since (recovery released it, a person resolved it, the
// next attempt claimed the release t recorded), the trail holds t's
// event, which only this attempt's worker writes. It reads until a read
// gets through or ctx ends; known is false when none did, and whether t
// applied is then unknown.
func (c *Client) recorded(ctx context.Context, t Transition) (applied, known bool) {
	backoff := 20 * time.Millisecond
	for {
		tctx, cancel := context.WithTimeout(ctx, max(c.recordTimeout/3, time.Second))
		applied, err := c.readBack(tctx, t)
		cancel()
		if err == nil {
			return applied, true
		}
		select {
		case <-ctx.Done():
			return false, false
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, time.Second)
	}
}

// readBack is one try of recorded.
func (c *Client) readBack(ctx context.Context, t Transition) (bool, error) {
	cur, err := c.store.Get(ctx, t.Key)
	switch {
	case errors.Is(err, ErrNotFound):
		// Purged since: no record of t stands.
		return false, nil
	case err != nil:
		return false, err
	case cur.Token == t.Token && cur.Attempt == t.Attempt:
		return true, nil
	}
	evs, err := c.store.Events(ctx, t.Key)
	if err != nil {
		return false, err
	}
	for _, e := range evs {
		if e.Attempt == t.Attempt && e.Actor == t.Event.Actor && e.Type == t.Event.Type && e.From == t.Event.From && e.To == t.To {
			return true, nil
		}
	}
	return false, nil
}

// placeholder is t with what the database refused taken out: its texts
// replaced by one saying so, and a success whose result was refused put
// up for review (it happened; its result is lost). It reports false when
// t already is a placeholder.
func placeholder(t Transition, refused error) (Transition, bool) {
	const mark = "the outcome could not be stored as it was"
	if strings.Contains(t.Error, mark) {
		return t, false
	}
	why := storable(fmt.Sprintf("%s (the database refused it: %v)", mark, refused))
	if t.To == StatusSucceeded {
		t.To, t.Result, t.Event.Type = StatusReview, nil, EventReview
		why = storable(fmt.Sprintf("the effect succeeded but %s (the database refused its result: %v)", mark, refused))
	}
	t.Error, t.Event.Note, t.Event.To = why, why, t.To
	return t, true
}
