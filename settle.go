package once

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// panicked is the outcome of an effect that panicked: unknown, since
// it may have happened before it panicked.
type panicked struct{ value any }

func (p *panicked) Error() string { return fmt.Sprintf("panic: %v", p.value) }

// maxPanics is how many attempts of one action may panic before it is
// put up for review, also under RetryWithProviderKey.
const maxPanics = 3

// panickedBefore counts the attempts of a before its own that ended in
// a panic its worker recorded; 0 when the trail cannot be read, as it
// was before the count.
func (c *Client) panickedBefore(ctx context.Context, a Action) int {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.recordTimeout)
	defer cancel()
	evs, err := c.store.Events(rctx, a.Key)
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range evs {
		if e.Attempt < a.Attempt && e.Actor == ActorWorker && e.Type == EventReleased && strings.HasPrefix(e.Note, "outcome unknown: panic: ") {
			n++
		}
	}
	return n
}

// abandon gives up a won claim whose effect never ran, for cause. A
// first claim is released for the next delivery: left in flight, its
// lease would lapse and recovery would treat it as an effect that may
// have happened (under AskPerson, put it to a person). So is a takeover
// under RetryWithProviderKey, whose next attempt carries the provider's
// key, which absorbs the attempt before it if that one lands late. A
// takeover under VerifyThenDecide is not released: the attempt before
// it may yet land, and a release would let the next delivery run the
// effect without the verifier being asked again. It is marked unknown,
// due at once, so the next delivery or the reaper asks the verifier
// again, and the trail says that this attempt never ran
// (TestClient/FailedRenewalOfATakeoverAsksTheVerifierAgain,
// TestClient/CallerGoneAfterATakeoverAsksTheVerifierAgain,
// TestClient/AbandonedTakeoverTrailSaysNothingRan).
func (c *Client) abandon(ctx context.Context, pol KindPolicy, a Action, cause error, takeover bool) outcome {
	recovery := pol.recoveryOf(a)
	if !takeover || recovery.rules().unrunTakeover().to == StatusReleased {
		return c.releaseUnrun(ctx, pol, a, cause)
	}
	// The attempts before it that may have run are not all a.Attempt-1:
	// that one may be a takeover abandoned too.
	note := fmt.Sprintf("attempt %d, a takeover, never ran (%s); whether an earlier attempt's effect happened is still unknown, and the verifier is asked again",
		a.Attempt, unrunNote(cause))
	t := recovery.rules().unrunTakeover().of(a, ActorWorker).noting(note)
	t.Lease = time.Millisecond
	// Not recorded, the takeover stays in flight, unless the write
	// commits yet: recovery decides again when its lease expires.
	return c.recordUnrun(ctx, recovery, a, t, cause, "marking the takeover unknown", nil, func() error {
		return &UnknownOutcomeError{Key: a.Key, Attempt: a.Attempt, Message: note, Status: StatusUnknown, Due: time.Now().Add(t.Lease), err: cause}
	})
}

// recordUnrun records t, which takes a won claim whose effect never ran
// (for cause) out of flight, and returns done's error when it applied.
// Not recorded, t may yet commit, or the claim stay in flight: the
// *RecordError says what ran, nothing, and what failed, what.
//
// verified is the verifier's time when its answer decided t
// (verifyReleased): t is then recovery's decision, not the worker's.
func (c *Client) recordUnrun(ctx context.Context, recovery Recovery, a Action, t Transition, cause error, what string, verified *time.Duration, done func() error) outcome {
	o := outcome{key: a.Key, attempt: a.Attempt}
	ok, err := c.record(ctx, t)
	switch {
	case err != nil:
		o.err = &RecordError{Key: a.Key, Attempt: a.Attempt, Outcome: t.To, Err: fmt.Errorf("nothing ran (%v), and %s failed: %w", cause, what, err)}
	case !ok:
		o.err = &FencedError{Key: a.Key, Attempt: a.Attempt, Outcome: t.To, Unrun: true}
	default:
		obs := Observation{Event: t.Event, Kind: a.Kind, Recovery: recovery}
		if verified != nil {
			obs.Duration, obs.Recovered = *verified, true
		}
		c.emit(ctx, obs)
		o.err = done()
	}
	return o
}

// unrunNote says why a won claim's effect never ran.
func unrunNote(cause error) string {
	switch {
	case errors.Is(cause, errLeaseSpent):
		return "the process stalled between the claim and the effect for longer than the lease"
	case errors.Is(cause, errNotRenewed):
		return "the claim's lease could not be renewed before the effect started (" + cause.Error() + ")"
	}
	return "the caller's context ended before the effect ran: " + cause.Error()
}

// releaseUnrun releases a won claim whose effect never ran. If the
// release cannot be written either, the claim is left so, and the error
// says the release was not recorded.
func (c *Client) releaseUnrun(ctx context.Context, pol KindPolicy, a Action, cause error) outcome {
	note := unrunNote(cause)
	if errors.Is(cause, errLeaseSpent) || errors.Is(cause, errNotRenewed) {
		note += "; nothing ran"
	}
	t := release.of(a, ActorWorker).noting(note)
	return c.recordUnrun(ctx, pol.Recovery, a, t, cause, "the release", nil, func() error {
		return fmt.Errorf("once: action %s attempt %d released unrun: %w (%w)", a.Key, a.Attempt, ErrRetryLater, cause)
	})
}

// outcomeTransition is the transition that records what an effect
// returned, by the rules in Do's doc and the kind's recovery. It does no
// I/O. resultErr is set when the effect succeeded but its value cannot be
// stored (too large, not JSON); the action is then put up for review.
func outcomeTransition(pol KindPolicy, maxResult int, a Action, value any, err error) (t Transition, resultErr error) {
	switch classify(err) {
	case StatusSucceeded:
		// A slow worker whose claim was decided meanwhile may still say
		// how it ended (settle tries again from the decision). A newer
		// attempt fences it out through the attempt number.
		t = succeed.of(a, ActorWorker)
		t.Result, resultErr = encodeResult(value, maxResult)
		if resultErr != nil {
			t = putToReview.of(a, ActorWorker).noting("the effect succeeded but " + resultErr.Error())
		}
	case StatusReleased:
		t = release.of(a, ActorWorker).noting(err.Error())
	case StatusFailed:
		t = fail.of(a, ActorWorker).noting(err.Error())
	default:
		// Unknown: the kind's recovery says what it becomes (review,
		// released, or unknown and due for its verifier).
		m, lease := pol.Recovery.rules().unknown()
		t = m.of(a, ActorWorker)
		t.Error, t.Event.Note, t.Lease = err.Error(), "outcome unknown: "+err.Error(), lease
	}
	return t, resultErr
}

// encodeResult encodes an effect's value for storage, within the cap.
func encodeResult(v any, maxResult int) (json.RawMessage, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrResultNotJSON, err)
	}
	if len(b) > maxResult {
		return nil, fmt.Errorf("%w: its result is %d bytes, over Config.MaxResultBytes (%d); return a smaller value (an id, not a document)", ErrResultTooLarge, len(b), maxResult)
	}
	if err := checkResult(b); err != nil {
		return nil, err
	}
	return b, nil
}

// settled is what recording an attempt's outcome came to.
type settled struct {
	// t is the transition written (or tried last).
	t Transition
	// resultErr is set when the effect succeeded but its value could
	// not be stored: the action was put up for review.
	resultErr error
	// err is a *RecordError (not written), a *FencedError (refused)
	// or a *ConflictError (this attempt had settled otherwise).
	err error
	obs Observation
	// found says the row held this outcome already, written by this
	// attempt before: nothing was written, and the hooks were not told.
	found bool
}

// settle records what the effect returned (value, ferr), by the rules in
// Do's doc and the kind's recovery, and reports it to the hooks and the
// log. It is the one place an attempt's outcome is written, for Do and
// for the settling methods of an Attempt alike.
func (c *Client) settle(ctx context.Context, pol KindPolicy, a Action, value any, ferr error, noted string, took time.Duration) settled {
	t, resultErr := outcomeTransition(pol, c.maxResult, a, value, ferr)
	if a.Token != "" {
		// Made from the claim's token and what was asked, so that
		// settling again, here or in a process that rebuilt the
		// attempt, knows its own write.
		t.Token = settleToken(a.Token, classify(ferr))
	}
	if noted != "" && ferr != nil && classify(ferr) == StatusUnknown {
		// What the effect noted it was doing (Attempt.Note): what the
		// person who decides an unknown outcome looks for.
		t.Error, t.Event.Note = withNote(t.Error, noted), withNote(t.Event.Note, noted)
	}
	var pe *panicked
	if errors.As(ferr, &pe) && t.To == StatusReleased {
		// A panic is the effect's own bug, and the next attempt would
		// most likely panic again: released each time for the next
		// delivery, or a re-drive, it ran for ever
		// (TestRepeatedPanicsGoToReview).
		if n := c.panickedBefore(ctx, a); n+1 >= maxPanics {
			why := fmt.Sprintf("the effect panicked in %d attempts, and another would most likely panic again: a person decides", n+1)
			r := putToReview.of(a, ActorWorker)
			r.Error, r.Event.Note, r.Token = why+"; "+t.Error, why+"; "+t.Event.Note, t.Token
			t = r
		}
	}
	obs := Observation{Event: t.Event, Kind: a.Kind, Recovery: pol.Recovery, Duration: took}
	s := func(t Transition, err error) settled {
		return settled{t: t, resultErr: resultErr, err: err, obs: obs}
	}

	wanted := t.To
	t, ok, err := c.write(ctx, t, anOutcome)
	obs.Event = t.Event
	if err == nil && ok && wanted == StatusSucceeded && t.To != StatusSucceeded {
		// The database refused the result; a placeholder put the
		// action up for review.
		resultErr = fmt.Errorf("%w: the database refused it", ErrResultNotJSON)
	}
	if err == nil && !ok && a.Token != "" {
		// Refused: this attempt may have settled already, in a call
		// whose answer was lost or in another process.
		switch cur, again, known := c.settledBefore(ctx, a); {
		case known && again == classify(ferr):
			// The same answer, also when that success's result could
			// not be stored (TestClient/ReviewRebuildOfReviewedSuccessSaysSo).
			var err error
			if resultErr == nil {
				err = unstoredSuccess(cur, again)
			}
			found := s(t, err)
			found.found = true
			return found
		case known:
			return s(t, &ConflictError{Op: "settle as " + string(classify(ferr)), Current: cur})
		}
	}
	if err == nil && !ok && (t.To == StatusSucceeded || t.To == StatusFailed) {
		// Not in flight any more. If recovery or a person decided while
		// this attempt was cut off (released, put up for review,
		// abandoned) and no newer attempt claimed it, the outcome has
		// become known: record it over the decision, which stays in the
		// trail beside it.
		t, ok, err = c.recordLate(ctx, a, t)
		obs.Event = t.Event
	}
	if err != nil {
		return s(t, &RecordError{Key: a.Key, Attempt: a.Attempt, Outcome: t.To, Err: err})
	}
	if !ok {
		// Superseded: say so in the trail, so an operator sees the late
		// outcome beside whatever won.
		c.log.Warn("once: attempt superseded; outcome not recorded", "key", a.Key, "kind", a.Kind, "attempt", a.Attempt, "outcome", t.To)
		obs.Event = Event{Key: a.Key, Type: EventRefused, Attempt: a.Attempt, To: t.To, Actor: ActorWorker, Origin: c.origin,
			Note: fmt.Sprintf("late outcome of attempt %d (%s) refused: the action had moved on", a.Attempt, t.To)}
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.recordTimeout)
		err := c.store.AppendEvent(actx, storableEvent(obs.Event))
		cancel()
		if err != nil {
			c.log.Warn("once: could not record a refused outcome", "key", a.Key, "err", err)
		}
		c.emit(ctx, obs)
		return s(t, &FencedError{Key: a.Key, Attempt: a.Attempt, Outcome: t.To})
	}
	c.emit(ctx, obs)
	if resultErr != nil {
		c.log.Warn("once: result not stored; action put up for review", "key", a.Key, "kind", a.Kind, "err", resultErr)
	} else if t.To != StatusSucceeded && classify(ferr) == StatusUnknown {
		c.log.Warn("once: outcome unknown", "key", a.Key, "kind", a.Kind, "attempt", a.Attempt, "recovery", pol.Recovery, "err", ferr)
	}
	return s(t, nil)
}

// settledBefore reads a back after a refused outcome and reports
// whether this attempt had settled it already, and as what was asked:
// the row carries the token of one of its outcomes. known is false when
// it had not, or the row could not be read.
func (c *Client) settledBefore(ctx context.Context, a Action) (cur Action, asked Status, known bool) {
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.recordTimeout)
	cur, err := c.store.Get(gctx, a.Key)
	cancel()
	if err != nil || cur.Attempt != a.Attempt {
		return cur, "", false
	}
	asked, known = settledAs(cur, a.Token)
	return cur, asked, known
}

// unstoredSuccess is the answer to settling again a success that cur,
// which carries its token, holds up for review: its result could not be
// stored. Nil when cur holds what was asked.
func unstoredSuccess(cur Action, asked Status) error {
	if asked != StatusSucceeded || cur.Status == StatusSucceeded {
		return nil
	}
	return &ReviewError{Key: cur.Key, Attempt: cur.Attempt, Reason: cur.Error}
}

// answer is what Do returns for its effect's outcome, once settled.
func (s settled) answer(a Action, value any, ferr error) outcome {
	o := outcome{key: a.Key, attempt: a.Attempt, ran: true, value: value}
	t := s.t
	switch {
	case s.err != nil:
		o.err = s.err
	case t.To == StatusSucceeded:
	case s.resultErr != nil:
		o.err = fmt.Errorf("once: action %s: %w; it was put up for review", a.Key, s.resultErr)
	case classify(ferr) == StatusReleased:
		o.value, o.err = nil, fmt.Errorf("once: action %s attempt %d released: %w", a.Key, a.Attempt, ferr)
	case t.To == StatusFailed:
		o.value, o.err = nil, &FailedError{Key: a.Key, Attempt: a.Attempt, Message: t.Error, err: ferr}
	default:
		e := &UnknownOutcomeError{Key: a.Key, Attempt: a.Attempt, Message: ferr.Error(), Status: t.To, err: ferr}
		if t.To == StatusUnknown {
			e.Due = time.Now().Add(t.Lease)
		}
		o.value, o.err = nil, e
	}
	return o
}

// settleTx records a success inside the caller's transaction: one write,
// since the transaction commits or fails as a whole, and no placeholder,
// since the caller rolls back what cannot be stored.
func (c *Client) settleTx(ctx context.Context, s Store, pol KindPolicy, a Action, value any, took time.Duration, end func(Observation, error)) error {
	t, resultErr := outcomeTransition(pol, c.maxResult, a, value, nil)
	if resultErr != nil {
		err := fmt.Errorf("once: action %s: %w; roll the transaction back", a.Key, resultErr)
		end(Observation{Event: Event{Key: a.Key, Attempt: a.Attempt, From: StatusInFlight, Actor: ActorWorker}, Kind: a.Kind, Duration: took}, err)
		return err
	}
	applied, err := s.Transition(ctx, storableTransition(c.stamp(t)))
	switch {
	case err != nil:
		err = fmt.Errorf("once: action %s: recording the result in the transaction: %w", a.Key, err)
	case !applied:
		err = &FencedError{Key: a.Key, Attempt: a.Attempt, Outcome: StatusSucceeded}
	}
	o := Observation{Event: t.Event, Kind: a.Kind, Duration: took}
	if err == nil {
		c.emit(ctx, o)
	}
	end(o, err)
	return err
}
