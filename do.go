package once

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Attempt is what an effect function is told about the attempt it runs.
type Attempt struct {
	// Key is the action's key.
	Key Key
	// Number is the fencing number of this attempt: 1 for the first.
	Number int
	// ProviderKey is an idempotency key for the provider's API (Stripe's
	// Idempotency-Key header, say). It is the same on every attempt of the
	// action, so a provider that honours it absorbs a retried call.
	ProviderKey string
	// Intent is the intent being carried out.
	Intent Intent
}

// Result is what Do returns on success.
type Result[T any] struct {
	// Value is the effect's result: returned by the effect on this call,
	// or decoded from the store when Replayed.
	Value T
	Key   Key
	// Attempt is the attempt that produced Value.
	Attempt int
	// Replayed is true when the effect did not run in this call because
	// an earlier attempt had already succeeded.
	Replayed bool
}

// Do carries out the intent at most once and returns its result to every
// caller that presents it.
//
// The first caller claims the key (one atomic insert the database
// arbitrates) and runs fn, which gets the attempt number and a provider
// idempotency key; its result is stored. Every later caller gets the
// stored result back with Replayed set, without running fn.
//
// What fn returns decides what is recorded:
//   - nil error: succeeded, the value is stored (it must encode as JSON);
//   - RetryLater(err): the effect did not happen; the claim is released
//     and the error returned, so the job goes back to its queue;
//   - Permanent(err): the effect did not happen and never will; stored as
//     failed, a *FailedError to this caller and every duplicate;
//   - any other error, a panic, or a timeout: the outcome is unknown and
//     recorded so; the action is not re-executed automatically.
//
// A caller that meets a claim held by another attempt gets an
// *InFlightError and should return its job to the queue. A caller whose
// payload differs from the first attempt's gets a *FingerprintError.
// Neither runs fn.
func Do[T any](ctx context.Context, c *Client, in Intent, fn func(context.Context, Attempt) (T, error)) (Result[T], error) {
	if c == nil {
		return Result[T]{}, errors.New("once: Do called with a nil *Client; build one with once.New")
	}
	if fn == nil {
		return Result[T]{}, errors.New("once: Do called with a nil effect function")
	}
	req, pol, err := c.prepare(in)
	if err != nil {
		return Result[T]{}, err
	}
	cr, err := c.claim(ctx, c.store, req)
	if err != nil {
		return Result[T]{}, err
	}
	if !cr.Claimed {
		return answer(ctx, c, pol, in, req, cr, fn)
	}
	return execute(ctx, c, pol, in, cr.Action, fn)
}

// DoTx is Do inside the caller's transaction, for effects that are writes
// to the same database: the claim, the effect and the record commit or
// roll back together, so there is no window in which the effect happened
// but was not recorded. tx is a pgx.Tx for the postgres store and a
// *sql.Tx for the sqlite store; fn receives it back.
//
// When fn returns an error nothing is recorded and the error is returned:
// roll the transaction back. There is no lease or heartbeat; the
// transaction itself holds the claim, and a concurrent DoTx on the same
// key waits for it to commit or roll back.
func DoTx[T any, TX any](ctx context.Context, c *Client, tx TX, in Intent, fn func(context.Context, TX, Attempt) (T, error)) (Result[T], error) {
	if c == nil {
		return Result[T]{}, errors.New("once: DoTx called with a nil *Client; build one with once.New")
	}
	if fn == nil {
		return Result[T]{}, errors.New("once: DoTx called with a nil effect function")
	}
	binder, ok := c.store.(TxBinder)
	if !ok {
		return Result[T]{}, fmt.Errorf("once: DoTx: store %T cannot join a caller's transaction", c.store)
	}
	req, pol, err := c.prepare(in)
	if err != nil {
		return Result[T]{}, err
	}
	store, err := binder.BindTx(tx)
	if err != nil {
		return Result[T]{}, err
	}
	cr, err := c.claim(ctx, store, req)
	if err != nil {
		return Result[T]{}, err
	}
	if !cr.Claimed {
		// Recovery needs a transaction of its own; inside the caller's
		// it only answers.
		return answer[T](ctx, c, pol, in, req, cr, nil)
	}
	a := cr.Action
	att := Attempt{Key: a.Key, Number: a.Attempt, ProviderKey: string(a.Key), Intent: in}
	runCtx, cancel := context.WithTimeout(ctx, pol.MaxExecution)
	value, ferr := fn(runCtx, tx, att)
	cancel()
	if ferr != nil {
		return Result[T]{}, fmt.Errorf("once: action %s: the effect failed inside the transaction, roll it back: %w", a.Key, ferr)
	}
	result, rerr := c.encodeResult(value)
	if rerr != nil {
		return Result[T]{}, fmt.Errorf("once: action %s: %w; roll the transaction back", a.Key, rerr)
	}
	ok, err = store.Transition(ctx, Transition{Key: a.Key, Attempt: a.Attempt, From: []Status{StatusInFlight}, To: StatusSucceeded, Result: result,
		Event: Event{Type: EventSucceeded, From: StatusInFlight, Actor: "worker"}})
	if err != nil {
		return Result[T]{}, fmt.Errorf("once: action %s: recording the result in the transaction: %w", a.Key, err)
	}
	if !ok {
		return Result[T]{}, &FencedError{Key: a.Key, Attempt: a.Attempt, Outcome: StatusSucceeded}
	}
	return Result[T]{Value: value, Key: a.Key, Attempt: a.Attempt}, nil
}

// claim asks the store for the key. A released row whose fingerprint
// matches is claimed by the store itself; the loop only covers the rare
// read that saw a row between its release and its next claim.
func (c *Client) claim(ctx context.Context, s Store, req ClaimRequest) (ClaimResult, error) {
	for range 3 {
		cr, err := s.Claim(ctx, req)
		if err != nil {
			return ClaimResult{}, fmt.Errorf("once: claiming action %s (%s): %w", req.Key, req.Kind, err)
		}
		if cr.Claimed || cr.Action.Status != StatusReleased || cr.Action.Fingerprint != req.Fingerprint {
			return cr, nil
		}
	}
	return ClaimResult{}, fmt.Errorf("once: claiming action %s: the row kept changing under the claim; try again", req.Key)
}

// answer serves a caller that did not win the claim, from the standing
// row: a replay, a stored failure, an in-flight conflict, or, when the
// standing attempt's outcome is unknown and due for recovery, the kind's
// recovery applied right here, so it does not wait for the reaper.
func answer[T any](ctx context.Context, c *Client, pol KindPolicy, in Intent, req ClaimRequest, cr ClaimResult, fn func(context.Context, Attempt) (T, error)) (Result[T], error) {
	a := cr.Action
	if a.Fingerprint != req.Fingerprint {
		c.log.Warn("once: payload differs from the first attempt; refused", "key", a.Key, "kind", a.Kind)
		c.emit(ctx, Observation{Event: Event{Key: a.Key, Type: EventFingerprintMismatch, Attempt: a.Attempt, From: a.Status}, Kind: a.Kind})
		return Result[T]{}, &FingerprintError{Key: a.Key, Stored: a.Fingerprint, Got: req.Fingerprint}
	}
	due := (a.Status == StatusInFlight || a.Status == StatusUnknown) && !a.LeaseUntil.After(cr.Now)
	if due && fn != nil {
		return recoverInline(ctx, c, pol, in, req, a, fn)
	}
	return replay[T](ctx, c, a, cr.Now)
}

// replay answers from a row without acting on it.
func replay[T any](ctx context.Context, c *Client, a Action, now time.Time) (Result[T], error) {
	switch a.Status {
	case StatusSucceeded:
		var v T
		if len(a.Result) > 0 {
			if err := json.Unmarshal(a.Result, &v); err != nil {
				return Result[T]{}, fmt.Errorf("once: action %s succeeded but its stored result does not decode into %T: %w; decode it with the type the first attempt returned", a.Key, v, err)
			}
		}
		c.log.Debug("once: replayed", "key", a.Key, "kind", a.Kind, "attempt", a.Attempt)
		c.emit(ctx, Observation{Event: Event{Key: a.Key, Type: EventReplayed, Attempt: a.Attempt, From: a.Status}, Kind: a.Kind})
		return Result[T]{Value: v, Key: a.Key, Attempt: a.Attempt, Replayed: true}, nil
	case StatusFailed:
		c.emit(ctx, Observation{Event: Event{Key: a.Key, Type: EventReplayed, Attempt: a.Attempt, From: a.Status}, Kind: a.Kind})
		return Result[T]{}, &FailedError{Key: a.Key, Attempt: a.Attempt, Message: a.Error, Replayed: true}
	case StatusInFlight:
		c.emit(ctx, Observation{Event: Event{Key: a.Key, Type: EventConflict, Attempt: a.Attempt, From: a.Status}, Kind: a.Kind})
		return Result[T]{}, &InFlightError{Key: a.Key, Attempt: a.Attempt, ClaimedAt: a.ClaimedAt, LeaseUntil: a.LeaseUntil, Expired: !a.LeaseUntil.After(now)}
	case StatusUnknown:
		return Result[T]{}, &UnknownOutcomeError{Key: a.Key, Attempt: a.Attempt, Message: a.Error, Status: StatusUnknown}
	case StatusReleased:
		// Released between this caller's read and now (a person chose
		// Retry, or recovery released it): the next delivery runs it.
		return Result[T]{}, fmt.Errorf("once: action %s was released for another attempt: %w", a.Key, ErrRetryLater)
	case StatusReview:
		return Result[T]{}, &ReviewError{Key: a.Key, Attempt: a.Attempt, Reason: a.Error}
	default:
		return Result[T]{}, fmt.Errorf("once: action %s has status %q, which this version does not know; upgrade", a.Key, a.Status)
	}
}

// execute runs the effect of a won claim and records its outcome.
func execute[T any](ctx context.Context, c *Client, pol KindPolicy, in Intent, a Action, fn func(context.Context, Attempt) (T, error)) (Result[T], error) {
	att := Attempt{Key: a.Key, Number: a.Attempt, ProviderKey: string(a.Key), Intent: in}
	c.log.Debug("once: claimed", "key", a.Key, "kind", a.Kind, "attempt", a.Attempt)
	c.emit(ctx, Observation{Event: Event{Key: a.Key, Type: EventClaimed, Attempt: a.Attempt, To: StatusInFlight, Actor: "worker"}, Kind: a.Kind})

	runCtx, cancel := context.WithCancelCause(ctx)
	runCtx, cancelTimeout := context.WithTimeout(runCtx, pol.MaxExecution)
	// The heartbeat outlives the effect's deadline and the caller's
	// context: an effect that ignores its context may still be running,
	// and its claim must hold until it returns.
	stopHeartbeat := c.heartbeat(context.WithoutCancel(ctx), cancel, a, pol.Lease)
	started := time.Now()

	var value T
	var ferr error
	panicked := true
	func() {
		defer func() {
			if !panicked {
				return
			}
			// The effect panicked: it may have happened. Record that
			// honestly before the panic goes on up the stack.
			p := recover()
			stopHeartbeat()
			cancelTimeout()
			cancel(nil)
			t := c.unknownOutcome(pol, a, fmt.Sprintf("panic: %v", p))
			if ok, err := c.record(ctx, a, t); err == nil && ok {
				c.emit(ctx, Observation{Event: t.Event, Kind: a.Kind, Duration: time.Since(started)})
			}
			if p != nil { // nil: runtime.Goexit, which goes on by itself
				panic(p)
			}
		}()
		value, ferr = fn(runCtx, att)
		panicked = false
	}()
	took := time.Since(started)
	stopHeartbeat()
	cancelTimeout()
	cancel(nil)

	var t Transition
	var resultErr error
	switch classify(ferr) {
	case StatusSucceeded:
		// A slow worker whose claim was put up for review may still say
		// how it ended: the outcome became known. A newer attempt fences
		// it out through the attempt number.
		t = Transition{To: StatusSucceeded, From: []Status{StatusInFlight, StatusReview}, Event: Event{Type: EventSucceeded}}
		t.Result, resultErr = c.encodeResult(value)
		if resultErr != nil {
			t = Transition{To: StatusReview, From: []Status{StatusInFlight}, Error: "the effect succeeded but " + resultErr.Error(), Event: Event{Type: EventReview}}
		}
	case StatusReleased:
		t = Transition{To: StatusReleased, From: []Status{StatusInFlight}, Error: ferr.Error(), Event: Event{Type: EventReleased}}
	case StatusFailed:
		t = Transition{To: StatusFailed, From: []Status{StatusInFlight}, Error: ferr.Error(), Event: Event{Type: EventFailed}}
	default:
		t = c.unknownOutcome(pol, a, ferr.Error())
	}
	t.Key, t.Attempt = a.Key, a.Attempt
	t.Event.Key, t.Event.Attempt, t.Event.From, t.Event.To, t.Event.Actor = a.Key, a.Attempt, StatusInFlight, t.To, "worker"
	if t.Event.Note == "" {
		t.Event.Note = t.Error
	}

	ok, err := c.record(ctx, a, t)
	if err != nil {
		return Result[T]{Value: value, Key: a.Key, Attempt: a.Attempt}, &RecordError{Key: a.Key, Attempt: a.Attempt, Outcome: t.To, Err: err}
	}
	if !ok {
		// Superseded: say so in the trail, so an operator sees the late
		// outcome beside whatever won.
		c.log.Warn("once: attempt superseded; outcome not recorded", "key", a.Key, "kind", a.Kind, "attempt", a.Attempt, "outcome", t.To)
		refused := Event{Key: a.Key, Type: EventRefused, Attempt: a.Attempt, To: t.To, Actor: "worker",
			Note: fmt.Sprintf("late outcome of attempt %d (%s) refused: the action had moved on", a.Attempt, t.To)}
		if err := c.store.AppendEvent(context.WithoutCancel(ctx), refused); err != nil {
			c.log.Warn("once: could not record a refused outcome", "key", a.Key, "err", err)
		}
		c.emit(ctx, Observation{Event: refused, Kind: a.Kind, Duration: took})
		return Result[T]{Value: value, Key: a.Key, Attempt: a.Attempt}, &FencedError{Key: a.Key, Attempt: a.Attempt, Outcome: t.To}
	}
	c.emit(ctx, Observation{Event: t.Event, Kind: a.Kind, Duration: took})
	switch {
	case t.To == StatusSucceeded:
		return Result[T]{Value: value, Key: a.Key, Attempt: a.Attempt}, nil
	case resultErr != nil:
		c.log.Warn("once: result not stored; action put up for review", "key", a.Key, "kind", a.Kind, "err", resultErr)
		return Result[T]{Value: value, Key: a.Key, Attempt: a.Attempt}, fmt.Errorf("once: action %s: %w; it was put up for review", a.Key, resultErr)
	case t.To == StatusReleased && classify(ferr) == StatusReleased:
		return Result[T]{}, fmt.Errorf("once: action %s attempt %d released: %w", a.Key, a.Attempt, ferr)
	case t.To == StatusFailed:
		return Result[T]{}, &FailedError{Key: a.Key, Attempt: a.Attempt, Message: t.Error, err: ferr}
	default:
		c.log.Warn("once: outcome unknown", "key", a.Key, "kind", a.Kind, "attempt", a.Attempt, "recovery", pol.Recovery, "err", ferr)
		return Result[T]{}, &UnknownOutcomeError{Key: a.Key, Attempt: a.Attempt, Message: ferr.Error(), Status: t.To, err: ferr}
	}
}

// unknownOutcome is the transition for an effect whose outcome is
// unknown, by the kind's recovery: a person is asked at once, a
// provider-idempotent effect is released for the next delivery, and a
// verifiable one is left due for verification right away.
func (c *Client) unknownOutcome(pol KindPolicy, a Action, msg string) Transition {
	t := Transition{Key: a.Key, Attempt: a.Attempt, From: []Status{StatusInFlight}, Error: msg,
		Event: Event{From: StatusInFlight, Actor: "worker", Note: "outcome unknown: " + msg}}
	switch pol.Recovery {
	case RetryWithProviderKey:
		t.To, t.Event.Type = StatusReleased, EventReleased
	case VerifyThenDecide:
		t.To, t.Event.Type, t.Lease = StatusUnknown, EventUnknown, time.Millisecond
	default:
		t.To, t.Event.Type = StatusReview, EventReview
	}
	return t
}

// encodeResult encodes an effect's value for storage, within the cap.
func (c *Client) encodeResult(v any) (json.RawMessage, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("%w: its result cannot be encoded as JSON: %v", ErrResultTooLarge, err)
	}
	if len(b) > c.maxResult {
		return nil, fmt.Errorf("%w: its result is %d bytes, over Config.MaxResultBytes (%d); return a smaller value (an id, not a document)", ErrResultTooLarge, len(b), c.maxResult)
	}
	return b, nil
}

// record writes an outcome, retrying while the database is unreachable.
// It runs on a context detached from the caller's: an effect that
// happened must be recorded even if the caller has given up waiting.
// It reports false when the attempt was fenced out.
func (c *Client) record(ctx context.Context, a Action, t Transition) (bool, error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.recordTimeout)
	defer cancel()
	backoff := 20 * time.Millisecond
	var lastErr error
	for {
		ok, err := c.store.Transition(rctx, t)
		if err == nil {
			if !ok && lastErr != nil {
				// An earlier try may have committed and lost its reply.
				if cur, gerr := c.store.Get(rctx, t.Key); gerr == nil && cur.Attempt == t.Attempt && cur.Status == t.To {
					return true, nil
				}
			}
			return ok, nil
		}
		lastErr = err
		c.log.Warn("once: recording outcome failed; retrying", "key", a.Key, "outcome", t.To, "err", err)
		select {
		case <-rctx.Done():
			return false, fmt.Errorf("gave up after %v: %w", c.recordTimeout, lastErr)
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 2*time.Second)
	}
}

// heartbeat extends the attempt's lease every lease/3 while the effect
// runs. If the claim is lost (a newer attempt took over), or no heartbeat
// has got through for a whole lease (so recovery may take over), it
// cancels the effect's context with a *FencedError as the cause. The
// returned func stops it and waits.
func (c *Client) heartbeat(ctx context.Context, cancel context.CancelCauseFunc, a Action, lease time.Duration) (stop func()) {
	hbCtx, hbCancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(lease / 3)
		defer tick.Stop()
		lastHeld := time.Now() // the claim's own lease started about now
		for {
			select {
			case <-hbCtx.Done():
				return
			case <-tick.C:
			}
			_, held, err := c.store.Heartbeat(hbCtx, a.Key, a.Attempt, lease)
			switch {
			case err != nil:
				if hbCtx.Err() != nil {
					return
				}
				c.log.Warn("once: heartbeat failed; the lease may expire", "key", a.Key, "attempt", a.Attempt, "err", err)
				if time.Since(lastHeld) >= lease {
					c.log.Warn("once: no heartbeat for a whole lease; stopping the effect", "key", a.Key, "attempt", a.Attempt)
					cancel(&FencedError{Key: a.Key, Attempt: a.Attempt, Outcome: StatusInFlight})
					return
				}
			case held:
				lastHeld = time.Now()
			default:
				c.log.Warn("once: claim lost while the effect ran", "key", a.Key, "attempt", a.Attempt)
				cancel(&FencedError{Key: a.Key, Attempt: a.Attempt, Outcome: StatusInFlight})
				return
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			hbCancel()
			wg.Wait()
		})
	}
}
