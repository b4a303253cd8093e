package once

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Sentinels for the conditions a caller branches on. Each typed error
// below matches its own sentinel with errors.Is (an *UnknownOutcomeError
// also matches ErrRetryLater or ErrReview, by what recovery made of it),
// and carries the detail (key, attempt, timestamps) for errors.As.
var (
	// ErrInvalidIntent: the intent was refused before any I/O.
	ErrInvalidIntent = errors.New("once: invalid intent")
	// ErrInFlight: another attempt holds the claim. Return the job to its
	// queue; a later delivery will replay the result or recover the claim.
	ErrInFlight = errors.New("once: action in flight")
	// ErrFingerprintMismatch: the key was seen before with a different
	// payload. The action was not executed.
	ErrFingerprintMismatch = errors.New("once: payload differs from the first attempt")
	// ErrFailed: the effect failed permanently (it did not happen and will
	// not be retried). Duplicates get the stored failure back.
	ErrFailed = errors.New("once: action failed permanently")
	// ErrOutcomeUnknown: the effect returned an unclassified error (or
	// panicked, or ran past its deadline), so it may or may not have
	// happened. The kind's recovery decided what became of it, and the
	// *UnknownOutcomeError says which: put up for review (AskPerson),
	// released for the next delivery to retry with the same provider key
	// (RetryWithProviderKey), or StatusUnknown, waiting for the Verifier
	// (VerifyThenDecide).
	ErrOutcomeUnknown = errors.New("once: outcome unknown")
	// ErrReview: the action waits for a person to decide.
	ErrReview = errors.New("once: action awaits review")
	// ErrFenced: this attempt was superseded by a newer one; its outcome
	// was not recorded.
	ErrFenced = errors.New("once: attempt superseded")
	// ErrNotRecorded: the attempt ended but its outcome could not be
	// written (the database went away): the effect ran; or, when the
	// *RecordError's Outcome is released, nothing happened; or, when it
	// is unknown and the error says nothing ran, this attempt, a
	// takeover, never started, and an earlier attempt's effect may have
	// happened. The claim stays in flight until its lease expires and
	// recovery applies, so the effect is not repeated.
	ErrNotRecorded = errors.New("once: outcome not recorded")
	// ErrRetryLater: the effect reported that it did not happen and may be
	// retried; the claim was released for the next delivery.
	ErrRetryLater = errors.New("once: did not happen, retry later")
	// ErrResultTooLarge: the effect succeeded but its result exceeds
	// Config.MaxResultBytes. The action is put up for review rather than
	// re-executed, and Do returns the value with the error.
	ErrResultTooLarge = errors.New("once: result too large to store")
	// ErrResultNotJSON: the effect succeeded but its result cannot be
	// encoded as JSON. As with ErrResultTooLarge, the action is put up for
	// review and Do returns the value with the error.
	ErrResultNotJSON = errors.New("once: result cannot be encoded as JSON")
	// ErrPermanent matches an error made with Permanent, so an effect's
	// own tests can assert how it classified a failure.
	ErrPermanent = errors.New("once: permanent failure")
	// ErrRejected: the database refused the data itself (a value it
	// cannot hold, a constraint), not an outage: sending it again gets
	// the same answer. Stores wrap such errors so they match it, and the
	// engine records a placeholder instead of retrying.
	ErrRejected = errors.New("once: the database refused the data")
	// ErrNotFound: no action has this key.
	ErrNotFound = errors.New("once: action not found")
	// ErrUnavailable: the store could not be reached. A claim and the
	// read of its row that followed both went unanswered, so nothing
	// ran here, and whether the claim was written is not known: the
	// next delivery finds out. Retry the job.
	ErrUnavailable = errors.New("once: the store could not be reached")
	// ErrResultUndecodable: the action succeeded, and its stored result
	// (the first attempt's, a person's, or what a verifier found) does
	// not decode into Do's type. The effect happened and is not run
	// again; see *DecodeError.
	ErrResultUndecodable = errors.New("once: stored result does not decode")
)

// IntentError says which field of an intent is wrong and why.
type IntentError struct {
	Field  string
	Reason string
}

func (e *IntentError) Error() string {
	return fmt.Sprintf("once: invalid intent: %s %s", e.Field, e.Reason)
}
func (e *IntentError) Is(target error) bool { return target == ErrInvalidIntent }

// InFlightError reports a claim held by another attempt.
type InFlightError struct {
	Key        Key
	Attempt    int
	ClaimedAt  time.Time
	LeaseUntil time.Time
	// Expired is true when the lease had run out by the database's clock:
	// the worker holding it is probably dead and recovery applies.
	Expired bool
	// InTransaction is true when the claim waited Config.ClaimTimeout on
	// a key that a transaction not yet committed holds (a DoTx claiming
	// it, or claiming a released action again), or on the database's
	// write lock; no row was visible to read, or only the released one
	// (whose attempt Attempt is).
	InTransaction bool
	// Waited is how long the call waited for the other attempt's outcome
	// (WaitFor) before it gave up; zero when it did not wait.
	Waited time.Duration
}

func (e *InFlightError) Error() string {
	waited := ""
	if e.Waited > 0 {
		waited = fmt.Sprintf(" after waiting %v", e.Waited.Round(time.Millisecond))
	}
	if e.InTransaction {
		return fmt.Sprintf("once: action %s is being claimed in a transaction that has not committed (DoTx), or the database is busy%s; return the job to its queue and try later", e.Key, waited)
	}
	state := "lease held until " + e.LeaseUntil.UTC().Format(time.RFC3339)
	if e.Expired {
		state = "lease expired at " + e.LeaseUntil.UTC().Format(time.RFC3339) + "; awaiting recovery"
	}
	return fmt.Sprintf("once: action %s in flight (attempt %d claimed %s, %s)%s; return the job to its queue and try later",
		e.Key, e.Attempt, e.ClaimedAt.UTC().Format(time.RFC3339), state, waited)
}
func (e *InFlightError) Is(target error) bool { return target == ErrInFlight }

// FingerprintError reports a payload that differs from the one first seen
// with the same key.
type FingerprintError struct {
	Key    Key
	Stored Fingerprint
	Got    Fingerprint
}

func (e *FingerprintError) Error() string {
	return fmt.Sprintf("once: action %s was first attempted with payload %.12s…, this attempt has %.12s…; it was not executed. Use a new step for a different effect, or set Intent.PayloadInKey if the payload is part of the identity",
		e.Key, e.Stored, e.Got)
}
func (e *FingerprintError) Is(target error) bool { return target == ErrFingerprintMismatch }

// FailedError is a permanent failure, as the effect reported it or as it
// was stored by the first attempt.
type FailedError struct {
	Key     Key
	Attempt int
	Message string
	// Replayed is true when the failure was read back from the store
	// rather than returned by this call's effect.
	Replayed bool
	// RejectedBy and Reason, for an action a person rejected before it
	// ran (Client.Reject), say who and why; empty for any other
	// failure.
	RejectedBy string
	Reason     string
	err        error
}

func (e *FailedError) Error() string {
	return fmt.Sprintf("once: action %s failed permanently (attempt %d): %s", e.Key, e.Attempt, e.Message)
}
func (e *FailedError) Is(target error) bool { return target == ErrFailed }
func (e *FailedError) Unwrap() error        { return e.err }

// UnknownOutcomeError reports an effect whose outcome is not known, and
// what its kind's recovery made of it (Status). It matches
// ErrOutcomeUnknown, and also ErrRetryLater when the job must go back to
// its queue — the action was released for the next delivery, or awaits
// its verifier, which the next delivery asks — or ErrReview when it was
// put up for review (a person decides; the job can be dropped). Dispose
// says the same for every error Do returns.
type UnknownOutcomeError struct {
	Key     Key
	Attempt int
	Message string
	// Status is what the action became: StatusReview (AskPerson),
	// StatusReleased (RetryWithProviderKey), or StatusUnknown, awaiting
	// the verifier (VerifyThenDecide only).
	Status Status
	// Due, when Status is StatusUnknown, is when the verifier is next
	// due to be asked (by the database's clock).
	Due time.Time
	err error
}

func (e *UnknownOutcomeError) Error() string {
	next := "its kind's recovery decides; it is not re-executed until then"
	switch e.Status {
	case StatusReview:
		next = "it was put up for review and will not be re-executed"
	case StatusReleased:
		next = "it was released: return the job to its queue, and the next delivery retries it with the same provider key"
	}
	return fmt.Sprintf("once: action %s outcome unknown (attempt %d): %s; %s", e.Key, e.Attempt, e.Message, next)
}
func (e *UnknownOutcomeError) Is(target error) bool {
	return target == ErrOutcomeUnknown ||
		(target == ErrRetryLater && (e.Status == StatusReleased || e.Status == StatusUnknown)) ||
		(target == ErrReview && e.Status == StatusReview)
}
func (e *UnknownOutcomeError) Unwrap() error { return e.err }

// ReviewError reports an action that waits for a person.
type ReviewError struct {
	Key     Key
	Attempt int
	Reason  string
	// ApprovalExpired says it is in review because nobody approved it
	// before its wait expired (ApprovalPolicy.OnExpiry StatusReview):
	// nothing ran.
	ApprovalExpired bool
}

func (e *ReviewError) Error() string {
	return fmt.Sprintf("once: action %s awaits review (attempt %d): %s", e.Key, e.Attempt, e.Reason)
}
func (e *ReviewError) Is(target error) bool { return target == ErrReview }

// FencedError reports an attempt whose claim was taken over; its outcome
// was not recorded and must not be acted on as if it were.
type FencedError struct {
	Key     Key
	Attempt int
	Outcome Status
	// Unrun says the attempt's effect never ran: Outcome was what
	// recovery decided for it (a verifier's answer), or its release
	// unrun, not an outcome of the effect.
	Unrun bool
	// Lapsed says no heartbeat got through before the attempt's
	// deadline (Attempt.Heartbeat); Err is the last one's error. The
	// claim may still be this attempt's, but its effect must stop.
	Lapsed bool
	Err    error
}

func (e *FencedError) Error() string {
	if e.Lapsed {
		return fmt.Sprintf("once: attempt %d of action %s: no heartbeat got through before its deadline (%v); stop the effect, since recovery may take the action over", e.Attempt, e.Key, e.Err)
	}
	if e.Unrun {
		return fmt.Sprintf("once: attempt %d of action %s was superseded before its effect ran; nothing ran, and what it would have recorded (%s) was not",
			e.Attempt, e.Key, e.Outcome)
	}
	return fmt.Sprintf("once: attempt %d of action %s was superseded; its outcome (%s) was not recorded", e.Attempt, e.Key, e.Outcome)
}
func (e *FencedError) Is(target error) bool { return target == ErrFenced }
func (e *FencedError) Unwrap() error        { return e.Err }

// ErrReplayed: Claim met an action an earlier attempt completed; its
// stored result is in the *ReplayedError.
var ErrReplayed = errors.New("once: action already succeeded")

// ReplayedError is the answer Claim gives a duplicate of an action that
// succeeded: its stored result, for the caller to use as Do's replay
// would. It is an answer, not a failure: nothing is to be run.
type ReplayedError struct {
	Key     Key
	Attempt int
	// Result is the stored JSON result.
	Result json.RawMessage
}

func (e *ReplayedError) Error() string {
	return fmt.Sprintf("once: action %s already succeeded (attempt %d); its stored result is %d bytes, and nothing is to be run", e.Key, e.Attempt, len(e.Result))
}
func (e *ReplayedError) Is(target error) bool { return target == ErrReplayed }

// Decode decodes the stored result into v.
func (e *ReplayedError) Decode(v any) error {
	if err := json.Unmarshal(e.Result, v); err != nil {
		return &DecodeError{Key: e.Key, Attempt: e.Attempt, Type: fmt.Sprintf("%T", v), Result: e.Result, err: err}
	}
	return nil
}

// RecordError reports an outcome that could not be written.
type RecordError struct {
	Key     Key
	Attempt int
	Outcome Status
	Err     error
}

func (e *RecordError) Error() string {
	return fmt.Sprintf("once: action %s attempt %d ended %s but it could not be recorded: %v; the claim stays in flight and recovery applies when its lease expires",
		e.Key, e.Attempt, e.Outcome, e.Err)
}
func (e *RecordError) Is(target error) bool { return target == ErrNotRecorded }
func (e *RecordError) Unwrap() error        { return e.Err }

// DecodeError is ErrResultUndecodable: what did not decode, into which
// type. Every delivery of the job gets it, so Dispose drops the job (to
// the dead-letter queue, with the rest of its steps) for a person, who
// makes the type agree with the stored result and delivers it again.
type DecodeError struct {
	Key     Key
	Attempt int
	// Type is the type Do decodes into.
	Type string
	// Result is the stored JSON. The error's text gives only its size:
	// a result may hold what a log must not.
	Result json.RawMessage
	err    error
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("once: action %s (attempt %d) succeeded, but its stored result (%d bytes) does not decode into %s: %v; the effect happened and is not run again: decode it with the type the first attempt returned (a worker of the version that ran it replays it), then deliver the job again",
		e.Key, e.Attempt, len(e.Result), e.Type, e.err)
}
func (e *DecodeError) Is(target error) bool { return target == ErrResultUndecodable }
func (e *DecodeError) Unwrap() error        { return e.err }

// unavailableError is ErrUnavailable for one claim, with the error the
// claim got.
type unavailableError struct {
	key      Key
	kind     string
	patience time.Duration
	err      error
}

func (e *unavailableError) Error() string {
	return fmt.Sprintf("once: claiming action %s (%s): the store could not be reached: the claim failed (%v), and a read of its row got no answer in %v; nothing ran here: return the job to its queue and retry",
		e.key, e.kind, e.err, e.patience)
}
func (e *unavailableError) Is(target error) bool { return target == ErrUnavailable }
func (e *unavailableError) Unwrap() error        { return e.err }

// retryLaterError marks an effect error as "did not happen, retry later".
// It matches ErrRetryLater, as the error Do returns for it does.
type retryLaterError struct{ err error }

func (e *retryLaterError) Error() string        { return "did not happen, retry later: " + e.err.Error() }
func (e *retryLaterError) Is(target error) bool { return target == ErrRetryLater }
func (e *retryLaterError) Unwrap() error        { return e.err }

// permanentError marks an effect error as "did not happen, never retry".
type permanentError struct{ err error }

func (e *permanentError) Error() string        { return e.err.Error() }
func (e *permanentError) Is(target error) bool { return target == ErrPermanent }
func (e *permanentError) Unwrap() error        { return e.err }

// RetryLater marks an error from an effect as "did not happen, retry
// later": the provider refused before acting (a 429, a connection refused
// before the request was sent). The claim is released so the next delivery
// claims again. Only use it when you know the effect did not happen.
// Over an error that is already marked (Permanent, by a library the
// effect calls), the outermost mark is the one that counts.
func RetryLater(err error) error {
	if err == nil {
		err = errors.New("retry later")
	}
	return &retryLaterError{err: err}
}

// Permanent marks an error from an effect as "did not happen, never
// retry" (an invalid address, a declined card). The failure is stored and
// every duplicate gets it back. The marked error matches ErrPermanent;
// what Do returns for it is a *FailedError, which matches ErrFailed.
// Over an error a library marked RetryLater (an effect giving up after
// too many deferrals), Permanent is the effect's last word: the action
// fails for good.
func Permanent(err error) error {
	if err == nil {
		err = errors.New("permanent failure")
	}
	return &permanentError{err: err}
}

// mark is what RetryLater and Permanent put on an error.
type mark interface{ markedAs() Status }

func (*retryLaterError) markedAs() Status { return StatusReleased }
func (*permanentError) markedAs() Status  { return StatusFailed }

// classify maps an effect's error onto the status it leads to. When the
// chain holds both marks — Permanent over an error a library marked
// RetryLater (giving up on a deferral), or RetryLater over one it marked
// Permanent — the outermost is the effect's own last word, and wins.
func classify(err error) Status {
	if err == nil {
		return StatusSucceeded
	}
	var m mark
	if errors.As(err, &m) {
		return m.markedAs()
	}
	return StatusUnknown
}

// ErrConflict: a resolution or recovery met an action that changed under
// it (a late worker finished first, or someone else resolved it).
var ErrConflict = errors.New("once: action changed concurrently")

// ConflictError reports an operation refused because the action had moved
// on; Current is the action as it now stands.
type ConflictError struct {
	Op      string
	Current Action
	// why, when set, says why (an approval's refusal: who decided
	// first, or the wait's expiry).
	why string
}

func (e *ConflictError) Error() string {
	if e.why != "" {
		return fmt.Sprintf("once: %s refused: %s", e.Op, e.why)
	}
	if strings.HasPrefix(e.Op, "resolve") && e.Current.Status == StatusSucceeded {
		// Done for good: no decision is left to take, on any page.
		by := ""
		if e.Current.ResolvedBy != "" {
			by = ", marked done by " + e.Current.ResolvedBy
		}
		return fmt.Sprintf("once: %s refused: action %s succeeded (attempt %d%s); there is nothing to resolve: its result is stored, and every duplicate gets it back",
			e.Op, e.Current.Key, e.Current.Attempt, by)
	}
	return fmt.Sprintf("once: %s refused: action %s is now %s (attempt %d); reload it and decide again",
		e.Op, e.Current.Key, e.Current.Status, e.Current.Attempt)
}
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// ErrInvalidResolution: a resolution was refused before any write.
var ErrInvalidResolution = errors.New("once: invalid resolution")

// ResolutionError says which field of a Resolution (or an Approval) is
// wrong and why.
type ResolutionError struct {
	Field  string
	Reason string
}

func (e *ResolutionError) Error() string {
	return fmt.Sprintf("once: invalid decision: %s %s", e.Field, e.Reason)
}
func (e *ResolutionError) Is(target error) bool { return target == ErrInvalidResolution }
