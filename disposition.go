package once

import (
	"errors"
	"fmt"
	"time"
)

// JobAction is what a worker does with the job it took from its queue,
// once Do has returned.
type JobAction int

const (
	// JobAck: the job is finished — the effect happened, was replayed,
	// or failed for good. Acknowledge it.
	JobAck JobAction = iota
	// JobRetry: put the job back (nack, or redeliver later). Its action
	// is not finished and needs a later delivery to finish it: the effect
	// did not happen yet, another attempt holds it, or recovery still has
	// to decide.
	JobRetry
	// JobDrop: take the job off the queue without calling it done: a
	// person decides from here (review), or the job itself is wrong (a
	// changed payload, an invalid intent). Send it to a dead-letter queue
	// if you keep one; if a person later chooses Retry, the kind's
	// Redrive hook publishes it again.
	JobDrop
)

// String returns "ack", "retry" or "drop": the words the adapters'
// logs and once's metrics use for the action (the "action" attribute of
// natsjs's line per settled message, say). A value outside the three is
// "JobAction(?)". The broker's own word for each (DoubleAck, Nak, Term;
// Ack, Reject; completed, snoozed, cancelled) is the adapter's.
func (a JobAction) String() string {
	switch a {
	case JobAck:
		return "ack"
	case JobRetry:
		return "retry"
	case JobDrop:
		return "drop"
	}
	return "JobAction(?)"
}

// Disposition says what to do with a job after Do, and why.
type Disposition struct {
	Action JobAction
	// After, with JobRetry, is how long to wait before the next delivery
	// can do anything: until a lease runs out, or a verifier is due.
	// Zero means at once, or the queue's own backoff.
	After time.Duration
	// Reason says why, for a log line.
	Reason string
}

// Dispose tells a worker what to do with its job given what Do (or
// DoTx) returned, so no worker has to know the error matrix:
//
//	err == nil                               ack
//	*FailedError (ErrFailed)                 ack: failed for good, recorded
//	*FencedError, outcome succeeded/failed   ack: the effect's fate is known; the action moved on
//	*FencedError, any other outcome          retry: the next delivery finds where the action stands
//	*InFlightError (ErrInFlight)             retry after the lease runs out
//	ErrRetryLater (released)                 retry: the next delivery runs it
//	*UnknownOutcomeError, released           retry: the next delivery runs it with the same provider key
//	*UnknownOutcomeError, awaiting verifier  retry when it is due: the next delivery asks the verifier
//	*RecordError (ErrNotRecorded)            retry: the next delivery finds the claim and recovery decides
//	ErrUnavailable                           retry after a second: nothing ran here
//	*DecodeError (ErrResultUndecodable)      drop: the effect happened; its stored result does not decode,
//	                                         and every delivery would fail alike (the job's later steps
//	                                         wait in the dead-letter queue)
//	*ReviewError, *UnknownOutcomeError in review, ErrResultTooLarge, ErrResultNotJSON
//	                                         drop: a person decides
//	*FingerprintError, *IntentError          drop: the job is wrong; retrying changes nothing
//	Permanent(err) from a DoTx effect, or    drop: it fails again on every delivery, and
//	from the job's own code before any Do    nothing recorded it (roll a DoTx back)
//	(a job that does not decode)
//	anything else (the database unreachable, a cancelled context)
//	                                         retry
//
// Acking on an unknown outcome that awaits verification would lose the
// effect when the verifier then finds it did not happen: nobody would
// deliver the job again.
//
// Several errors joined (errors.Join, or fmt.Errorf with several %w: a
// job of independent steps that reports them all) are disposed one by
// one, and the job is retried if any of them needs it (after the
// shortest wait), dropped if any asks a person, and acked only if all
// are done: one step's failure must not settle a job whose other step
// still needs a delivery.
func Dispose(err error) Disposition {
	if errs := joined(err); len(errs) > 0 {
		return disposeAll(errs)
	}
	var (
		inFlight *InFlightError
		unknown  *UnknownOutcomeError
		fenced   *FencedError
		record   *RecordError
		awaiting *AwaitingApprovalError
	)
	switch {
	case err == nil:
		return Disposition{Action: JobAck, Reason: "done"}
	case errors.As(err, &record):
		return Disposition{Action: JobRetry, Reason: "the outcome could not be recorded; the next delivery finds the claim and recovery decides"}
	case errors.As(err, &fenced):
		if fenced.Outcome == StatusSucceeded || fenced.Outcome == StatusFailed {
			// This worker knows how the effect ended; the action moved
			// on (a newer attempt, or it was purged): nothing to finish.
			return Disposition{Action: JobAck, Reason: "superseded after the effect's outcome was known (" + string(fenced.Outcome) + ")"}
		}
		// Superseded with the outcome unknown or unrun: recovery may
		// have released it with nobody to deliver it again. A retried
		// delivery is harmless: it replays, meets the claim, or runs the
		// released action.
		return Disposition{Action: JobRetry, Reason: "superseded before its outcome was known; the next delivery finds where the action stands"}
	case errors.As(err, &inFlight):
		if inFlight.Expired {
			// Recovery is due (inline on the next delivery, or by a
			// process that holds the kind's verifier): come back soon,
			// not at once.
			return Disposition{Action: JobRetry, After: time.Second, Reason: "the claim's lease ran out; recovery decides on a later delivery"}
		}
		if inFlight.InTransaction {
			// An uncommitted DoTx holds the key: it commits or rolls
			// back within its own transaction's time, with no lease to
			// wait for.
			return Disposition{Action: JobRetry, After: time.Second, Reason: "another transaction is claiming the key; the next delivery finds its outcome"}
		}
		d := max(time.Until(inFlight.LeaseUntil), 0)
		return Disposition{Action: JobRetry, After: d, Reason: "another attempt holds the claim until its lease runs out"}
	case errors.As(err, &unknown):
		switch unknown.Status {
		case StatusReleased:
			return Disposition{Action: JobRetry, Reason: "outcome unknown and released: the next delivery runs it again with the same provider key"}
		case StatusReview:
			return Disposition{Action: JobDrop, Reason: "outcome unknown: a person decides"}
		default:
			d := time.Until(unknown.Due)
			if d < 0 {
				d = 0
			}
			return Disposition{Action: JobRetry, After: d, Reason: "outcome unknown: the next delivery asks the verifier"}
		}
	case errors.As(err, &awaiting):
		switch {
		case awaiting.Expired:
			return Disposition{Action: JobDrop, Reason: "its wait for approval expired unanswered; the reaper records it, and it does not run"}
		case awaiting.Redrive:
			return Disposition{Action: JobDrop, Reason: "awaits a person's approval; once approved, the kind's Redrive hook runs it"}
		}
		// Come back now and then, and just after the wait expires.
		d := time.Minute
		if left := time.Until(awaiting.Expires); left > 0 && left < d {
			d = left + time.Second
		}
		return Disposition{Action: JobRetry, After: d, Reason: "awaits a person's approval; a delivery after it is approved runs it"}
	case errors.Is(err, ErrFailed):
		return Disposition{Action: JobAck, Reason: "failed for good; recorded"}
	case errors.Is(err, ErrPermanent) && classify(err) == StatusFailed:
		// Do never returns a Permanent error as it is: it comes from a
		// DoTx effect (the transaction rolls back and nothing is
		// recorded), or from the job's own code refusing the job before
		// any Do (its body does not decode). The error says which; the
		// dead-letter queue is its only trace. A Permanent mark under a
		// RetryLater one is not the effect's last word: Do released such
		// an action, and the next delivery runs it.
		return Disposition{Action: JobDrop, Reason: "failed for good, and nothing recorded it: " + err.Error()}
	case errors.Is(err, ErrRetryLater):
		return Disposition{Action: JobRetry, Reason: "did not happen; released for the next delivery"}
	case errors.Is(err, ErrUnavailable):
		return Disposition{Action: JobRetry, After: time.Second, Reason: "the store could not be reached; nothing ran here"}
	case errors.Is(err, ErrReview):
		return Disposition{Action: JobDrop, Reason: "a person decides"}
	case errors.Is(err, ErrResultUndecodable):
		// Every delivery would fail alike: a retry would circle the
		// queue for ever. The job keeps its later steps in the
		// dead-letter queue, for a delivery once the types agree.
		return Disposition{Action: JobDrop, Reason: "the effect happened, but its stored result does not decode into the type Do asked for: a person decides; deliver the job again once the types agree"}
	case errors.Is(err, ErrResultTooLarge), errors.Is(err, ErrResultNotJSON):
		return Disposition{Action: JobDrop, Reason: "the result cannot be stored: a person decides (in DoTx, nothing was recorded; roll back)"}
	case errors.Is(err, ErrFingerprintMismatch), errors.Is(err, ErrInvalidIntent):
		return Disposition{Action: JobDrop, Reason: "the job is wrong; delivering it again changes nothing"}
	default:
		return Disposition{Action: JobRetry, Reason: "not carried out: " + err.Error()}
	}
}

// joined returns the errors joined in err, found by following its single
// wrappings down to the first error that joins several; nil if none does.
func joined(err error) []error {
	for err != nil {
		switch e := err.(type) {
		case interface{ Unwrap() []error }:
			return e.Unwrap()
		case interface{ Unwrap() error }:
			err = e.Unwrap()
		default:
			return nil
		}
	}
	return nil
}

// disposeAll is Dispose for several errors: the most cautious action
// among theirs (retry, then drop, then ack).
func disposeAll(errs []error) Disposition {
	var retry, drop, ack *Disposition
	n := 0
	actions := map[JobAction]bool{}
	for _, e := range errs {
		if e == nil {
			continue
		}
		n++
		d := Dispose(e)
		actions[d.Action] = true
		switch {
		case d.Action == JobRetry && (retry == nil || d.After < retry.After):
			retry = &d
		case d.Action == JobDrop && drop == nil:
			drop = &d
		case d.Action == JobAck && ack == nil:
			ack = &d
		}
	}
	var d Disposition
	switch {
	case n == 0:
		return Disposition{Action: JobAck, Reason: "done"}
	case retry != nil:
		d = *retry
	case drop != nil:
		d = *drop
	default:
		d = *ack
	}
	if len(actions) > 1 {
		d.Reason = fmt.Sprintf("%s (the most cautious of %d joined errors)", d.Reason, n)
	}
	return d
}
