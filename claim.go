package once

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"
)

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
//
// A named claim (ClaimID) sends every try under the one token its name
// gives, and takes a lapsed attempt over under one derived from it
// (takeoverToken). A row found under either may be any try's, of this
// call or of the same claim made before, whose send time is not known
// here: it goes into pending with none, and the caller renews the lease.
func (c *Client) claim(ctx context.Context, s Store, req ClaimRequest, pending *pendingClaims, named string) (ClaimResult, error) {
	// resent says the claim was sent again after a failed try; waited,
	// that a try ran out of ClaimTimeout with its claim not visible.
	resent, waited := false, false
	ours := func(a Action) bool {
		if named != "" && pending != nil && (a.Token == named || a.Token == takeoverToken(named, a.Attempt)) {
			pending.add(a.Token, time.Time{})
			return true
		}
		_, ok := pending.sent(a.Token)
		return ok
	}
	for range 3 {
		req.Token = newToken()
		if named != "" {
			req.Token = named
		}
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
				if !ok && pending != nil && named == "" {
					pending.add(req.Token, sent)
				}
				if ok && named != "" {
					ours(a)
				}
				// The row may carry this try's token, or an earlier
				// try's of this call that committed late: either way
				// the claim is this call's, and nobody else runs it
				// (TestResendTakesTheLateFirstClaimAsItsOwn).
				earlier := a.Key != "" && ours(a)
				waited = waited || timedOut
				switch {
				case (ok || earlier) && (a.Status == StatusInFlight || a.Status == StatusAwaitingApproval && a.Attempt == 1):
					// Read back, the status it was claimed from is not
					// known: a claim of attempt 2 or later is taken as
					// a claim of a released action, whose verifier is
					// asked first, the careful answer.
					c.log.Warn("once: the claim's reply was lost; it was ours", "key", req.Key, "kind", req.Kind, "err", err)
					return ClaimResult{Claimed: true, Action: a}, nil
				case known && !ok && !earlier && a.Key != "" && !a.Status.Claimable():
					// The row is there, and another's: a claim that
					// found it would answer from it, and so does this
					// one. A transaction that held the key may have
					// committed after the claim gave up on its lock
					// (TestClient/ClaimAnswersFromTheRowATransactionCommitted).
					// The read has no database clock: a zero Now never
					// makes a lease look lapsed.
					return ClaimResult{Action: a}, nil
				case known && !ok && !resent && ctx.Err() == nil && !errors.Is(err, ErrRejected):
					// The database answered the read-back, on another
					// connection, and the claim is not in the row: what
					// failed was the claim's connection (one the server
					// or a network closed while the pool held it idle),
					// or a transaction holds the key. Claim once more,
					// with a new token: should the failed try still
					// commit, its token (pending) makes its row this
					// call's own, and its effect runs once
					// (TestClient/IdleConnectionTerminatedDoClaimsAgain,
					// TestIdleBlackholedConnectionClaimsAgain).
					c.log.Warn("once: the claim failed; the database answers, claiming again", "key", req.Key, "kind", req.Kind, "err", err)
					c.emit(ctx, Observation{Event: Event{Key: req.Key, Type: EventClaimResent, Attempt: a.Attempt, From: a.Status, At: time.Now()}, Kind: req.Kind})
					resent = true
					continue
				case !known:
					// Neither the claim nor the read after it was
					// answered: nothing is known of the row, and no
					// transaction is known to hold the key
					// (TestClient/BlackholedClaimSaysTheStoreIsUnreachable).
					return ClaimResult{}, &unavailableError{key: req.Key, kind: req.Kind, patience: c.claimTimeout, err: err}
				case waited && (a.Key == "" || a.Status.Claimable()):
					// A try waited, and no row is visible or the one
					// visible is released: another transaction (a DoTx
					// not yet committed) holds the key, claiming it or
					// claiming it again, or holds the database's write
					// lock; also when the resend after it failed
					// otherwise (TestClient/ResendOnDeadConnectionStillWaitsForTheTransaction).
					// What is visible comes back with the error, for a
					// caller that waits to watch.
					return ClaimResult{Action: a}, &InFlightError{Key: req.Key, Attempt: a.Attempt, InTransaction: true}
				}
			}
			return ClaimResult{}, fmt.Errorf("once: claiming action %s (%s): %w", req.Key, req.Kind, err)
		}
		if !cr.Claimed && (cr.Action.Status == StatusInFlight || cr.Action.Status == StatusAwaitingApproval && cr.Action.Attempt == 1) {
			if ours(cr.Action) {
				// Nothing else writes this token: the row is still
				// at the claim this call gave up on, and nobody runs it.
				c.log.Warn("once: a claim given up on committed later; it is ours", "key", req.Key, "kind", req.Kind, "attempt", cr.Action.Attempt)
				cr.Claimed = true
				return cr, nil
			}
		}
		if cr.Claimed || !cr.Action.Status.Claimable() || cr.Action.Fingerprint != req.Fingerprint || req.refuses(cr.Action) {
			return cr, nil
		}
	}
	return ClaimResult{}, fmt.Errorf("once: claiming action %s: the row kept changing under the claim; try again", req.Key)
}

// refuses reports whether req may not claim the released row a again
// (ClaimRequest.Refuse).
func (req ClaimRequest) refuses(a Action) bool {
	return a.Status == StatusReleased && slices.Contains(req.Refuse, a.Recovery.String())
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
		f := &FailedError{Key: a.Key, Attempt: a.Attempt, Message: a.Error, Replayed: true}
		if rejected(a) {
			f.RejectedBy, f.Reason = a.ResolvedBy, a.ResolveNote
		}
		o.err = f
	case StatusInFlight:
		observe(EventConflict)
		o.err = &InFlightError{Key: a.Key, Attempt: a.Attempt, ClaimedAt: a.ClaimedAt, LeaseUntil: a.LeaseUntil, Expired: !a.LeaseUntil.After(cr.Now)}
	case StatusUnknown:
		due := a.LeaseUntil
		if a.Recovery.KindOnly() && !c.takesVerify(a.Kind) {
			// This process will not decide it (it knows nothing of the
			// kind); a delivery sent back at once would only loop. Come
			// back a lease from now.
			if later := cr.Now.Add(c.Policy(a.Kind).Lease); later.After(due) {
				due = later
			}
		}
		o.err = &UnknownOutcomeError{Key: a.Key, Attempt: a.Attempt, Message: a.Error, Status: StatusUnknown, Due: due}
	case StatusReleased:
		if req.refuses(a) {
			// Only a process with the kind's verifier claims it again
			// (TestClient/ReviewReleasedVerifiableRunWithoutItsVerifier).
			o.err = fmt.Errorf("once: action %s (%s) was released under %v, and this process has no verifier for kind %q: "+
				"a process that configures the kind claims it again, after asking the verifier whether an earlier attempt landed: %w",
				a.Key, a.Kind, a.Recovery, a.Kind, ErrRetryLater)
			return o
		}
		// Released between this caller's read and now (a person chose
		// Retry, or recovery released it): the next delivery runs it.
		o.err = fmt.Errorf("once: action %s was released for another attempt: %w", a.Key, ErrRetryLater)
	case StatusReview:
		// A gated action at attempt 1 never ran: it is in review
		// because its wait for approval expired.
		o.err = &ReviewError{Key: a.Key, Attempt: a.Attempt, Reason: a.Error, ApprovalExpired: unapprovedUnrun(a)}
	case StatusAwaitingApproval:
		// A duplicate: the claim that wrote the row announced the wait.
		o.err = awaitingApproval(a, cr.Now)
	case StatusApproved:
		// Approved between this caller's read and now; the next
		// delivery claims and runs it.
		o.err = fmt.Errorf("once: action %s was approved by %s; the next delivery runs it: %w", a.Key, a.ResolvedBy, ErrRetryLater)
	default:
		o.err = fmt.Errorf("once: action %s has status %q, which this version does not know; upgrade", a.Key, a.Status)
	}
	return o
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
	verifier := recovery.rules().verifier(pol)
	if verifier == nil {
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
	landed, result, err := safeVerify(vctx, verifier, before)
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
	t := verifyFirst.of(a, ActorWorker)
	t.Result, t.Event.Note = result, fmt.Sprintf("before attempt %d ran, the verifier found an earlier attempt's effect landed; attempt %d did not run", a.Attempt, a.Attempt)
	if why := c.unstorable(result); why != "" {
		t = putToReview.of(a, ActorWorker).noting(fmt.Sprintf("attempt %d did not run: the verifier says an earlier attempt's effect landed, but %s", a.Attempt, why))
	}
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
