package once

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// rules are what one Recovery does, as answers the engine asks for: it
// never switches on the policy. Each Recovery has one implementation
// (askPerson, retryWithKey, verifyThenDecide); a new one is a new type
// here, and no store names one (they take what to select as data).
type rules interface {
	// unknown is the move that records an effect's unknown outcome,
	// and the lease it leaves: when recovery is next due, or zero.
	unknown() (move, time.Duration)
	// lapsed decides an action whose claim lapsed or whose unknown
	// outcome is due, which the caller holds.
	lapsed(d *deciding) (decision, json.RawMessage, error)
	// verifier is whom to ask, before a released action's next attempt
	// runs, whether an earlier attempt landed; nil asks nobody.
	verifier(pol KindPolicy) Verifier
	// unrunTakeover is the move that gives up a takeover whose effect
	// never ran.
	unrunTakeover() move
	// kindOnly reports whether only a process that holds the kind's
	// policy (its verifier) may decide the kind's actions.
	kindOnly() bool
	// hold is how long a recoverer keeps an action of pol to itself
	// while it decides.
	hold(pol KindPolicy) time.Duration
}

// rules returns r's rules; RecoveryDefault, unresolved, is AskPerson's.
func (r Recovery) rules() rules {
	switch r {
	case RetryWithProviderKey:
		return retryWithKey{}
	case VerifyThenDecide:
		return verifyThenDecide{}
	}
	return askPerson{}
}

// Recoveries are the recoveries an action may record, in their order.
func Recoveries() []Recovery { return []Recovery{AskPerson, RetryWithProviderKey, VerifyThenDecide} }

// KindOnly reports whether only a process that configures the kind (and
// so holds its verifier) may recover an action that recorded r. A store
// selects for Recoverable by it (RecoverRequest.Verifiable).
func (r Recovery) KindOnly() bool { return r.rules().kindOnly() }

// askPerson never re-executes: a person decides.
type askPerson struct{}

func (askPerson) unknown() (move, time.Duration)                        { return putToReview, 0 }
func (askPerson) lapsed(d *deciding) (decision, json.RawMessage, error) { return d.review(d.reason) }
func (askPerson) verifier(KindPolicy) Verifier                          { return nil }
func (askPerson) unrunTakeover() move                                   { return release }
func (askPerson) kindOnly() bool                                        { return false }
func (askPerson) hold(pol KindPolicy) time.Duration                     { return pol.Lease }

// retryWithKey re-executes with the same provider key, which the
// provider absorbs.
type retryWithKey struct{}

func (retryWithKey) unknown() (move, time.Duration) { return release, 0 }
func (retryWithKey) lapsed(d *deciding) (decision, json.RawMessage, error) {
	return d.retry(d.reason + "; retried with the same provider idempotency key")
}
func (retryWithKey) verifier(KindPolicy) Verifier      { return nil }
func (retryWithKey) unrunTakeover() move               { return release }
func (retryWithKey) kindOnly() bool                    { return false }
func (retryWithKey) hold(pol KindPolicy) time.Duration { return pol.Lease }

// verifyThenDecide asks the kind's verifier whether the effect landed.
type verifyThenDecide struct{}

// unknown leaves the outcome due for the verifier at once.
func (verifyThenDecide) unknown() (move, time.Duration) { return markUnknown, time.Millisecond }

func (verifyThenDecide) lapsed(d *deciding) (decision, json.RawMessage, error) {
	pol := d.pol
	if pol.Verifier == nil {
		// Recorded VerifyThenDecide, taken by a process that configures
		// the kind without a verifier (the application changed its
		// policy): it cannot ask the provider, and must not guess, so a
		// person decides. Processes that know nothing of the kind never
		// take such an action (Recoverable).
		d.reason = strings.TrimPrefix(d.reason+"; ", "; ") + fmt.Sprintf("recorded verify_then_decide, but this process configures %s without a verifier", d.a.Kind)
		d.recovery = AskPerson
		return askPerson{}.lapsed(d)
	}
	a := d.a
	vctx, cancel := context.WithTimeout(d.ctx, pol.MaxExecution)
	started := time.Now()
	landed, result, err := safeVerify(vctx, pol.Verifier, a)
	cancel()
	d.took = time.Since(started)
	if err != nil {
		n := a.VerifyFailures + 1
		if n >= pol.MaxVerifyFailures {
			return d.review(fmt.Sprintf("%s; the verifier could not tell %d times, last: %v", d.reason, n, err))
		}
		return d.verifyLater(n, err)
	}
	if landed {
		if why := d.c.unstorable(result); why != "" {
			return d.review(fmt.Sprintf("%s; the verifier says it landed but %s", d.reason, why))
		}
		return d.verified(result)
	}
	return d.retry(d.reason + "; the verifier found no trace of it")
}

func (verifyThenDecide) verifier(pol KindPolicy) Verifier { return pol.Verifier }

// unrunTakeover marks a takeover that never ran unknown, due at once:
// the attempt before it may yet land, and a release would let the next
// delivery run the effect without the verifier being asked again.
func (verifyThenDecide) unrunTakeover() move { return markUnknown }
func (verifyThenDecide) kindOnly() bool      { return true }

// hold covers the verifier's question, bounded by MaxExecution.
func (verifyThenDecide) hold(pol KindPolicy) time.Duration { return pol.MaxExecution + pol.Lease }
