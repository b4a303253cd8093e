package once

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
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

	// noter writes Note for an attempt run by Do; nil otherwise.
	noter *noter
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
	// an earlier attempt had already succeeded (or a verifier found that
	// it had).
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
//   - any other error, a panic, or a timeout: the outcome is unknown, and
//     the kind's recovery decides, never a guess: AskPerson puts it up for
//     review, RetryWithProviderKey releases it for the next delivery
//     (which runs it again with the same provider key), and
//     VerifyThenDecide leaves it unknown until its verifier is asked. A
//     panic goes on up the stack once recorded; the third attempt of one
//     action to panic is put up for review under RetryWithProviderKey
//     too, since another would most likely panic again.
//
// fn's context is cancelled at the kind's MaxExecution, when the claim is
// lost, and when ctx is. A cancellation it returns as a plain error is an
// unknown outcome like any other (by default a person reviews it): on a
// graceful shutdown, an effect that knows it sent nothing should return
// RetryLater(ctx.Err()) instead, so the next delivery runs it.
//
// A caller that meets a claim held by another attempt gets an
// *InFlightError and should return its job to the queue. A caller whose
// payload differs from the first attempt's gets a *FingerprintError.
// Neither runs fn.
//
// With WaitFor(d), a caller that meets a live claim waits up to d for
// that attempt's outcome instead: its result replayed, its permanent
// failure, or, when it was released, a claim of the caller's own. Wait
// where someone is waiting for the answer itself and nobody will bring
// the job back: an HTTP handler (idemhttp.Config.Wait), an agent's tool
// call. A queue worker should rarely wait long: it holds a delivery (and
// the broker's ack timer runs) while a redelivery after the lease would
// serve as well; a short wait, well under its ack wait, spares a round
// trip through the queue when duplicates arrive together.
//
// Do returns the effect's value together with an error when the effect
// ran but its outcome could not be stored as it happened. The value is
// real: act on it, but do not run the effect again.
//   - *RecordError (ErrNotRecorded): the database was unreachable for
//     Config.RecordTimeout; the claim stays in flight and recovery decides
//     when its lease runs out.
//   - *FencedError (ErrFenced): the attempt was superseded while it ran
//     (its lease lapsed and recovery moved on); the trail shows the late
//     outcome beside the decision.
//   - ErrResultTooLarge or ErrResultNotJSON: the effect happened but its
//     value cannot be stored; the action was put up for review.
func Do[T any](ctx context.Context, c *Client, in Intent, fn func(context.Context, Attempt) (T, error), opts ...DoOption) (Result[T], error) {
	if c == nil {
		return Result[T]{}, errors.New("once: Do called with a nil *Client; build one with once.New")
	}
	if fn == nil {
		return Result[T]{}, errors.New("once: Do called with a nil effect function")
	}
	o, err := optionsOf(opts)
	if err != nil {
		return Result[T]{}, err
	}
	return finish[T](c.do(ctx, in, effectOf[T](fn), o))
}

// DoTx is Do inside the caller's transaction, for effects that are writes
// to the same database: the claim, the effect and the record commit or
// roll back together, so there is no window in which the effect happened
// but was not recorded. store is the client's store, which binds tx (a
// pgx.Tx for the postgres store, a *sql.Tx for the sqlite store): a
// transaction of the wrong type does not compile. fn receives tx back.
//
// When fn returns an error nothing is recorded and the error is returned:
// roll the transaction back. There is no lease or heartbeat; the
// transaction itself holds the claim, and a concurrent DoTx on the same
// key waits for it to commit or roll back. Hooks see the claim and the
// outcome as Do's, before the caller commits.
//
// WaitFor makes DoTx wait, as Do does, for a claim a Do holds. The
// caller's transaction stays open (and holds its connection) meanwhile,
// and must be READ COMMITTED to see the outcome when it lands; in
// another isolation level DoTx answers at once, saying so. The
// sqlite store cannot wait inside a transaction, whose write lock is
// what the other attempt needs to record its outcome: there DoTx
// answers at once, saying so.
func DoTx[T any, TX any](ctx context.Context, c *Client, store TxBinder[TX], tx TX, in Intent, fn func(context.Context, TX, Attempt) (T, error), opts ...DoOption) (Result[T], error) {
	switch {
	case c == nil:
		return Result[T]{}, errors.New("once: DoTx called with a nil *Client; build one with once.New")
	case fn == nil:
		return Result[T]{}, errors.New("once: DoTx called with a nil effect function")
	case store == nil || Store(store) != c.store:
		return Result[T]{}, fmt.Errorf("once: DoTx: the store that binds the transaction (%T) is not the client's store; pass the store the client was made with", store)
	}
	opt, err := optionsOf(opts)
	if err != nil {
		return Result[T]{}, err
	}
	req, pol, err := c.prepare(in)
	if err != nil {
		return Result[T]{}, err
	}
	s := store.BindTx(tx)
	w := c.waiting(opt)
	var cr ClaimResult
	for {
		cr, err = c.claim(ctx, s, req, nil)
		if err != nil {
			return Result[T]{}, err
		}
		if cr.Claimed {
			break
		}
		var stop error
		if live(cr, req) {
			var again bool
			again, stop = w.wait(ctx, s, cr.Action, cr.Action.Kind, cr.Action.LeaseUntil.Sub(cr.Now))
			if again {
				continue
			}
		}
		// Recovery needs a transaction of its own; inside the caller's
		// it only answers.
		return finish[T](w.finish(c.answer(ctx, req, cr), stop))
	}
	a := cr.Action
	ctx, end := c.started(ctx, a)
	runCtx, cancel := context.WithTimeout(ctx, pol.MaxExecution)
	started := time.Now()
	returned := false
	defer func() {
		cancel()
		if !returned {
			// A panic (or runtime.Goexit) inside the transaction: nothing
			// was recorded, and the caller's deferred rollback undoes the
			// claim. Settle the hooks before the panic goes on.
			p := recover()
			end(Observation{Event: Event{Key: a.Key, Attempt: a.Attempt, From: StatusInFlight, Actor: ActorWorker}, Kind: a.Kind, Duration: time.Since(started)},
				fmt.Errorf("once: action %s: the effect panicked inside the transaction, roll it back: %v", a.Key, p))
			if p != nil {
				panic(p)
			}
		}
	}()
	value, ferr := fn(runCtx, tx, attemptOf(a, in))
	returned = true
	took := time.Since(started)
	if ferr != nil {
		err := fmt.Errorf("once: action %s: the effect failed inside the transaction, roll it back: %w", a.Key, ferr)
		end(Observation{Event: Event{Key: a.Key, Attempt: a.Attempt, From: StatusInFlight, Actor: ActorWorker}, Kind: a.Kind, Duration: took}, err)
		return Result[T]{}, err
	}
	t, resultErr := outcomeTransition(pol, c.maxResult, a, value, nil)
	if resultErr != nil {
		err := fmt.Errorf("once: action %s: %w; roll the transaction back", a.Key, resultErr)
		end(Observation{Event: Event{Key: a.Key, Attempt: a.Attempt, From: StatusInFlight, Actor: ActorWorker}, Kind: a.Kind, Duration: took}, err)
		return Result[T]{}, err
	}
	ok, err := s.Transition(ctx, storableTransition(c.stamp(t)))
	switch {
	case err != nil:
		err = fmt.Errorf("once: action %s: recording the result in the transaction: %w", a.Key, err)
	case !ok:
		err = &FencedError{Key: a.Key, Attempt: a.Attempt, Outcome: StatusSucceeded}
	}
	o := Observation{Event: t.Event, Kind: a.Kind, Duration: took}
	if err == nil {
		c.emit(ctx, o)
	}
	end(o, err)
	if err != nil {
		return Result[T]{}, err
	}
	return Result[T]{Value: value, Key: a.Key, Attempt: a.Attempt}, nil
}

// effect is an effect function with its type parameter dropped: the
// protocol below is one non-generic loop, and T meets JSON only in finish.
// It is an interface, not a func, so that Do passes fn along without
// allocating a closure around it.
type effect interface {
	run(context.Context, Attempt) (any, error)
}

// effectOf is Do's effect function as an effect.
type effectOf[T any] func(context.Context, Attempt) (T, error)

func (f effectOf[T]) run(ctx context.Context, a Attempt) (any, error) { return f(ctx, a) }

// outcome is what one call of the protocol came to.
type outcome struct {
	key     Key
	attempt int
	// ran is true when the effect ran in this call; value is what it
	// returned.
	ran   bool
	value any
	// stored is a result read back from the store (a replay, or what a
	// verifier found), decoded into T by finish.
	stored   json.RawMessage
	replayed bool
	err      error
}

// finish is the one place where T meets JSON: it turns an outcome into
// Do's return values.
func finish[T any](o outcome) (Result[T], error) {
	r := Result[T]{Key: o.key, Attempt: o.attempt, Replayed: o.replayed}
	if o.ran {
		if v, ok := o.value.(T); ok {
			r.Value = v
		}
		return r, o.err
	}
	if o.err != nil {
		return Result[T]{}, o.err
	}
	if len(o.stored) > 0 {
		v, err := decodeStored[T](o.stored)
		if err != nil {
			// The effect happened: a retry would fail the same way on
			// every delivery, so the error is one Dispose settles
			// (TestStore.../UndecodableResultSettles).
			return r, &DecodeError{Key: o.key, Attempt: o.attempt, Type: reflect.TypeFor[T]().String(), Result: o.stored, err: err}
		}
		r.Value = v
	}
	return r, nil
}

// decodeStored decodes a stored result. It is apart from finish so that
// the value it decodes into, which escapes, is allocated only for a
// replay.
func decodeStored[T any](raw json.RawMessage) (T, error) {
	var v T
	err := json.Unmarshal(raw, &v)
	return v, err
}

// do is the protocol: claim, then execute, refuse, replay, or recover the
// standing attempt once and go round again.
func (c *Client) do(ctx context.Context, in Intent, fn effect, o doOptions) outcome {
	req, pol, err := c.prepare(in)
	if err != nil {
		return outcome{err: err}
	}
	w := c.waiting(o)
	recovered := false
	var pending pendingClaims
	for {
		// The lease counts from when the claim was sent: the database
		// starts it later than that, never sooner.
		sent := time.Now()
		cr, err := c.claim(ctx, c.store, req, &pending)
		if err != nil {
			var held *InFlightError
			if errors.As(err, &held) && held.InTransaction {
				// Wait for the row as it was visible (none, or
				// released) to change (the transaction commits), then
				// claim again. A rollback changes nothing a read can
				// see, so claim again every ClaimTimeout too: the claim
				// waits on the transaction while it is open, and takes
				// the key once it has rolled back.
				seen := Action{Key: req.Key, Status: cr.Action.Status, Attempt: cr.Action.Attempt}
				again, stop := w.wait(ctx, c.store, seen, req.Kind, c.claimTimeout)
				if again {
					continue
				}
				return w.finish(outcome{key: req.Key, err: err}, stop)
			}
			return outcome{err: err}
		}
		if cr.Claimed {
			if at, ok := pending.sent(cr.Action.Token); ok {
				sent = at
			}
			if cr.Action.Attempt > 1 {
				var o outcome
				var decided bool
				if o, sent, decided = c.verifyReleased(ctx, pol, cr.Action, sent); decided {
					return o
				}
			}
			return c.execute(ctx, pol, in, cr.Action, fn, sent, false)
		}
		a := cr.Action
		due := (a.Status == StatusInFlight || a.Status == StatusUnknown) && !a.LeaseUntil.After(cr.Now)
		if recovered || !due || a.Fingerprint != req.Fingerprint {
			var stop error
			if live(cr, req) {
				var again bool
				again, stop = w.wait(ctx, c.store, a, a.Kind, a.LeaseUntil.Sub(cr.Now))
				if again {
					// A new round: whatever stands now, including a
					// lease that ran out meanwhile, is met afresh.
					recovered = false
					continue
				}
			}
			return w.finish(c.answer(ctx, req, cr), stop)
		}
		// The standing attempt's outcome is unknown and due: apply the
		// kind's recovery here, so the worker that meets a dead claim
		// does not wait for the reaper.
		recovered = true
		sent = time.Now()
		r, err := c.recoverKey(ctx, pol, a.Key)
		if err != nil {
			return outcome{err: err}
		}
		switch r.decision {
		case decTakeover:
			return c.execute(ctx, pol, in, r.action, fn, sent, true)
		case decSucceeded:
			return outcome{key: a.Key, attempt: r.action.Attempt, stored: r.result, replayed: true}
		}
		// Anything else (put up for review, released, moved on under
		// us): claim again; a release is claimed by this caller, and any
		// other row is answered as it stands, without recovering again.
	}
}

// pendingClaims are the claims of one call that failed without the
// read-back finding them applied. A claim the client gave up on may
// still be running on the server (waiting on another transaction's lock,
// its cancellation lost) and commit later, under its token: a call that
// waits may meet it.
type pendingClaims map[string]time.Time

// add records a claim sent at sent with token.
func (p *pendingClaims) add(token string, sent time.Time) {
	if *p == nil {
		*p = make(pendingClaims)
	}
	(*p)[token] = sent
}

// sent reports when the claim that wrote token was sent, if it was one
// of these.
func (p *pendingClaims) sent(token string) (time.Time, bool) {
	if p == nil || token == "" {
		return time.Time{}, false
	}
	at, ok := (*p)[token]
	return at, ok
}

// claim asks the store for the key. A released row whose fingerprint
// matches is claimed by the store itself; the loop covers the rare read
// that saw a row between its release and its next claim, and one more
// try after a try that failed while the database still answers.
//
// Each try carries a fresh token. When a try fails, its reply may have
// been lost after the database committed it: the row is read back, and
// if it carries the token the claim is this caller's, and the effect
// runs (or is released) instead of waiting for a lease to lapse and a
// person to be asked about an effect that never started. A try whose
// row was not found may yet commit; pending keeps its token, so a later
// claim of the same call, or a later read-back, that meets it in flight
// takes it as its own.
// Inside a caller's transaction (s is not the client's store) there is
// nothing to read back: the transaction failed as a whole.
func (c *Client) claim(ctx context.Context, s Store, req ClaimRequest, pending *pendingClaims) (ClaimResult, error) {
	// resent says the claim was sent again after a failed try; waited,
	// that a try ran out of ClaimTimeout with its claim not visible.
	resent, waited := false, false
	for range 3 {
		req.Token = newToken()
		sent := time.Now()
		cctx, cancel := ctx, context.CancelFunc(func() {})
		if s == c.store {
			cctx, cancel = context.WithTimeout(ctx, c.claimTimeout)
		}
		cr, err := s.Claim(cctx, req)
		timedOut := cctx.Err() != nil && ctx.Err() == nil
		cancel()
		if err != nil {
			if s == c.store {
				a, ok, known := c.wrote(ctx, req.Key, req.Token, c.claimTimeout)
				if !ok && pending != nil {
					pending.add(req.Token, sent)
				}
				// The row may carry this try's token, or an earlier
				// try's of this call that committed late: either way
				// the claim is this call's, and nobody else runs it
				// (TestResendTakesTheLateFirstClaimAsItsOwn).
				_, earlier := pending.sent(a.Token)
				waited = waited || timedOut
				switch {
				case (ok || earlier) && a.Status == StatusInFlight:
					c.log.Warn("once: the claim's reply was lost; it was ours", "key", req.Key, "kind", req.Kind, "err", err)
					return ClaimResult{Claimed: true, Action: a}, nil
				case known && !ok && !resent && ctx.Err() == nil && !errors.Is(err, ErrRejected):
					// The database answered the read-back, on another
					// connection, and the claim is not in the row: what
					// failed was the claim's connection (one the server
					// or a network closed while the pool held it idle),
					// or a transaction holds the key. Claim once more,
					// with a new token: should the failed try still
					// commit, its token (pending) makes its row this
					// call's own, and its effect runs once
					// (TestIdleConnectionTerminatedDoClaimsAgain,
					// TestIdleBlackholedConnectionClaimsAgain).
					c.log.Warn("once: the claim failed; the database answers, claiming again", "key", req.Key, "kind", req.Kind, "err", err)
					c.emit(ctx, Observation{Event: Event{Key: req.Key, Type: EventClaimResent, Attempt: a.Attempt, From: a.Status, At: time.Now()}, Kind: req.Kind})
					resent = true
					continue
				case !known:
					// Neither the claim nor the read after it was
					// answered: nothing is known of the row, and no
					// transaction is known to hold the key
					// (TestBlackholedClaimSaysTheStoreIsUnreachable).
					return ClaimResult{}, &unavailableError{key: req.Key, kind: req.Kind, patience: c.claimTimeout, err: err}
				case waited && (a.Key == "" || a.Status == StatusReleased):
					// A try waited, and no row is visible or the one
					// visible is released: another transaction (a DoTx
					// not yet committed) holds the key, claiming it or
					// claiming it again, or holds the database's write
					// lock; also when the resend after it failed
					// otherwise (TestResendOnDeadConnectionStillWaitsForTheTransaction).
					// What is visible comes back with the error, for a
					// caller that waits to watch.
					return ClaimResult{Action: a}, &InFlightError{Key: req.Key, Attempt: a.Attempt, InTransaction: true}
				}
			}
			return ClaimResult{}, fmt.Errorf("once: claiming action %s (%s): %w", req.Key, req.Kind, err)
		}
		if !cr.Claimed && cr.Action.Status == StatusInFlight {
			if _, mine := pending.sent(cr.Action.Token); mine {
				// Nothing else writes this token: the row is still
				// at the claim this call gave up on, and nobody runs it.
				c.log.Warn("once: a claim given up on committed later; it is ours", "key", req.Key, "kind", req.Kind, "attempt", cr.Action.Attempt)
				cr.Claimed = true
				return cr, nil
			}
		}
		if cr.Claimed || cr.Action.Status != StatusReleased || cr.Action.Fingerprint != req.Fingerprint {
			return cr, nil
		}
	}
	return ClaimResult{}, fmt.Errorf("once: claiming action %s: the row kept changing under the claim; try again", req.Key)
}

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

// transition applies t, and when its reply is lost reads the row back to
// tell whether it applied: a decision or a resolution that committed is
// reported applied, not failed or refused.
func (c *Client) transition(ctx context.Context, t Transition) (bool, error) {
	t = storableTransition(c.stamp(t))
	if t.Token == "" {
		t.Token = newToken()
	}
	cctx, cancel := c.call(ctx)
	ok, err := c.store.Transition(cctx, t)
	cancel()
	if err != nil {
		if _, mine, _ := c.wrote(ctx, t.Key, t.Token, c.recordTimeout); mine {
			return true, nil
		}
	}
	return ok, err
}

// answer serves a caller that did not win the claim from the standing
// row, without acting on it: a refusal of a different payload, a replay,
// a stored failure, or the state that keeps it from running.
func (c *Client) answer(ctx context.Context, req ClaimRequest, cr ClaimResult) outcome {
	a := cr.Action
	o := outcome{key: a.Key, attempt: a.Attempt}
	observe := func(t EventType) {
		c.emit(ctx, Observation{Event: Event{Key: a.Key, Type: t, Attempt: a.Attempt, From: a.Status}, Kind: a.Kind})
	}
	if a.Fingerprint != req.Fingerprint {
		c.log.Warn("once: payload differs from the first attempt; refused", "key", a.Key, "kind", a.Kind)
		observe(EventFingerprintMismatch)
		o.err = &FingerprintError{Key: a.Key, Stored: a.Fingerprint, Got: req.Fingerprint}
		return o
	}
	switch a.Status {
	case StatusSucceeded:
		if c.log.Enabled(ctx, slog.LevelDebug) {
			c.log.Debug("once: replayed", "key", a.Key, "kind", a.Kind, "attempt", a.Attempt)
		}
		observe(EventReplayed)
		o.stored, o.replayed = a.Result, true
	case StatusFailed:
		observe(EventReplayed)
		o.err = &FailedError{Key: a.Key, Attempt: a.Attempt, Message: a.Error, Replayed: true}
	case StatusInFlight:
		observe(EventConflict)
		o.err = &InFlightError{Key: a.Key, Attempt: a.Attempt, ClaimedAt: a.ClaimedAt, LeaseUntil: a.LeaseUntil, Expired: !a.LeaseUntil.After(cr.Now)}
	case StatusUnknown:
		due := a.LeaseUntil
		if a.Recovery == VerifyThenDecide && !c.takesVerify(a.Kind) {
			// This process will not decide it (it knows nothing of the
			// kind); a delivery sent back at once would only loop. Come
			// back a lease from now.
			if later := cr.Now.Add(c.Policy(a.Kind).Lease); later.After(due) {
				due = later
			}
		}
		o.err = &UnknownOutcomeError{Key: a.Key, Attempt: a.Attempt, Message: a.Error, Status: StatusUnknown, Due: due}
	case StatusReleased:
		// Released between this caller's read and now (a person chose
		// Retry, or recovery released it): the next delivery runs it.
		o.err = fmt.Errorf("once: action %s was released for another attempt: %w", a.Key, ErrRetryLater)
	case StatusReview:
		o.err = &ReviewError{Key: a.Key, Attempt: a.Attempt, Reason: a.Error}
	default:
		o.err = fmt.Errorf("once: action %s has status %q, which this version does not know; upgrade", a.Key, a.Status)
	}
	return o
}

func attemptOf(a Action, in Intent) Attempt {
	return Attempt{Key: a.Key, Number: a.Attempt, ProviderKey: string(a.Key), Intent: in}
}

// execute runs the effect of a won claim and records its outcome. sent
// is when the claim's request was sent, where its lease starts for this
// process.
func (c *Client) execute(ctx context.Context, pol KindPolicy, in Intent, a Action, fn effect, sent time.Time, takeover bool) outcome {
	if c.log.Enabled(ctx, slog.LevelDebug) {
		// Checked first: the arguments would cost allocations on every
		// claim that nobody logs.
		c.log.Debug("once: claimed", "key", a.Key, "kind", a.Kind, "attempt", a.Attempt)
	}
	if err := ctx.Err(); err != nil {
		// The caller gave up while the claim was on its way (its reply
		// was slow, or lost and read back), or while a takeover was
		// decided: nothing ran.
		return c.abandon(ctx, pol, a, err, takeover)
	}
	ctx, end := c.started(ctx, a)
	unrun := func(o outcome) outcome {
		end(Observation{Event: Event{Key: a.Key, Attempt: a.Attempt, From: StatusInFlight, Actor: ActorWorker}, Kind: a.Kind, Recovery: pol.Recovery}, o.err)
		return o
	}
	sent, err := c.freshen(ctx, pol, a, sent)
	switch {
	case errors.Is(err, errNotRenewed):
		// Nothing ran, and the database, slow or out of reach, did not
		// renew the lease.
		return unrun(c.abandon(ctx, pol, a, err, takeover))
	case err != nil:
		return unrun(outcome{key: a.Key, attempt: a.Attempt, err: err})
	}
	started := time.Now()
	att := attemptOf(a, in)
	att.noter = &noter{c: c, lease: pol.storedLease(), key: a.Key, attempt: a.Attempt}
	settle := func(value any, err error) outcome {
		o, obs := c.settle(ctx, pol, a, value, err, att.noter.noted(), time.Since(started))
		end(obs, o.err)
		return o
	}
	value, err := c.run(ctx, pol, a, att, fn, sent, func(p any) {
		// The effect panicked (or called runtime.Goexit): it may have
		// happened. Record that honestly before the panic goes on.
		settle(nil, &panicked{p})
	})
	if errors.Is(err, errLeaseSpent) {
		// The process stalled between the claim and the effect for
		// longer than the lease allows: recovery may already be running
		// another attempt, so this one must not start. Nothing ran.
		return unrun(c.abandon(ctx, pol, a, err, takeover))
	}
	return settle(value, err)
}

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

// errLeaseSpent is run's answer when the lease ran out before the effect
// could start.
var errLeaseSpent = errors.New("the claim's lease ran out before the effect started")

// errNotRenewed is freshen's answer when the lease needed renewing
// before the effect could start, and the renewal failed.
var errNotRenewed = errors.New("too little of the claim's lease was left to start the effect on, and it could not be renewed")

// freshen renews the claim's lease before the effect starts when too
// little of it is left to run on: the claim's reply, a verifier before a
// takeover, or a hook held this process up. It returns when the lease
// now counts from. A claim found lost is a *FencedError; a renewal that
// fails (the database slow or out of reach) is errNotRenewed, and
// nothing runs.
func (c *Client) freshen(ctx context.Context, pol KindPolicy, a Action, sent time.Time) (time.Time, error) {
	if time.Until(sent.Add(pol.Lease-pol.margin())) >= pol.Lease/3 {
		return sent, nil
	}
	renewed := time.Now()
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pol.Lease/3)
	_, held, err := c.store.Heartbeat(hctx, a.Key, a.Attempt, pol.storedLease())
	cancel()
	switch {
	case err != nil:
		return sent, fmt.Errorf("%w: %w", errNotRenewed, err)
	case !held:
		return sent, &FencedError{Key: a.Key, Attempt: a.Attempt, Outcome: StatusInFlight}
	}
	return renewed, nil
}

// verifyReleased asks the kind's verifier, before the next attempt of a
// released action runs, whether an earlier attempt's effect landed. A
// release under VerifyThenDecide is the reaper's when its verifier found
// no trace of a dead claim; that answer is as old as the question, and a
// request still in the provider's queue then may have landed since. So
// the attempt that claims it asks again, as a worker that takes an action
// over asks just before it runs: landed, the attempt records the
// verifier's result and runs nothing (a result that cannot be stored
// goes to review, as in recovery); no trace, it runs
// (TestClient/ReleasedAfterNoTraceVerifiedAgain,
// .../ReleasedAfterNoTraceStillNoTrace). A verifier that cannot tell
// leaves the release's own answer standing, and the attempt runs, as
// before this question was asked: a person's Retry, or an effect that
// said it sent nothing, is not held up while the provider's lookup is
// down (.../ReleasedAfterNoTraceVerifierFails). The verifier is given
// what is left of the claim's lease, renewed first when less than a
// third of it is, since no heartbeat runs meanwhile. A
// process without the kind's verifier asks nothing. decided says the
// attempt must not run; o is the answer then. renewed is when the
// claim's lease now counts from.
func (c *Client) verifyReleased(ctx context.Context, pol KindPolicy, a Action, sent time.Time) (o outcome, renewed time.Time, decided bool) {
	recovery := pol.recoveryOf(a)
	if recovery != VerifyThenDecide || pol.Verifier == nil {
		return outcome{}, sent, false
	}
	// A claim whose reply was slow, or read back after it was lost, may
	// have little of its lease left: renewed first, the verifier has at
	// least a third of a lease to answer in, and is never asked with a
	// deadline already past (TestClient/ReleasedAfterNoTraceSlowClaimReply).
	sent, err := c.freshen(ctx, pol, a, sent)
	switch {
	case errors.Is(err, errNotRenewed):
		return c.abandon(ctx, pol, a, err, false), sent, true
	case err != nil:
		return outcome{key: a.Key, attempt: a.Attempt, err: err}, sent, true
	}
	// The verifier is asked about the action as it stood: released by
	// the attempt before this one.
	before := a
	before.Attempt, before.Status = a.Attempt-1, StatusReleased
	vctx, cancel := context.WithDeadline(ctx, sent.Add(min(pol.MaxExecution, pol.Lease-pol.margin())))
	started := time.Now()
	landed, result, err := safeVerify(vctx, pol.Verifier, before)
	cancel()
	took := time.Since(started)
	switch {
	case err == nil && landed:
		// An answer is kept, also when the caller left meanwhile
		// (TestClient/ReleasedAfterNoTraceLandedAsCallerLeaves).
	case ctx.Err() != nil:
		// The caller gave up while the verifier was asked, with no
		// answer: nothing ran.
		return c.abandon(ctx, pol, a, ctx.Err(), false), sent, true
	case err != nil:
		c.log.Warn("once: the verifier could not tell whether an earlier attempt of a released action landed; the next attempt runs on the release's answer",
			"key", a.Key, "kind", a.Kind, "attempt", a.Attempt, "err", err)
		return outcome{}, sent, false
	default:
		return outcome{}, sent, false
	}
	ev := Event{Key: a.Key, Type: EventVerified, Attempt: a.Attempt, From: StatusInFlight, To: StatusSucceeded, Actor: ActorWorker,
		Note: fmt.Sprintf("before attempt %d ran, the verifier found an earlier attempt's effect landed; attempt %d did not run", a.Attempt, a.Attempt)}
	t := Transition{Key: a.Key, Attempt: a.Attempt, From: fromInFlight, To: StatusSucceeded, Result: result}
	if why := c.unstorable(result); why != "" {
		t.To, t.Result, t.Error = StatusReview, nil, fmt.Sprintf("attempt %d did not run: the verifier says an earlier attempt's effect landed, but %s", a.Attempt, why)
		ev.Type, ev.To, ev.Note = EventReview, StatusReview, t.Error
	}
	t.Event = ev
	o = c.recordUnrun(ctx, recovery, a, t, errors.New("an earlier attempt's effect landed"), "recording what the verifier found", &took, func() error {
		if t.To == StatusReview {
			return &ReviewError{Key: a.Key, Attempt: a.Attempt, Reason: t.Error}
		}
		return nil
	})
	if o.err == nil {
		o.stored, o.replayed = result, true
	}
	return o, sent, true
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
// (TestFailedRenewalOfATakeoverAsksTheVerifierAgain,
// TestCallerGoneAfterATakeoverAsksTheVerifierAgain,
// TestAbandonedTakeoverTrailSaysNothingRan).
func (c *Client) abandon(ctx context.Context, pol KindPolicy, a Action, cause error, takeover bool) outcome {
	recovery := pol.recoveryOf(a)
	if !takeover || recovery != VerifyThenDecide {
		return c.releaseUnrun(ctx, pol, a, cause)
	}
	// The attempts before it that may have run are not all a.Attempt-1:
	// that one may be a takeover abandoned too.
	note := fmt.Sprintf("attempt %d, a takeover, never ran (%s); whether an earlier attempt's effect happened is still unknown, and the verifier is asked again",
		a.Attempt, unrunNote(cause))
	t := Transition{Key: a.Key, Attempt: a.Attempt, From: fromInFlight, To: StatusUnknown, Lease: time.Millisecond, Error: note,
		Event: Event{Key: a.Key, Type: EventUnknown, Attempt: a.Attempt, From: StatusInFlight, To: StatusUnknown, Actor: ActorWorker, Note: note}}
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
	ok, err := c.record(ctx, a, t)
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
	t := Transition{Key: a.Key, Attempt: a.Attempt, From: fromInFlight, To: StatusReleased, Error: note,
		Event: Event{Key: a.Key, Type: EventReleased, Attempt: a.Attempt, From: StatusInFlight, To: StatusReleased, Actor: ActorWorker, Note: note}}
	return c.recordUnrun(ctx, pol.Recovery, a, t, cause, "the release", nil, func() error {
		return fmt.Errorf("once: action %s attempt %d released unrun: %w (%w)", a.Key, a.Attempt, ErrRetryLater, cause)
	})
}

// run runs the effect under the kind's deadline while a heartbeat keeps
// the claim. If the effect does not return (a panic, runtime.Goexit),
// aborted is called before the panic goes on up the stack.
func (c *Client) run(ctx context.Context, pol KindPolicy, a Action, att Attempt, fn effect, sent time.Time, aborted func(p any)) (value any, err error) {
	runCtx, cancel := context.WithCancelCause(ctx)
	runCtx, cancelTimeout := context.WithTimeout(runCtx, pol.MaxExecution)
	hb := c.startHeartbeat(ctx, cancel, a, pol, sent)
	returned := false
	defer func() {
		hb.stop()
		cancelTimeout()
		cancel(nil)
		if returned {
			return
		}
		p := recover()
		aborted(p)
		if p != nil { // nil: runtime.Goexit, which goes on by itself
			panic(p)
		}
	}()
	if time.Since(sent) >= pol.Lease-pol.margin() {
		// Stalled since the lease was last renewed (a GC pause, a
		// stopped process): the timer has not fired yet, but the lease
		// is spent. Do not start.
		returned = true
		return nil, errLeaseSpent
	}
	value, err = fn.run(runCtx, att)
	returned = true
	return value, err
}

// fromInFlight is the From of a transition out of a claim. Stores only
// read it.
var fromInFlight = []Status{StatusInFlight}

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
		t = Transition{To: StatusSucceeded, From: fromInFlight, Event: Event{Type: EventSucceeded}}
		t.Result, resultErr = encodeResult(value, maxResult)
		if resultErr != nil {
			t = Transition{To: StatusReview, From: fromInFlight, Error: "the effect succeeded but " + resultErr.Error(), Event: Event{Type: EventReview}}
		}
	case StatusReleased:
		t = Transition{To: StatusReleased, From: fromInFlight, Error: err.Error(), Event: Event{Type: EventReleased}}
	case StatusFailed:
		t = Transition{To: StatusFailed, From: fromInFlight, Error: err.Error(), Event: Event{Type: EventFailed}}
	default:
		// Unknown: a person is asked at once, a provider-idempotent
		// effect is released for the next delivery, and a verifiable one
		// is left due for verification right away.
		t = Transition{From: fromInFlight, Error: err.Error(), Event: Event{Note: "outcome unknown: " + err.Error()}}
		switch pol.Recovery {
		case RetryWithProviderKey:
			t.To, t.Event.Type = StatusReleased, EventReleased
		case VerifyThenDecide:
			t.To, t.Event.Type, t.Lease = StatusUnknown, EventUnknown, time.Millisecond
		default:
			t.To, t.Event.Type = StatusReview, EventReview
		}
	}
	t.Key, t.Attempt = a.Key, a.Attempt
	t.Event.Key, t.Event.Attempt, t.Event.From, t.Event.To, t.Event.Actor = a.Key, a.Attempt, StatusInFlight, t.To, ActorWorker
	if t.Event.Note == "" {
		t.Event.Note = t.Error
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

// settle records what the effect returned and reports it: to the hooks,
// the log, and as the outcome Do returns.
func (c *Client) settle(ctx context.Context, pol KindPolicy, a Action, value any, ferr error, noted string, took time.Duration) (outcome, Observation) {
	t, resultErr := outcomeTransition(pol, c.maxResult, a, value, ferr)
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
			t.To, t.Event.Type = StatusReview, EventReview
			t.Error, t.Event.Note = why+"; "+t.Error, why+"; "+t.Event.Note
		}
	}
	o := outcome{key: a.Key, attempt: a.Attempt, ran: true, value: value}
	obs := Observation{Event: t.Event, Kind: a.Kind, Recovery: pol.Recovery, Duration: took}

	wanted := t.To
	t, ok, err := c.recordAs(ctx, a, t)
	obs.Event = t.Event
	if err == nil && ok && wanted == StatusSucceeded && t.To != StatusSucceeded {
		// The database refused the result; a placeholder put the
		// action up for review.
		resultErr = fmt.Errorf("%w: the database refused it", ErrResultNotJSON)
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
		o.err = &RecordError{Key: a.Key, Attempt: a.Attempt, Outcome: t.To, Err: err}
		return o, obs
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
		o.err = &FencedError{Key: a.Key, Attempt: a.Attempt, Outcome: t.To}
		return o, obs
	}
	c.emit(ctx, obs)
	switch {
	case t.To == StatusSucceeded:
	case resultErr != nil:
		c.log.Warn("once: result not stored; action put up for review", "key", a.Key, "kind", a.Kind, "err", resultErr)
		o.err = fmt.Errorf("once: action %s: %w; it was put up for review", a.Key, resultErr)
	case classify(ferr) == StatusReleased:
		o.value, o.err = nil, fmt.Errorf("once: action %s attempt %d released: %w", a.Key, a.Attempt, ferr)
	case t.To == StatusFailed:
		o.value, o.err = nil, &FailedError{Key: a.Key, Attempt: a.Attempt, Message: t.Error, err: ferr}
	default:
		c.log.Warn("once: outcome unknown", "key", a.Key, "kind", a.Kind, "attempt", a.Attempt, "recovery", pol.Recovery, "err", ferr)
		o.value, o.err = nil, &UnknownOutcomeError{Key: a.Key, Attempt: a.Attempt, Message: ferr.Error(), Status: t.To, err: ferr}
		if t.To == StatusUnknown {
			o.err.(*UnknownOutcomeError).Due = time.Now().Add(t.Lease)
		}
	}
	return o, obs
}

// lateStatuses are where a decision taken while an attempt was cut off
// leaves the action: a late outcome of the same attempt is recorded from
// them.
var lateStatuses = []Status{StatusReview, StatusReleased, StatusFailed}

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
		t.From = []Status{cur.Status}
		t.Event.From = cur.Status
		t.Event.Note = strings.TrimPrefix(fmt.Sprintf("%s; late outcome of attempt %d, recorded after the action was %s", note, a.Attempt, cur.Status), "; ")
		ok, err := c.record(ctx, a, t)
		if ok || err != nil {
			return t, ok, err
		}
	}
	return t, false, nil
}

// record writes an outcome, retrying while the database is unreachable.
// It runs on a context detached from the caller's: an effect that
// happened must be recorded even if the caller has given up waiting.
// It reports false when the attempt was fenced out.
func (c *Client) record(ctx context.Context, a Action, t Transition) (bool, error) {
	_, ok, err := c.recordAs(ctx, a, t)
	return ok, err
}

// recordAs is record, also returning the transition it wrote: t, or a
// placeholder for what the database refused.
func (c *Client) recordAs(ctx context.Context, a Action, t Transition) (Transition, bool, error) {
	detached := context.WithoutCancel(ctx)
	deadline := time.Now().Add(c.recordTimeout)
	// rctx bounds all the tries. It is made when a try fails: the first
	// try's deadline is the earlier of its own and RecordTimeout's, and
	// most outcomes are recorded by it.
	var rctx context.Context
	t = storableTransition(c.stamp(t))
	if t.Token == "" {
		t.Token = newToken()
	}
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
			c.log.Warn("once: the database refused the outcome; recording a placeholder", "key", a.Key, "outcome", t.To, "err", err)
			t = p
			continue
		}
		c.log.Warn("once: recording outcome failed; retrying", "key", a.Key, "outcome", t.To, "err", err)
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
	case cur.Token == t.Token:
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

// heartbeat keeps an attempt's claim while its effect runs: it extends
// the lease every Lease/3. Each call has a deadline of its own, so a
// connection that hangs instead of failing cannot hold it up.
// Independently of the calls, a timer of its own cancels the effect at
// Lease−margin after the last heartbeat that got through was sent (the
// claim's, to begin with): by then recovery may be about to take over, so
// the effect must stop. A claim found lost (a newer attempt took over)
// cancels it at once. The cause is a *FencedError.
//
// Most effects return well within Lease/3, before any heartbeat is due,
// so nothing runs for them but one timer: when it fires (the effect
// outlived the first interval) it arms the effect's stop timer, with the
// deadline counted from sent as always, and starts the loop, whose first
// heartbeat is due then. Until then the stop timer has nothing to do: it
// is due at Lease−margin after sent, later than the first heartbeat, and
// the first timer fires no later than it would.
type heartbeat struct {
	c *Client
	// ctx is the effect's context without its cancellation: the
	// heartbeat outlives the effect's deadline and the caller's context,
	// since an effect that ignores its context may still be running, and
	// its claim must hold until it returns.
	ctx     context.Context
	cancel  context.CancelCauseFunc
	key     Key
	attempt int
	pol     KindPolicy
	sent    time.Time

	mu      sync.Mutex
	stopped bool
	// first starts the loop; expire (nil until then) stops the effect.
	first, expire *time.Timer
	stopLoop      context.CancelFunc
	loop          sync.WaitGroup
}

// startHeartbeat starts keeping a's claim, whose lease counts from sent,
// for an effect that cancel stops. Call stop when the effect returns.
func (c *Client) startHeartbeat(ctx context.Context, cancel context.CancelCauseFunc, a Action, pol KindPolicy, sent time.Time) *heartbeat {
	hb := &heartbeat{c: c, ctx: ctx, cancel: cancel, key: a.Key, attempt: a.Attempt, pol: pol, sent: sent}
	hb.first = time.AfterFunc(min(pol.Lease/3, hb.stopIn(sent)), hb.begin)
	return hb
}

// stopIn is how long from now the effect may run on a lease renewed by a
// call sent at from.
func (hb *heartbeat) stopIn(from time.Time) time.Duration {
	return time.Until(from.Add(hb.pol.Lease - hb.pol.margin()))
}

// begin runs when the effect outlives the first interval: it arms the
// stop timer and starts the loop.
func (hb *heartbeat) begin() {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	if hb.stopped {
		return
	}
	hb.expire = time.AfterFunc(hb.stopIn(hb.sent), hb.expired)
	ctx, stop := context.WithCancel(context.WithoutCancel(hb.ctx))
	hb.stopLoop = stop
	hb.loop.Go(func() { hb.run(ctx) })
}

// expired stops the effect: no heartbeat got through for a lease.
func (hb *heartbeat) expired() {
	hb.c.log.Warn("once: no heartbeat got through for a lease; stopping the effect", "key", hb.key, "attempt", hb.attempt)
	hb.cancel(&FencedError{Key: hb.key, Attempt: hb.attempt, Outcome: StatusInFlight})
}

// run sends a heartbeat at once (begin ran when the first was due), and
// every Lease/3 after, until ctx ends or the claim is found lost.
func (hb *heartbeat) run(ctx context.Context) {
	every := hb.pol.Lease / 3
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		sentAt := time.Now()
		callCtx, cancelCall := context.WithTimeout(ctx, every)
		_, held, err := hb.c.store.Heartbeat(callCtx, hb.key, hb.attempt, hb.pol.storedLease())
		cancelCall()
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return
			}
			hb.c.log.Warn("once: heartbeat failed; the lease may expire", "key", hb.key, "attempt", hb.attempt, "err", err)
		case held:
			hb.expire.Reset(hb.stopIn(sentAt))
		default:
			hb.c.log.Warn("once: claim lost while the effect ran", "key", hb.key, "attempt", hb.attempt)
			hb.cancel(&FencedError{Key: hb.key, Attempt: hb.attempt, Outcome: StatusInFlight})
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// stop stops the heartbeat: the loop, which it waits for, then the stop
// timer, which the loop's last heartbeat may have reset.
func (hb *heartbeat) stop() {
	hb.mu.Lock()
	hb.stopped = true
	hb.first.Stop()
	expire, stopLoop := hb.expire, hb.stopLoop
	hb.mu.Unlock()
	if expire != nil {
		stopLoop()
		hb.loop.Wait()
		expire.Stop()
	}
}
