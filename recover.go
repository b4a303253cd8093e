package once

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
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
func (p KindPolicy) hold() time.Duration { return p.Recovery.rules().hold(p) }

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
//
// named, when set, is the token of a named claim (ClaimID) that meets
// the lapsed attempt: a takeover is written with the token derived from
// it, so that the claim made again finds the takeover its own.
func (c *Client) recoverKey(ctx context.Context, pol KindPolicy, key Key, named string) (recovery, error) {
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
	// The takeover is written with a token of its own: the new
	// attempt's, which rebuilds it and makes its outcomes' tokens. The
	// row's (the attempt it takes over) is known to that one's holder
	// (TestClient/ReviewTakeoverAttemptRebuilds).
	claim := newToken()
	if named != "" {
		claim = takeoverToken(named, a.Attempt+1)
	}
	d, result, err := c.decide(ctx, pol, a, token, ActorWorker, claim)
	if err != nil {
		return recovery{}, err
	}
	if d == decTakeover {
		a.Attempt++
		a.Status, a.VerifyFailures, a.Error, a.Token = StatusInFlight, 0, "", claim
	}
	return recovery{decision: d, action: a, result: result}, nil
}

// newToken returns a random hold token.
func newToken() string {
	return rand.Text()
}

// decide applies pol's recovery to a, which the caller holds (see
// Store.Recoverable). takeover is the token a takeover claims the
// action with, when the caller can run the effect itself (a worker in
// Do); empty, the caller (the reaper) only releases it. It returns the
// verifier's result when it found the effect landed.
func (c *Client) decide(ctx context.Context, pol KindPolicy, a Action, hold, actor, takeover string) (decision, json.RawMessage, error) {
	pol.Recovery = pol.recoveryOf(a)
	d := &deciding{c: c, ctx: ctx, pol: pol, recovery: pol.Recovery, a: a, hold: hold, actor: actor, takeover: takeover, reason: a.Error}
	if a.Status == StatusInFlight {
		d.reason = fmt.Sprintf("the worker of attempt %d stopped answering: its lease expired", a.Attempt)
		if a.Error != "" {
			// What the effect noted it was about to do (Attempt.Note):
			// what a person should look for.
			d.reason = withNote(d.reason, a.Error)
		}
		c.emit(ctx, Observation{Event: Event{Key: a.Key, Type: EventLeaseExpired, Attempt: a.Attempt, From: a.Status, Actor: actor}, Kind: a.Kind, Recovery: pol.Recovery})
	}
	return pol.Recovery.rules().lapsed(d)
}

// deciding is one decision recovery is taking: what a Recovery's rules
// decide with. Every decision is conditional on the hold the caller
// took: a worker whose heartbeat came back, or a second recoverer after
// the hold ran out, clears or replaces the token and wins instead.
type deciding struct {
	c   *Client
	ctx context.Context
	pol KindPolicy
	// recovery is what decided, for the hooks and the log: the policy's,
	// or AskPerson when it could not be applied.
	recovery Recovery
	a        Action
	hold     string
	actor    string
	// takeover is the token a takeover is written with; empty when the
	// caller cannot run the effect, and releases instead.
	takeover string
	// reason is why the action is being recovered, for the trail.
	reason string
	// took is the verifier's time, when one was asked.
	took time.Duration
}

// of is m on the held action, by the recoverer.
func (d *deciding) of(m move) Transition {
	t := m.of(d.a, d.actor)
	t.VerifyFailures, t.Hold = d.a.VerifyFailures, d.hold
	return t
}

// apply writes t, the decision d came to.
func (d *deciding) apply(t Transition, dec decision) (decision, json.RawMessage, error) {
	c, a := d.c, d.a
	ok, err := c.transition(d.ctx, t)
	if err != nil {
		return decChanged, nil, fmt.Errorf("once: recovering action %s: %w", a.Key, err)
	}
	if !ok {
		return decChanged, nil, nil
	}
	c.emit(d.ctx, Observation{Event: t.Event, Kind: a.Kind, Recovery: d.recovery, Duration: d.took, Recovered: true})
	c.log.Info("once: recovered", "key", a.Key, "kind", a.Kind, "attempt", a.Attempt, "recovery", d.recovery, "outcome", dec, "by", d.actor)
	return dec, t.Result, nil
}

// retry runs the effect again: a worker takes the action over as the
// next attempt, a reaper releases it for the next delivery.
func (d *deciding) retry(note string) (decision, json.RawMessage, error) {
	if d.takeover != "" {
		t := d.of(takeOver)
		t.Lease, t.VerifyFailures, t.Event.Note, t.Token = d.pol.storedLease(), 0, note, d.takeover
		return d.apply(t, decTakeover)
	}
	return d.apply(d.of(recoverRelease).noting(note), decReleased)
}

// review puts the action up for review, for why.
func (d *deciding) review(why string) (decision, json.RawMessage, error) {
	return d.apply(d.of(recoverReview).noting(why), decReview)
}

// verified records the verifier's finding that the effect landed.
func (d *deciding) verified(result json.RawMessage) (decision, json.RawMessage, error) {
	t := d.of(recoverVerified)
	t.Result, t.Event.Note = result, "the verifier found the effect landed"
	return d.apply(t, decSucceeded)
}

// verifyLater leaves the action where it is, to ask the verifier again
// after the n-th failure's backoff.
func (d *deciding) verifyLater(n int, err error) (decision, json.RawMessage, error) {
	t := d.of(verifyLater)
	t.Lease, t.VerifyFailures, t.Error = d.pol.backoff(n), n, d.a.Error
	t.Event.Note = fmt.Sprintf("verifier failed (%d of %d): %v; asking again in %v", n, d.pol.MaxVerifyFailures, err, d.pol.backoff(n))
	return d.apply(t, decBackoff)
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
