package once

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"time"
)

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
// arbitrates) and runs fn with the attempt's number and a provider
// idempotency key; its result is stored, and every later caller gets it
// back with Replayed set, without running fn. What fn returns decides
// what is recorded: nil (succeeded), RetryLater(err) (released for the
// next delivery), Permanent(err) (failed, a *FailedError to every
// duplicate), or any other error, a panic or a timeout (unknown: the
// kind's Recovery decides, never a guess). The package doc's
// "Outcomes" says each in full.
//
// fn's context ends at the kind's MaxExecution, when the claim is lost,
// and when ctx does. A caller that meets a claim held by another attempt
// gets an *InFlightError, and one whose payload differs from the first
// attempt's a *FingerprintError; neither runs fn. With WaitFor(d) it
// waits up to d for the other attempt's outcome instead.
//
// Do returns the effect's value together with an error when the effect
// ran but its outcome could not be stored as it happened (*RecordError,
// *FencedError, ErrResultTooLarge): act on the value, but do not run the
// effect again. Claim is the first half of Do, for an effect that runs
// elsewhere.
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
	if o.claimID != "" {
		return Result[T]{}, errClaimIDNotForDo("Do")
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
	if opt.claimID != "" {
		return Result[T]{}, errClaimIDNotForDo("DoTx")
	}
	req, pol, err := c.prepare(in)
	if err != nil {
		return Result[T]{}, err
	}
	s := store.BindTx(tx)
	w, ans, ok := c.acquire(ctx, req, pol, opt, s)
	if !ok {
		return finish[T](ans)
	}
	a := w.a
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
	value, ferr := fn(runCtx, tx, Attempt{Key: a.Key, Number: a.Attempt, ProviderKey: string(a.Key), Intent: in})
	returned = true
	took := time.Since(started)
	if ferr != nil {
		err := fmt.Errorf("once: action %s: the effect failed inside the transaction, roll it back: %w", a.Key, ferr)
		end(Observation{Event: Event{Key: a.Key, Attempt: a.Attempt, From: StatusInFlight, Actor: ActorWorker}, Kind: a.Kind, Duration: took}, err)
		return Result[T]{}, err
	}
	if err := c.settleTx(ctx, s, pol, a, value, took, end); err != nil {
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

// do is Do without its type parameter: claim, then run and settle.
func (c *Client) do(ctx context.Context, in Intent, fn effect, o doOptions) outcome {
	req, pol, err := c.prepare(in)
	if err != nil {
		return outcome{err: err}
	}
	w, ans, ok := c.acquire(ctx, req, pol, o, nil)
	if !ok {
		return ans
	}
	return c.execute(ctx, pol, in, w, fn)
}

// won is a claim this caller won.
type won struct {
	// a is the action as claimed: the new attempt.
	a Action
	// sent is when the claim's request was sent: the lease counts from
	// then for this process, since the database started it later.
	sent time.Time
	// takeover says recovery took a lapsed attempt over for this one.
	takeover bool
}

// acquire is the protocol's loop, which Do, DoTx and Claim share: claim,
// and when another attempt stands, answer from it, wait for it, or
// recover it once and go round again. It returns the claim this caller
// won, or, when it won none, the answer (ok false). tx, when set, is the
// client's store bound to a caller's transaction: there a claim is not
// read back (the transaction fails as a whole) and recovery, which needs
// a transaction of its own, only answers.
func (c *Client) acquire(ctx context.Context, req ClaimRequest, pol KindPolicy, o doOptions, tx Store) (w won, ans outcome, ok bool) {
	s, pending := tx, (*pendingClaims)(nil)
	if tx == nil {
		s, pending = c.store, new(pendingClaims)
	}
	wait := c.waiting(o)
	recovered := false
	named := ""
	waitCtx := ctx
	if o.claimID != "" && tx == nil {
		named = claimToken(o.claimID, req.Key)
		// A named claim's writes are carried out if its caller goes
		// away (ClaimID); only its waits end with the caller.
		ctx = context.WithoutCancel(ctx)
	}
	for {
		sent := time.Now()
		cr, err := c.claim(ctx, s, req, pending, named)
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
				again, stop := wait.wait(waitCtx, s, seen, req.Kind, c.claimTimeout)
				if again {
					continue
				}
				return won{}, wait.finish(outcome{key: req.Key, err: err}, stop), false
			}
			return won{}, outcome{err: err}, false
		}
		if cr.Claimed && cr.Action.Status == StatusAwaitingApproval {
			// This claim wrote the wait: it announces it, once, and
			// answers (or, with WaitFor, waits for a decision) as a
			// duplicate would. In a caller's transaction the row is
			// not committed yet, and may never be: nobody is told
			// (TestClient/ApprovalDuplicatesAnnounceNothing).
			// A named claim made again announced it the first time.
			if at, again := pending.sent(cr.Action.Token); tx == nil && !(again && at.IsZero()) {
				c.announce(ctx, cr.Action)
			}
			cr.Claimed = false
		}
		if cr.Claimed {
			if at, ok := pending.sent(cr.Action.Token); ok {
				sent = at
			}
			// An approved action's attempt before this one never ran:
			// there is nothing for a verifier to find.
			if cr.Action.Attempt > 1 && tx == nil && cr.From != StatusApproved {
				o, renewed, decided := c.verifyReleased(ctx, pol, cr.Action, sent)
				if decided {
					return won{}, o, false
				}
				sent = renewed
			}
			return won{a: cr.Action, sent: sent}, outcome{}, true
		}
		a := cr.Action
		due := (a.Status == StatusInFlight || a.Status == StatusUnknown) && !a.LeaseUntil.After(cr.Now)
		if tx != nil || recovered || !due || a.Fingerprint != req.Fingerprint {
			var stop error
			if live(cr, req) && (tx == nil || a.Status == StatusInFlight) {
				var again bool
				again, stop = wait.wait(waitCtx, s, a, a.Kind, a.LeaseUntil.Sub(cr.Now))
				if again {
					// A new round: whatever stands now, including a
					// lease that ran out meanwhile, is met afresh.
					recovered = false
					continue
				}
			}
			return won{}, wait.finish(c.answer(ctx, req, cr), stop), false
		}
		// The standing attempt's outcome is unknown and due: apply the
		// kind's recovery here, so the worker that meets a dead claim
		// does not wait for the reaper.
		recovered = true
		sent = time.Now()
		r, err := c.recoverKey(ctx, pol, a.Key, named)
		if err != nil {
			return won{}, outcome{err: err}, false
		}
		switch r.decision {
		case decTakeover:
			return won{a: r.action, sent: sent, takeover: true}, outcome{}, true
		case decSucceeded:
			return won{}, outcome{key: a.Key, attempt: r.action.Attempt, stored: r.result, replayed: true}, false
		}
		// Anything else (put up for review, released, moved on under
		// us): claim again; a release is claimed by this caller, and any
		// other row is answered as it stands, without recovering again.
	}
}

// asError is the answer Claim gives for an outcome in which this caller
// won no claim: a replay is a *ReplayedError.
func (o outcome) asError() error {
	if o.err == nil && o.replayed {
		return &ReplayedError{Key: o.key, Attempt: o.attempt, Result: o.stored}
	}
	return o.err
}

// execute runs the effect of a won claim and records its outcome. sent
// is when the claim's request was sent, where its lease starts for this
// process.
func (c *Client) execute(ctx context.Context, pol KindPolicy, in Intent, w won, fn effect) outcome {
	a, sent, takeover := w.a, w.sent, w.takeover
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
	att := c.attemptOf(pol, a, in, sent, true)
	settle := func(value any, err error) outcome {
		s := c.settle(ctx, pol, a, value, err, att.noter.noted(), time.Since(started))
		o := s.answer(a, value, err)
		end(s.obs, o.err)
		return o
	}
	value, err := c.run(ctx, pol, att, fn, sent, func(p any) {
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

// errLeaseSpent is run's answer when the lease ran out before the effect
// could start.
var errLeaseSpent = errors.New("the claim's lease ran out before the effect started")

// run runs the effect under the kind's deadline while a heartbeat keeps
// the claim. If the effect does not return (a panic, runtime.Goexit),
// aborted is called before the panic goes on up the stack.
func (c *Client) run(ctx context.Context, pol KindPolicy, att Attempt, fn effect, sent time.Time, aborted func(p any)) (value any, err error) {
	runCtx, cancel := context.WithCancelCause(ctx)
	runCtx, cancelTimeout := context.WithTimeout(runCtx, pol.MaxExecution)
	hb := c.startHeartbeat(ctx, cancel, att.h, sent)
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
