package once

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Attempt is one claim of an action: what its effect needs to know, and,
// for an attempt claimed with Client.Claim, the only way to change its row.
//
// Do hands its effect an Attempt and settles it from what the effect
// returns. Claim hands one to the caller, who runs the effect anywhere
// (another goroutine, another process, a remote worker) and settles it
// with exactly one of Succeed, Fail, Release or Unknown. An attempt made
// by hand, as a literal, names an action but holds no claim.
type Attempt struct {
	// Key is the action's key.
	Key Key
	// Number is the fencing number of this attempt: 1 for the first.
	Number int
	// ProviderKey is an idempotency key for the provider's API (Stripe's
	// Idempotency-Key header, say). It is the same on every attempt of the
	// action, so a provider that honours it absorbs a retried call.
	ProviderKey string
	// Intent is the intent being carried out. An attempt rebuilt with
	// Client.Attempt has its Kind only.
	Intent Intent
	// Token proves the claim. With Key and Number it rebuilds the
	// attempt in a process that did not claim it (Client.Attempt), so
	// treat it as a secret of the claim's holder. Empty in Do and DoTx,
	// which settle the attempt themselves: a rebuild would settle it
	// behind their backs.
	Token string

	// noter writes Note for a claimed attempt; nil for one made by hand.
	noter *noter
	// h is the claim this attempt holds; nil for one made by hand.
	h *held
}

// held is the state of a claim that an Attempt holds. Copies of an
// Attempt share it, so a settled attempt is settled in every copy.
type held struct {
	c   *Client
	pol KindPolicy
	a   Action
	// byDo says Do settles the attempt from what its effect returns:
	// the settling methods refuse, so the outcome is recorded once.
	byDo bool
	// rebuilt says the attempt was rebuilt (Client.Attempt): when its
	// lease counts from is its claimer's to know, not this process's.
	rebuilt bool
	started time.Time

	mu sync.Mutex
	// renewed is when the lease last counted from, by this process's
	// clock: the claim's request, or the last heartbeat that got
	// through.
	renewed time.Time
	// done is the first settle's answer, which every later call gets.
	done *settlement
	// unrecorded says a settle was not recorded, as far as it knew: a
	// later one that finds it written tells the hooks.
	unrecorded bool
}

// settlement is what settling an attempt came to: what was asked (to),
// the status that left the row in, and the answer.
type settlement struct {
	to, status Status
	err        error
}

// attemptOf is the Attempt of a won claim, held for the rest of it.
func (c *Client) attemptOf(pol KindPolicy, a Action, in Intent, sent time.Time, byDo bool) Attempt {
	h := &held{c: c, pol: pol, a: a, byDo: byDo, started: time.Now(), renewed: sent}
	att := Attempt{
		Key: a.Key, Number: a.Attempt, ProviderKey: string(a.Key), Intent: in, Token: a.Token,
		noter: &noter{c: c, lease: pol.storedLease(), key: a.Key, attempt: a.Attempt},
		h:     h,
	}
	if byDo {
		// Do's effect gets no token to hand on: Do records what it
		// returns, and nothing else may settle its claim
		// (TestClient/ReviewDoAttemptNotSettledByRebuild).
		att.Token = ""
	}
	return att
}

// Claim claims in for this caller without running anything: the first
// half of Do, for an effect that runs elsewhere. It returns the
// *Attempt this caller now holds, which it must settle; or the answer a
// duplicate gets, in the errors Do returns: a *ReplayedError with the
// stored result when an earlier attempt succeeded, and a *FailedError,
// *InFlightError, *ReviewError, *UnknownOutcomeError or
// *FingerprintError otherwise. A lapsed claim is recovered as in Do, and
// WaitFor waits as it does.
//
// The holder keeps the claim with Heartbeat, at least every third of the
// kind's lease, and stops the effect by Deadline when a heartbeat fails.
// An attempt that is never settled stays in flight until its lease
// lapses, and recovery then treats it as an effect that may have
// happened. The hooks see the claim and the outcome as events; OnExecute
// is Do's alone, since the effect runs elsewhere.
func (c *Client) Claim(ctx context.Context, in Intent, opts ...DoOption) (*Attempt, error) {
	if c == nil {
		return nil, errors.New("once: Claim called with a nil *Client; build one with once.New")
	}
	o, err := optionsOf(opts)
	if err != nil {
		return nil, err
	}
	req, pol, err := c.prepare(in)
	if err != nil {
		return nil, err
	}
	w, ans, ok := c.acquire(ctx, req, pol, o, nil)
	if !ok {
		return nil, ans.asError()
	}
	if o.claimID != "" {
		// Kept for the claim made again, which may be answering it
		// already (ClaimID).
		ctx = context.WithoutCancel(ctx)
	}
	if err := ctx.Err(); err != nil {
		// The caller gave up while the claim was on its way: nothing
		// will run, so the claim is given back at once.
		return nil, c.abandon(ctx, pol, w.a, err, w.takeover).err
	}
	sent, err := c.freshen(ctx, pol, w.a, w.sent)
	switch {
	case errors.Is(err, errNotRenewed):
		return nil, c.abandon(ctx, pol, w.a, err, w.takeover).err
	case err != nil:
		return nil, err
	}
	att := c.attemptOf(pol, w.a, in, sent, false)
	c.emit(ctx, Observation{Event: Event{Key: w.a.Key, Type: EventClaimed, Attempt: w.a.Attempt, To: StatusInFlight, Actor: ActorWorker}, Kind: w.a.Kind, Recovery: pol.Recovery})
	return &att, nil
}

// Attempt rebuilds the attempt that key, number and token name, for a
// process that did not claim it: a server settling the attempt of a
// remote worker, or a worker that restarted. It reads the action once.
// The rebuilt attempt settles as the claimed one would, and settling it
// again after the claimed one did gives the same answer.
//
// It returns an error matching ErrNotFound when there is no such
// action, and a *FencedError when the action has moved on from the
// attempt or the token is not the claim's: a claim that recovery or a
// person decided while it was cut off cannot be rebuilt, and its
// holder's outcome is refused.
func (c *Client) Attempt(ctx context.Context, key Key, number int, token string) (*Attempt, error) {
	if c == nil {
		return nil, errors.New("once: Attempt called with a nil *Client; build one with once.New")
	}
	if number < 1 || token == "" || len(token) > maxTokenBytes {
		return nil, fmt.Errorf("once: Attempt needs the number (1 or more) and the token (at most %d bytes) the claim returned: %w", maxTokenBytes, ErrInvalidIntent)
	}
	if key == "" || len(key) > maxTokenBytes*4 || strings.ContainsFunc(string(key), func(r rune) bool { return r <= ' ' || r > '~' }) {
		return nil, fmt.Errorf("once: Attempt needs the key the claim returned, not %.80q: %w", key, ErrInvalidIntent)
	}
	cctx, cancel := c.call(ctx)
	cur, err := c.store.Get(cctx, key)
	cancel()
	switch {
	case err != nil && (errors.Is(err, ErrNotFound) || ctx.Err() != nil):
		return nil, fmt.Errorf("once: rebuilding attempt %d of action %s: %w", number, key, err)
	case err != nil:
		return nil, fmt.Errorf("once: rebuilding attempt %d of action %s: the store did not answer the read of its row (%w): %w", number, key, err, ErrUnavailable)
	}
	pol := c.Policy(cur.Kind)
	// The row's recovery decides an unknown outcome, as it does when
	// its lease lapses: this process may configure the kind otherwise,
	// or not at all (TestClient/ReviewRebuiltUnknownKeepsRowRecovery).
	pol.Recovery = pol.recoveryOf(cur)
	var done *settlement
	switch {
	case cur.Attempt != number:
		return nil, fmt.Errorf("once: attempt %d of action %s cannot be rebuilt: the action is at attempt %d (%s) now: %w",
			number, key, cur.Attempt, cur.Status, &FencedError{Key: key, Attempt: number, Outcome: cur.Status})
	case cur.Status == StatusInFlight && cur.Token == token:
	default:
		to, ok := settledAs(cur, token)
		if !ok {
			return nil, fmt.Errorf("once: attempt %d of action %s cannot be rebuilt: the token is not its claim's, or recovery or a person decided the action (%s) since: %w",
				number, key, cur.Status, &FencedError{Key: key, Attempt: number, Outcome: cur.Status})
		}
		// Settled by this attempt already: the rebuilt one gives its
		// answer again.
		done = &settlement{to: to, status: cur.Status, err: unstoredSuccess(cur, to)}
	}
	a := cur
	a.Token = token
	// When the lease began is the claimer's to know: the rebuilt
	// attempt's Deadline is now, until a Heartbeat renews the lease.
	att := c.attemptOf(pol, a, Intent{Kind: cur.Kind}, time.Now().Add(-(pol.Lease - pol.margin())), false)
	att.h.done, att.h.rebuilt = done, true
	return &att, nil
}

// maxTokenBytes bounds a token handed to Attempt: the engine's are 26.
const maxTokenBytes = 64

// Deadline is when the effect must have stopped unless a Heartbeat
// renews the claim: a fifth of the lease before it lapses, and no later
// than the kind's MaxExecution after the claim. Zero for an attempt made
// by hand. In Do, the effect's context carries it.
func (a Attempt) Deadline() time.Time {
	if a.h == nil {
		return time.Time{}
	}
	a.h.mu.Lock()
	defer a.h.mu.Unlock()
	stop := a.h.renewed.Add(a.h.pol.Lease - a.h.pol.margin())
	if end := a.h.started.Add(a.h.pol.MaxExecution); end.Before(stop) {
		stop = end
	}
	return stop
}

// renewedAt records that the lease counts from sent, if that is later.
func (h *held) renewedAt(sent time.Time) {
	h.mu.Lock()
	if sent.After(h.renewed) {
		h.renewed = sent
	}
	h.mu.Unlock()
}

// Heartbeat renews the claim's lease; Deadline moves on with it. An
// error means the effect must stop: a *FencedError when a newer attempt
// took the action over, it was settled, or no heartbeat got through
// before the lease lapsed. A heartbeat that fails while the lease holds
// is tried again, each try with a deadline of its own. A rebuilt
// attempt's (Client.Attempt) is tried once: its process does not know
// when the lease lapses, and a failure matches ErrUnavailable.
func (a Attempt) Heartbeat(ctx context.Context) error {
	h := a.h
	if h == nil {
		return errNotHeld
	}
	h.mu.Lock()
	done := h.done
	h.mu.Unlock()
	if done != nil {
		return &FencedError{Key: a.Key, Attempt: a.Number, Outcome: done.to}
	}
	backoff := 20 * time.Millisecond
	for {
		// The store fences a heartbeat by the attempt: one past the
		// deadline still renews a claim nobody took over, and clears a
		// recoverer's hold. Only tries that fail run out of time.
		stop := a.Deadline()
		sent := time.Now()
		cctx, cancel := context.WithTimeout(ctx, max(min(h.pol.Lease/3, time.Until(stop)), time.Second))
		_, ok, err := h.c.store.Heartbeat(cctx, a.Key, a.Number, h.pol.storedLease())
		cancel()
		switch {
		case err == nil && ok:
			h.renewedAt(sent)
			return nil
		case err == nil:
			return &FencedError{Key: a.Key, Attempt: a.Number, Outcome: StatusInFlight}
		case ctx.Err() != nil:
			return fmt.Errorf("once: heartbeat of attempt %d of action %s: %w", a.Number, a.Key, ctx.Err())
		case h.rebuilt:
			// This process does not know when the lease lapses (its
			// Deadline is a guess from the rebuilding): the claimer,
			// who does, tries again (TestHeartbeatWhoseReplyIsLostIsNotFenced).
			return fmt.Errorf("once: heartbeat of rebuilt attempt %d of action %s: the store did not answer (%w); whether the lease was renewed is not known, and the claimer, who counts it, tries again: %w",
				a.Number, a.Key, err, ErrUnavailable)
		}
		if !time.Now().Before(stop) {
			return &FencedError{Key: a.Key, Attempt: a.Number, Outcome: StatusInFlight, Lapsed: true, Err: err}
		}
		h.c.log.Warn("once: heartbeat failed; trying again while the lease holds", "key", a.Key, "attempt", a.Number, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(min(backoff, time.Until(stop))):
		}
		backoff = min(backoff*2, time.Second)
	}
}

// Succeed records that the effect happened, with value as its result: it
// must encode as JSON within Config.MaxResultBytes, and every duplicate
// gets it back. A value that cannot be stored puts the action up for
// review (the effect happened, its result is lost) and is an error
// matching ErrResultTooLarge or ErrResultNotJSON.
//
// Succeed and the other settling methods are fenced (a superseded
// attempt's outcome is refused: *FencedError), written with a token and
// read back when the reply is lost, and tried for Config.RecordTimeout
// while the database is out of reach (*RecordError: recovery decides
// when the lease lapses). Calling one again, in this process or on an
// attempt rebuilt elsewhere, gives the same answer; calling another
// after one applied is a *ConflictError. An outcome that comes after
// recovery decided while the attempt was cut off is recorded over the
// decision, as Do's is.
func (a Attempt) Succeed(ctx context.Context, value any) error {
	return a.settle(ctx, StatusSucceeded, value, nil)
}

// Fail records that the effect did not happen and never will: a
// permanent failure, with err's text stored and given to every duplicate
// as a *FailedError. See Succeed for how settling is written.
func (a Attempt) Fail(ctx context.Context, err error) error {
	if err == nil {
		return errors.New("once: Fail needs the error that failed the effect")
	}
	return a.settle(ctx, StatusFailed, nil, Permanent(err))
}

// Release records that the effect did not happen, for cause: the next
// delivery claims the action again, with the same provider key. See
// Succeed for how settling is written.
func (a Attempt) Release(ctx context.Context, cause error) error {
	if cause == nil {
		return errors.New("once: Release needs the cause")
	}
	return a.settle(ctx, StatusReleased, nil, RetryLater(cause))
}

// Unknown records that the effect's outcome is unknown (it may have
// happened), for err: the kind's recovery decides what it becomes, as
// for an effect in Do that returns a plain error. See Succeed for how
// settling is written.
func (a Attempt) Unknown(ctx context.Context, err error) error {
	if err == nil {
		return errors.New("once: Unknown needs the error that left the outcome unknown")
	}
	return a.settle(ctx, StatusUnknown, nil, unknownErr{err})
}

// unknownErr is an error recorded as an unknown outcome, whatever it
// wraps: Unknown says so, not the error.
type unknownErr struct{ err error }

func (e unknownErr) Error() string { return e.err.Error() }

var errNotHeld = errors.New("once: this Attempt holds no claim (it was made by hand); claim one with Client.Claim, or rebuild it with Client.Attempt")

// settle records the outcome a settling method was asked for, once.
func (a Attempt) settle(ctx context.Context, want Status, value any, ferr error) error {
	h := a.h
	switch {
	case h == nil:
		return errNotHeld
	case h.byDo:
		return fmt.Errorf("once: attempt %d of action %s is Do's to settle; return the outcome from the effect instead", a.Number, a.Key)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if d := h.done; d != nil {
		if d.to == want || errors.Is(d.err, ErrFenced) {
			// A superseded attempt settles nothing, whatever is asked.
			return d.err
		}
		// The status the outcome left the row in: an unknown outcome
		// is review, released or unknown by the kind's recovery
		// (TestClient/ReviewConflictNamesWhereTheRowWent).
		return &ConflictError{Op: "settle as " + string(want), Current: Action{Key: a.Key, Attempt: a.Number, Status: d.status}}
	}
	s := h.c.settle(ctx, h.pol, h.a, value, ferr, a.noter.noted(), time.Since(h.started))
	err := s.err
	if err == nil && s.resultErr != nil {
		err = fmt.Errorf("once: action %s: %w; it was put up for review", a.Key, s.resultErr)
	}
	if s.found && h.unrecorded {
		// An earlier call of this attempt wrote it, with its reply lost
		// past RecordTimeout: the hooks hear of it now, once
		// (TestClient/FaultReviewRetriedSettleReachesHooks).
		h.c.emit(ctx, s.obs)
	}
	h.unrecorded = h.unrecorded || errors.Is(err, ErrNotRecorded)
	var conflict *ConflictError
	if !errors.As(err, &conflict) && !errors.Is(err, ErrNotRecorded) {
		// A write that may yet apply is not an answer: calling again
		// tries again.
		h.done = &settlement{to: want, status: s.t.To, err: err}
	}
	return err
}

// Settled reports the status this attempt's outcome left its action in,
// once a settling method recorded it without error: succeeded, failed,
// released, or what the kind's recovery made of an unknown outcome
// (unknown, review, released). ok is false before then.
func (a Attempt) Settled() (status Status, ok bool) {
	if a.h == nil {
		return "", false
	}
	a.h.mu.Lock()
	defer a.h.mu.Unlock()
	if d := a.h.done; d != nil && d.err == nil {
		return d.status, true
	}
	return "", false
}

// settleToken is the token an attempt's outcome to is written with,
// made from the claim's token: settling again, in any process that holds
// the claim's token, recognises its own write.
func settleToken(claim string, to Status) string {
	sum := sha256.Sum256([]byte(claim + "\x00" + string(to)))
	return base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:16])
}

// settledAs reports whether cur carries an outcome written by the
// attempt whose claim's token is claim, and which.
func settledAs(cur Action, claim string) (Status, bool) {
	if claim == "" {
		return "", false
	}
	for _, s := range Statuses() {
		if cur.Token == settleToken(claim, s) {
			return s, true
		}
	}
	return "", false
}
