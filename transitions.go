package once

import "slices"

// A move is one row of the state machine: a change of an action's row
// that the engine may ask a store for, who asks, and the event it
// writes. Every Transition the engine writes is made by a move's of, so
// From, To and the event's type are written once, here. Adding a status
// is adding rows. docs/state_machine.md carries the table, generated
// from this one (TestStateMachineTable holds the two together).
type move struct {
	name string
	from []Status
	// to is where the row goes; empty keeps the status (a verifier's
	// backoff).
	to Status
	// by is who makes it: ActorWorker, ActorReaper, byRecoverer (a
	// worker recovering inline, or a reaper) or byPerson.
	by string
	// event is the event written with it; empty writes none.
	event EventType
	// newAttempt takes the action over as the next attempt.
	newAttempt bool
	// why says when the move is made, for the table in the docs.
	why string
}

// Who makes a move, beside ActorWorker and ActorReaper.
const (
	byRecoverer = "worker or reaper"
	byPerson    = "person"
)

var (
	fromInFlight   = []Status{StatusInFlight}
	fromRecovering = []Status{StatusInFlight, StatusUnknown}
	fromDecided    = []Status{StatusReview, StatusReleased, StatusFailed}
)

// The moves. The claim itself (no row, or a released row with the same
// fingerprint, to in_flight) is Store.Claim's, not a Transition: claims
// lists it for the table.
var (
	// An attempt's outcome, from its claim.
	succeed     = move{name: "succeed", from: fromInFlight, to: StatusSucceeded, by: ActorWorker, event: EventSucceeded, why: "the effect returned a value that was stored"}
	fail        = move{name: "fail", from: fromInFlight, to: StatusFailed, by: ActorWorker, event: EventFailed, why: "the effect returned Permanent(err)"}
	release     = move{name: "release", from: fromInFlight, to: StatusReleased, by: ActorWorker, event: EventReleased, why: "RetryLater(err); an unknown outcome under RetryWithProviderKey; a claim given up before its effect ran"}
	putToReview = move{name: "put to review", from: fromInFlight, to: StatusReview, by: ActorWorker, event: EventReview, why: "an unknown outcome under AskPerson; a value that cannot be stored; a third panic"}
	markUnknown = move{name: "mark unknown", from: fromInFlight, to: StatusUnknown, by: ActorWorker, event: EventUnknown, why: "an unknown outcome under VerifyThenDecide; a takeover that never ran"}
	verifyFirst = move{name: "verified before run", from: fromInFlight, to: StatusSucceeded, by: ActorWorker, event: EventVerified, why: "a released action's next attempt, before it runs: the verifier found an earlier attempt landed"}
	writeNote   = move{name: "note", from: fromInFlight, to: StatusInFlight, by: ActorWorker, why: "Attempt.Note: the in-flight row's error, and its lease renewed"}

	// A late outcome of the same attempt, over a decision taken while
	// it was cut off.
	succeedLate = move{name: "succeed late", from: fromDecided, to: StatusSucceeded, by: ActorWorker, event: EventSucceeded, why: "a slow worker's success, after recovery or a person decided and no newer attempt claimed"}
	failLate    = move{name: "fail late", from: fromDecided, to: StatusFailed, by: ActorWorker, event: EventFailed, why: "a slow worker's permanent failure, likewise"}

	// Recovery of a lapsed claim or a due unknown outcome, under the
	// hold its recoverer took.
	takeOver        = move{name: "take over", from: fromRecovering, to: StatusInFlight, by: ActorWorker, event: EventTakenOver, newAttempt: true, why: "a worker recovering inline retries (RetryWithProviderKey, or the verifier found no trace)"}
	recoverRelease  = move{name: "recover: release", from: fromRecovering, to: StatusReleased, by: ActorReaper, event: EventReleased, why: "a reaper retries, for the next delivery"}
	recoverReview   = move{name: "recover: review", from: fromRecovering, to: StatusReview, by: byRecoverer, event: EventReview, why: "AskPerson; a verifier that gave up or found a result that cannot be stored"}
	recoverVerified = move{name: "recover: verified", from: fromRecovering, to: StatusSucceeded, by: byRecoverer, event: EventVerified, why: "the verifier found the effect landed"}
	verifyLater     = move{name: "recover: verify later", from: fromRecovering, by: byRecoverer, event: EventVerifyFailed, why: "the verifier could not tell; asked again after a backoff"}

	// A reaper hands a released action that waited too long to its
	// kind's Redrive hook.
	// It keeps the status (approved stays approved).
	redrive = move{name: "re-drive", from: []Status{StatusReleased, StatusApproved}, by: ActorReaper, event: EventRedriven, why: "released or approved, and not claimed for RedriveAfter"}

	// An approval gate (KindPolicy.Approval): a person's decision before
	// the effect runs (Client.Approve, Client.Reject), or the reaper's
	// when nobody decided in time.
	approve      = move{name: "approve", from: []Status{StatusAwaitingApproval}, to: StatusApproved, by: byPerson, event: EventApproved, why: "Client.Approve, before the wait expired, of the payload the person saw"}
	reject       = move{name: "reject", from: []Status{StatusAwaitingApproval}, to: StatusFailed, by: byPerson, event: EventRejected, why: "Client.Reject, before the wait expired: every duplicate gets the rejection"}
	expireFail   = move{name: "expire: fail", from: []Status{StatusAwaitingApproval}, to: StatusFailed, by: ActorReaper, event: EventExpired, why: "nobody decided before the wait expired (OnExpiry StatusFailed, the default)"}
	expireReview = move{name: "expire: review", from: []Status{StatusAwaitingApproval}, to: StatusReview, by: ActorReaper, event: EventExpired, why: "nobody decided before the wait expired (OnExpiry StatusReview)"}

	// A person's decision (Client.Resolve).
	resolveDone    = move{name: "resolve: done", from: ResolvableStatuses(), to: StatusSucceeded, by: byPerson, event: EventResolved, why: "DecisionDone, with the person's result"}
	resolveRetry   = move{name: "resolve: retry", from: ResolvableStatuses(), to: StatusReleased, by: byPerson, event: EventResolved, why: "DecisionRetry: the next delivery runs it"}
	resolveAbandon = move{name: "resolve: abandon", from: ResolvableStatuses(), to: StatusFailed, by: byPerson, event: EventResolved, why: "DecisionAbandon"}
)

// claims are the store's moves: Store.Claim, not a Transition.
var claims = []move{
	{name: "claim", to: StatusInFlight, by: ActorWorker, event: EventClaimed, why: "a new key (the event is the row itself)"},
	{name: "claim again", from: []Status{StatusReleased}, to: StatusInFlight, by: ActorWorker, event: EventClaimed, newAttempt: true, why: "a released key with the same fingerprint"},
	{name: "claim, awaiting approval", to: StatusAwaitingApproval, by: ActorWorker, event: EventClaimed, why: "a new key of a kind that asks for approval: nothing runs, no lease is held (the event is the row itself)"},
	{name: "claim approved", from: []Status{StatusApproved}, to: StatusInFlight, by: ActorWorker, event: EventClaimed, newAttempt: true, why: "an approved key with the same fingerprint: the approved payload runs, once"},
}

// moves is the table, in the order the docs list it.
func moves() []move {
	return append(slices.Clone(claims),
		succeed, fail, release, putToReview, markUnknown, verifyFirst, writeNote,
		succeedLate, failLate,
		takeOver, recoverRelease, recoverReview, recoverVerified, verifyLater,
		redrive,
		approve, reject, expireFail, expireReview,
		resolveDone, resolveRetry, resolveAbandon)
}

// of is the Transition that makes m on a, as actor: fenced by a's
// attempt and, when m may start from it, a's status (the row as the
// caller saw it), with m's event. The caller adds what m writes (a
// result, an error, a lease, a hold).
func (m move) of(a Action, actor string) Transition {
	from := m.from
	if slices.Contains(m.from, a.Status) {
		from = []Status{a.Status}
	}
	to := m.to
	if to == "" {
		to = a.Status
	}
	t := Transition{Key: a.Key, Attempt: a.Attempt, From: from, To: to, NewAttempt: m.newAttempt}
	if m.event != "" {
		t.Event = Event{Key: a.Key, Type: m.event, Attempt: a.Attempt, From: from[0], To: to, Actor: actor}
		if m.newAttempt {
			// The trail names the attempt a takeover starts; so do
			// hooks.
			t.Event.Attempt++
		}
	}
	return t
}

// noting sets t's error and its event's note to text.
func (t Transition) noting(text string) Transition {
	t.Error, t.Event.Note = text, text
	return t
}
