package once

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// decision is what recovery did with an action.
type decision int

const (
	decChanged   decision = iota // the action moved on under us; read it again
	decReview                    // put up for review
	decReleased                  // released for the next delivery
	decTakeover                  // taken over by the caller as attempt+1
	decSucceeded                 // the verifier found the effect landed
	decBackoff                   // the verifier could not tell; asked again later
)

func (d decision) String() string {
	return [...]string{"changed", "review", "released", "taken_over", "verified_landed", "verify_backoff"}[d]
}

// hold is how long recovery keeps an action to itself while it decides.
// Deciding is a write or two, so a lease's length is plenty, except when a
// verifier is asked (bounded by MaxExecution). If the recovering process
// dies, the action comes back after this long; a duplicate that meets the
// hold is told to come back then. Each action is held for its own kind's,
// by inline recovery and the reaper alike.
func (p KindPolicy) hold() time.Duration {
	if p.Recovery == VerifyThenDecide {
		return p.MaxExecution + p.Lease
	}
	return p.Lease
}

// recovery is what recovering one action came to.
type recovery struct {
	decision decision
	// action is the action as the decision left it: the new attempt on
	// a takeover.
	action Action
	// result is the verifier's, when it found the effect landed.
	result json.RawMessage
}

// recoverKey applies the kind's recovery to one action whose outcome is
// unknown, from inside Do: it takes the action (if no one else has) and
// decides. On a takeover the caller runs the effect as the next attempt,
// under fencing.
func (c *Client) recoverKey(ctx context.Context, pol KindPolicy, key Key) (recovery, error) {
	token := newToken()
	cctx, cancel := c.call(ctx)
	got, _, err := c.store.Recoverable(cctx, RecoverRequest{Key: key, Limit: 1, Hold: pol.hold(), Token: token, Verifiable: c.verifiable})
	cancel()
	if err != nil {
		return recovery{}, fmt.Errorf("once: recovering action %s: %w", key, err)
	}
	if len(got) == 0 {
		// Another worker or a reaper is on it, or it finished.
		return recovery{decision: decChanged}, nil
	}
	a := got[0]
	d, result, err := c.decide(ctx, pol, a, token, ActorWorker, true)
	if err != nil {
		return recovery{}, err
	}
	if d == decTakeover {
		a.Attempt++
		a.Status, a.VerifyFailures, a.Error = StatusInFlight, 0, ""
	}
	return recovery{decision: d, action: a, result: result}, nil
}

// newToken returns a random hold token.
func newToken() string {
	return rand.Text()
}

// decide applies pol's recovery to a, which the caller holds (see
// Store.Recoverable). canExecute says whether the caller can run the
// effect itself (a worker in Do) or only release it (the reaper). It
// returns the verifier's result when it found the effect landed.
func (c *Client) decide(ctx context.Context, pol KindPolicy, a Action, hold, actor string, canExecute bool) (decision, json.RawMessage, error) {
	pol.Recovery = pol.recoveryOf(a)
	reason := a.Error
	if a.Status == StatusInFlight {
		reason = fmt.Sprintf("the worker of attempt %d stopped answering: its lease expired", a.Attempt)
		if a.Error != "" {
			// What the effect noted it was about to do (Attempt.Note):
			// what a person should look for.
			reason = withNote(reason, a.Error)
		}
		c.emit(ctx, Observation{Event: Event{Key: a.Key, Type: EventLeaseExpired, Attempt: a.Attempt, From: a.Status, Actor: actor}, Kind: a.Kind, Recovery: pol.Recovery})
	}
	if pol.Recovery == VerifyThenDecide && pol.Verifier == nil {
		// Recorded VerifyThenDecide, taken by a process that configures
		// the kind without a verifier (the application changed its
		// policy): it cannot ask the provider, and must not guess, so a
		// person decides. Processes that know nothing of the kind never
		// take such an action (Recoverable).
		pol.Recovery = AskPerson
		reason = strings.TrimPrefix(reason+"; ", "; ") + fmt.Sprintf("recorded verify_then_decide, but this process configures %s without a verifier", a.Kind)
	}
	// Hold makes every decision conditional on the hold this caller took:
	// a worker whose heartbeat came back, or a second recoverer after the
	// hold ran out, clears or replaces the token and wins instead.
	base := Transition{Key: a.Key, Attempt: a.Attempt, From: []Status{a.Status}, VerifyFailures: a.VerifyFailures, Hold: hold}
	var took time.Duration // the verifier's, when one was asked
	apply := func(t Transition, d decision) (decision, json.RawMessage, error) {
		t.Event.Key, t.Event.Attempt, t.Event.From, t.Event.To, t.Event.Actor = a.Key, a.Attempt, a.Status, t.To, actor
		if t.NewAttempt {
			// The trail names the attempt a takeover starts; so do hooks.
			t.Event.Attempt++
		}
		ok, err := c.transition(ctx, t)
		if err != nil {
			return decChanged, nil, fmt.Errorf("once: recovering action %s: %w", a.Key, err)
		}
		if !ok {
			return decChanged, nil, nil
		}
		c.emit(ctx, Observation{Event: t.Event, Kind: a.Kind, Recovery: pol.Recovery, Duration: took, Recovered: true})
		c.log.Info("once: recovered", "key", a.Key, "kind", a.Kind, "attempt", a.Attempt, "recovery", pol.Recovery, "outcome", d, "by", actor)
		return d, t.Result, nil
	}
	retry := func(note string) (decision, json.RawMessage, error) {
		t := base
		if canExecute {
			t.To, t.NewAttempt, t.Lease, t.VerifyFailures = StatusInFlight, true, pol.storedLease(), 0
			t.Event = Event{Type: EventTakenOver, Note: note}
			return apply(t, decTakeover)
		}
		t.To, t.Error = StatusReleased, note
		t.Event = Event{Type: EventReleased, Note: note}
		return apply(t, decReleased)
	}
	review := func(why string) (decision, json.RawMessage, error) {
		t := base
		t.To, t.Error = StatusReview, why
		t.Event = Event{Type: EventReview, Note: why}
		return apply(t, decReview)
	}

	switch pol.Recovery {
	case RetryWithProviderKey:
		return retry(reason + "; retried with the same provider idempotency key")
	case VerifyThenDecide:
		vctx, cancel := context.WithTimeout(ctx, pol.MaxExecution)
		started := time.Now()
		landed, result, err := safeVerify(vctx, pol.Verifier, a)
		cancel()
		took = time.Since(started)
		if err != nil {
			n := a.VerifyFailures + 1
			if n >= pol.MaxVerifyFailures {
				return review(fmt.Sprintf("%s; the verifier could not tell %d times, last: %v", reason, n, err))
			}
			t := base
			t.To, t.Lease, t.VerifyFailures, t.Error = a.Status, pol.backoff(n), n, a.Error
			t.Event = Event{Type: EventVerifyFailed, Note: fmt.Sprintf("verifier failed (%d of %d): %v; asking again in %v", n, pol.MaxVerifyFailures, err, pol.backoff(n))}
			return apply(t, decBackoff)
		}
		if landed {
			if why := c.unstorable(result); why != "" {
				return review(fmt.Sprintf("%s; the verifier says it landed but %s", reason, why))
			}
			t := base
			t.To, t.Result = StatusSucceeded, result
			t.Event = Event{Type: EventVerified, Note: "the verifier found the effect landed"}
			return apply(t, decSucceeded)
		}
		return retry(reason + "; the verifier found no trace of it")
	default:
		return review(reason)
	}
}

// recoveryOf is the recovery that applies to a: the one its row
// recorded when it was claimed, else the policy's. A process that was
// told nothing about the kind (the command's reaper) still does what the
// application asked for.
func (p KindPolicy) recoveryOf(a Action) Recovery {
	if a.Recovery != RecoveryDefault {
		return a.Recovery
	}
	return p.Recovery
}

// unstorable says why a verifier's result cannot be stored ("its result
// is 70000 bytes, over Config.MaxResultBytes"), or "". An empty result
// is stored as none.
func (c *Client) unstorable(result json.RawMessage) string {
	if len(result) > 0 {
		if err := checkResult(result); err != nil {
			return fmt.Sprintf("its result cannot be stored: %v", err)
		}
	}
	if len(result) > c.maxResult {
		return fmt.Sprintf("its result is %d bytes, over Config.MaxResultBytes", len(result))
	}
	return ""
}

// safeVerify calls a verifier, turning a panic into an error: a broken
// verifier must not take the reaper down with it.
func safeVerify(ctx context.Context, v Verifier, a Action) (landed bool, result json.RawMessage, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("verifier panicked: %v", p)
		}
	}()
	return v(ctx, a)
}
