package once

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"errors"
	"fmt"
	"strings"
	"time"
)

// DoOption changes how one call of Do or DoTx behaves. Options are
// per call because whether to wait depends on who is calling, not on the
// kind of action: a queue worker holds a delivery, an HTTP handler holds
// a client's request.
type DoOption func(*doOptions)

type doOptions struct {
	wait time.Duration
	// claimID names a Claim made again (ClaimID).
	claimID string
	err     error
}

// WaitFor makes a call that meets a claim held by another attempt wait
// up to d for that attempt's outcome, instead of returning *InFlightError
// at once. Whenever the action may have changed, the call claims again
// and goes on as any delivery would:
//   - the other attempt succeeded: its result is replayed (Replayed set);
//   - it failed permanently: *FailedError;
//   - it was released (RetryLater): this call claims it and runs fn
//     itself;
//   - its lease ran out (the worker died): the kind's recovery applies
//     inline, as it would for a later delivery;
//   - it went to review, or its outcome is unknown: the same errors as
//     without waiting;
//   - it awaits a person's approval (KindPolicy.Approval): the call
//     waits for the decision, and runs fn once approved, or returns the
//     rejection; the wait that ends first, d or the approval's expiry,
//     returns the *AwaitingApprovalError.
//
// After d, the call returns the *InFlightError it would have returned at
// once, read afresh (LeaseUntil as it now stands, Waited set). When ctx
// ends first, it returns at once, without reading again: the
// *InFlightError as the call last read it, with Waited set, which also
// matches ctx's error. Only a live claim is waited for: a different
// payload, an action in review or awaiting its verifier is answered at
// once.
//
// Waiting holds no database connection: the postgres store is woken by a
// notification on a connection of its own and polls as a fallback, the
// sqlite store polls. Each claim is still bounded by
// Config.ClaimTimeout, so a call can return up to that long after d. A
// key that a transaction not yet committed holds (a DoTx claiming it)
// is the exception: the transaction's rollback changes nothing a read
// can see, so the call claims again every ClaimTimeout, its claim
// waiting on the transaction (and holding a connection) each time, and
// takes the key once it is free.
// Zero waits not at all; d must not be negative.
func WaitFor(d time.Duration) DoOption {
	return func(o *doOptions) {
		if d < 0 {
			o.err = fmt.Errorf("once: WaitFor(%v): a wait must not be negative; pass zero to answer at once", d)
			return
		}
		o.wait = d
	}
}

// ClaimID names a claim, so that the same claim made again is answered
// as it was the first time: with the attempt it won. A server that
// claims for a remote caller needs it: when the reply of a claim that
// won is lost on the way back, the caller asks again, and without a
// name the second claim meets the first one's row as another's, in
// flight, and the effect waits out a lease and a recovery while nothing
// is running it.
//
// The claim's token is derived from id and the key. A claim that finds
// the action in flight (or awaiting approval, at its first attempt)
// under that token takes it as its own, and renews its lease before it
// answers: when the first was sent is not known. id must be hard to
// guess (16 random bytes or more, as printable ASCII, at most 128
// bytes), since whoever holds it holds the claim, and it names one
// claim only: a claim after the attempt was settled needs a new id.
// A takeover of a lapsed claim is written under a token derived from the
// name too, and the claim made again finds it its own.
//
// ctx bounds a named claim's wait (WaitFor), not its writes: a claim
// or a takeover on its way is carried out, each write bounded by
// Config.ClaimTimeout, and one won after ctx ended is kept for the
// claim made again, not given back, since that claim may be answering
// it already. A caller gone while the call waits stops the wait, and
// nothing more is claimed. For Claim only: Do and DoTx run their
// effect in this process, which has their claim's answer.
func ClaimID(id string) DoOption {
	return func(o *doOptions) {
		if len(id) < 16 || len(id) > 128 || strings.ContainsFunc(id, func(r rune) bool { return r <= ' ' || r > '~' }) {
			o.err = fmt.Errorf("once: ClaimID needs 16 to 128 bytes of printable ASCII, hard to guess; got %d bytes: %w", len(id), ErrInvalidIntent)
			return
		}
		o.claimID = id
	}
}

func errClaimIDNotForDo(call string) error {
	return fmt.Errorf("once: %s does not take ClaimID: it has its claim's answer in this process; ClaimID is for Claim, made again for a remote caller: %w", call, ErrInvalidIntent)
}

// claimToken is the token of the claim id names on key.
func claimToken(id string, key Key) string {
	h := sha256.Sum256([]byte("once claim\x00" + string(key) + "\x00" + id))
	return base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(h[:16])
}

// takeoverToken is the token with which a named claim (whose claims
// carry named, a claimToken) takes a lapsed attempt over as attempt: the
// same claim made again knows the takeover for its own by it. It is not
// named itself, so that no two attempts of a row share a token, nor the
// tokens their outcomes derive from it.
func takeoverToken(named string, attempt int) string {
	h := sha256.Sum256(fmt.Appendf(nil, "once takeover\x00%s\x00%d", named, attempt))
	return base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(h[:16])
}

// optionsOf applies opts; a nil option is skipped.
func optionsOf(opts []DoOption) (doOptions, error) {
	if len(opts) == 0 {
		// Without options o would still escape to the calls below.
		return doOptions{}, nil
	}
	var o doOptions
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	return o, o.err
}

// waiting is one call's wait for another attempt's outcome (WaitFor).
type waiting struct {
	c     *Client
	limit time.Duration
	// began is when the call first met the other attempt's claim; zero
	// while it has not waited.
	began time.Time
	until time.Time
}

func (c *Client) waiting(o doOptions) *waiting { return &waiting{c: c, limit: o.wait} }

// live reports whether a call may wait for the action a claim found:
// another attempt holds it with a lease that has not run out, or it
// waits for a person's approval that has not expired, for the same
// payload. Anything else is answered (or recovered) as it stands.
func live(cr ClaimResult, req ClaimRequest) bool {
	a := cr.Action
	return (a.Status == StatusInFlight || a.Status == StatusAwaitingApproval) && a.LeaseUntil.After(cr.Now) && a.Fingerprint == req.Fingerprint
}

// wait waits, through s, until the action a stands for (as a claim read
// it; a zero Status when no row was visible) may have moved on, until
// the other attempt's lease runs out (left from now, by the database's
// clock), or until the call's wait is over. It reports whether to claim
// again. It returns stop when it gave up for another reason than the
// wait running out: ctx ended, or s cannot wait here.
func (w *waiting) wait(ctx context.Context, s Store, a Action, kind string, left time.Duration) (again bool, stop error) {
	if w.limit <= 0 {
		return false, nil
	}
	now := time.Now()
	if w.began.IsZero() {
		w.began, w.until = now, now.Add(w.limit)
		w.c.log.Debug("once: waiting for the attempt in flight", "key", a.Key, "kind", kind, "attempt", a.Attempt, "for", w.limit)
		w.c.emit(ctx, Observation{Event: Event{Key: a.Key, Type: EventWaiting, Attempt: a.Attempt, From: a.Status}, Kind: kind})
	}
	if !now.Before(w.until) {
		return false, nil
	}
	if err := ctx.Err(); err != nil {
		return false, context.Cause(ctx)
	}
	until := w.until
	if left > 0 && now.Add(left).Before(until) {
		// The claim lapses first: claim again then, so recovery applies
		// (or a heartbeat has moved the lease on, and the wait goes on).
		until = now.Add(left)
	}
	req := WaitRequest{Key: a.Key, Status: a.Status, Attempt: a.Attempt, Until: until}
	var err error
	if ws, ok := s.(Waiter); ok {
		err = ws.Wait(ctx, req)
	} else {
		err = pollChange(ctx, s, req)
	}
	switch {
	case err == nil:
		return true, nil
	case ctx.Err() != nil:
		return false, context.Cause(ctx)
	}
	w.c.log.Warn("once: cannot wait for the attempt in flight; answering at once", "key", a.Key, "kind", kind, "err", err)
	return false, err
}

// finish marks what a call that waited returns: how long it waited, and
// why it stopped when that was not the wait running out.
func (w *waiting) finish(o outcome, stop error) outcome {
	if w.began.IsZero() {
		return o
	}
	var held *InFlightError
	if errors.As(o.err, &held) {
		held.Waited = time.Since(w.began)
	}
	if stop != nil && o.err != nil {
		o.err = fmt.Errorf("%w (stopped waiting: %w)", o.err, stop)
	}
	return o
}

// pollChange is Waiter.Wait for a store that does not implement it: it
// reads the action back, 50ms after the call and then backing off to a
// second between reads, until it has changed or req.Until.
func pollChange(ctx context.Context, s Store, req WaitRequest) error {
	timer := time.NewTimer(time.Until(req.Until))
	defer timer.Stop()
	every := 50 * time.Millisecond
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
			return nil
		case <-time.After(every):
		}
		every = min(every*2, time.Second)
		gctx, cancel := context.WithDeadline(ctx, req.Until)
		a, err := s.Get(gctx, req.Key)
		cancel()
		switch {
		case errors.Is(err, ErrNotFound):
			if req.Moved(false, "", 0) {
				return nil
			}
		case err != nil:
			// The database could not be reached for a moment: read
			// again at the next turn.
		case req.Moved(true, a.Status, a.Attempt):
			return nil
		}
	}
}
