package once

import (
	"context"
	"time"
)

// Events that reach hooks but are not written to an action's trail:
// writing them would turn every duplicate, a read, into a write.
const (
	EventConflict            EventType = "in_flight_conflict"
	EventFingerprintMismatch EventType = "fingerprint_mismatch"
	// EventWaiting: a call made with WaitFor met a claim held by another
	// attempt and began to wait for its outcome. It is observed once per
	// call; what the call came to (a replay, a claim of its own, an
	// in-flight conflict after the wait) is observed as it would be
	// without waiting.
	EventWaiting EventType = "in_flight_wait"
	// EventClaimResent: a claim's try failed while the database still
	// answered, and the claim was sent again with a new token. The
	// failed try may yet commit, later than the read that looked for it:
	// its row is then this call's (a later try, or a later call, finds
	// its token), and nobody runs its effect until the claim's lease
	// lapses and recovery takes it.
	EventClaimResent EventType = "claim_resent"
)

// Observation is what a hook is told: an event, the action's kind, and,
// for an effect's outcome, how long the effect ran.
type Observation struct {
	Event
	Kind string
	// Recovery is the kind's recovery mode, set on recovery events and
	// on an effect's outcome.
	Recovery Recovery
	// Duration is the effect's run time on outcome events, the
	// verifier's on verification events.
	Duration time.Duration
	// Recovered says recovery decided the transition: a reaper, or a
	// worker that found the action's claim dead or released, not an
	// effect's outcome. Metrics count these as recoveries whoever made
	// them.
	Recovered bool
}

// Hooks let a program watch every transition: for metrics (the metrics
// package), tracing (the tracing package) or alerts. They run
// synchronously on the goroutine that made the transition, so they must
// be quick and must not block.
type Hooks struct {
	// OnEvent is called after every transition, and for replays,
	// in-flight conflicts and refused payloads, which are not written to
	// the trail.
	OnEvent func(context.Context, Observation)
	// OnExecute is called when a claim is won, just before the effect
	// runs, with the claimed event. The context it returns is the one the
	// effect runs under (and the outcome's hooks see), so a tracer can
	// open a span around the effect. The func it returns, if not nil, is
	// called exactly once when the attempt is settled, with the outcome's
	// observation and the error Do or DoTx returns (nil on success).
	OnExecute func(context.Context, Observation) (context.Context, func(Observation, error))
	// OnAwaitingApproval is called when a claim has written an action
	// awaiting a person's approval (KindPolicy.Approval), with the row
	// (its payload, its expiry): tell someone. It is called once per
	// action, by the call whose claim wrote the row, never for a
	// duplicate; not for DoTx, whose row is not committed yet. It runs
	// on the caller's goroutine before Do returns: hand the message to
	// something that sends it, and return. A hook that panics is
	// logged. A process that dies right after its claim tells nobody:
	// once serve's webhook (--approval-webhook) watches the store, not
	// a process, for that.
	OnAwaitingApproval func(context.Context, Action)
}

// JoinHooks returns hooks that call each of hs in order: metrics and
// tracing together, say. OnExecute contexts are threaded through, and the
// end funcs are called in reverse order, as deferred calls would be.
func JoinHooks(hs ...Hooks) Hooks {
	var j Hooks
	for _, h := range hs {
		if h.OnEvent != nil {
			prev := j.OnEvent
			j.OnEvent = func(ctx context.Context, o Observation) {
				if prev != nil {
					prev(ctx, o)
				}
				h.OnEvent(ctx, o)
			}
		}
		if h.OnAwaitingApproval != nil {
			prev := j.OnAwaitingApproval
			j.OnAwaitingApproval = func(ctx context.Context, a Action) {
				if prev != nil {
					prev(ctx, a)
				}
				h.OnAwaitingApproval(ctx, a)
			}
		}
		if h.OnExecute != nil {
			prev := j.OnExecute
			j.OnExecute = func(ctx context.Context, o Observation) (context.Context, func(Observation, error)) {
				var prevEnd func(Observation, error)
				if prev != nil {
					ctx, prevEnd = prev(ctx, o)
				}
				ctx, end := h.OnExecute(ctx, o)
				return ctx, func(o Observation, err error) {
					if end != nil {
						end(o, err)
					}
					if prevEnd != nil {
						prevEnd(o, err)
					}
				}
			}
		}
	}
	return j
}

func (c *Client) emit(ctx context.Context, o Observation) {
	if o.Origin == "" {
		o.Origin = c.origin
	}
	if c.hooks.OnEvent != nil {
		c.hooks.OnEvent(ctx, o)
	}
}

// announce tells the hooks that a's claim, this call's, wrote it
// awaiting approval.
func (c *Client) announce(ctx context.Context, a Action) {
	c.log.Info("once: awaiting approval", "key", a.Key, "kind", a.Kind, "target", a.Target, "expires", a.LeaseUntil)
	c.emit(ctx, Observation{Event: Event{Key: a.Key, Type: EventAwaitingApproval, Attempt: a.Attempt, To: StatusAwaitingApproval, Actor: ActorWorker, At: a.CreatedAt}, Kind: a.Kind})
	if c.hooks.OnAwaitingApproval == nil {
		return
	}
	defer func() {
		if p := recover(); p != nil {
			c.log.Error("once: Hooks.OnAwaitingApproval panicked; the action waits all the same", "key", a.Key, "kind", a.Kind, "panic", p)
		}
	}()
	c.hooks.OnAwaitingApproval(ctx, a)
}

// started reports a won claim to the hooks and returns the context the
// effect runs under, with the func that reports the attempt settled. The
// func does its work once, however often it is called.
func (c *Client) started(ctx context.Context, a Action) (context.Context, func(Observation, error)) {
	o := Observation{Event: Event{Key: a.Key, Type: EventClaimed, Attempt: a.Attempt, To: StatusInFlight, Actor: ActorWorker}, Kind: a.Kind}
	var end func(Observation, error)
	if c.hooks.OnExecute != nil {
		ctx, end = c.hooks.OnExecute(ctx, o)
	}
	c.emit(ctx, o)
	if end == nil {
		return ctx, func(Observation, error) {}
	}
	done := false
	return ctx, func(o Observation, err error) {
		if !done {
			done = true
			end(o, err)
		}
	}
}
