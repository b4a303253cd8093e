package once

import (
	"context"
	"encoding/json"
	"slices"
	"time"
)

// Status is where an action stands.
type Status string

const (
	// StatusInFlight: claimed; an attempt is running and holds a lease.
	StatusInFlight Status = "in_flight"
	// StatusSucceeded: the effect happened; its result is stored and every
	// duplicate gets it back.
	StatusSucceeded Status = "succeeded"
	// StatusFailed: the effect definitely did not happen and will not be
	// retried; duplicates get the stored failure back.
	StatusFailed Status = "failed"
	// StatusUnknown: only under VerifyThenDecide, the effect returned an
	// unclassified error or panicked, so it may or may not have happened;
	// it waits for the kind's Verifier, which is due at once and asked
	// again with backoff while it cannot tell. It is not re-executed
	// unless the verifier finds no trace. Under AskPerson the same error
	// is recorded as StatusReview, under RetryWithProviderKey as
	// StatusReleased, and a claim whose worker died stays StatusInFlight
	// until recovery decides: none of them passes through StatusUnknown.
	StatusUnknown Status = "unknown"
	// StatusReview: the outcome is unknown and a person must decide.
	StatusReview Status = "review"
	// StatusReleased: the effect did not happen and the next attempt may
	// claim the key again.
	StatusReleased Status = "released"
	// StatusAwaitingApproval: the kind asks a person before it runs
	// (KindPolicy.Approval). The first claim wrote the row here, and
	// nothing ran; no lease is held. LeaseUntil is when the wait
	// expires.
	StatusAwaitingApproval Status = "awaiting_approval"
	// StatusApproved: a person approved it (Client.Approve), and the
	// next delivery with the same payload claims and runs it, once.
	StatusApproved Status = "approved"
)

// Statuses returns every status, in the order an operator reads them.
func Statuses() []Status {
	return []Status{StatusAwaitingApproval, StatusApproved, StatusInFlight, StatusUnknown, StatusReview, StatusReleased, StatusSucceeded, StatusFailed}
}

// Claimable reports whether a claim with the row's payload takes an
// action in status s as its next attempt: released, or approved.
func (s Status) Claimable() bool { return s == StatusReleased || s == StatusApproved }

// Valid reports whether s is one of the statuses above.
func (s Status) Valid() bool { return slices.Contains(Statuses(), s) }

// Actors that are not a person. A person's decision names the person.
const (
	// ActorWorker is a worker in Do or DoTx.
	ActorWorker = "worker"
	// ActorReaper is a Reaper's pass.
	ActorReaper = "reaper"
)

// Action is one row of the action log.
type Action struct {
	Key         Key
	Fingerprint Fingerprint
	Run         string
	Step        int64
	Kind        string
	Target      string
	// Payload is the canonical payload, kept so that a person reviewing
	// the action can see what was about to be sent.
	Payload []byte
	Status  Status
	// Attempt is the fencing number: 1 for the first claim, one more for
	// every claim after a release or a takeover.
	Attempt int
	// Result is the stored JSON result of a succeeded action.
	Result json.RawMessage
	// Error is the message of the last failure, unknown outcome or the
	// reason for review.
	Error string
	// LeaseUntil is when an in-flight claim lapses, or when an unknown
	// outcome is next due for recovery; zero otherwise.
	LeaseUntil  time.Time
	CreatedAt   time.Time
	ClaimedAt   time.Time
	UpdatedAt   time.Time
	CompletedAt time.Time
	// VerifyFailures counts verifier errors since the attempt began.
	VerifyFailures int
	// ResolvedBy, ResolvedAt and ResolveNote record a person's decision.
	ResolvedBy  string
	ResolvedAt  time.Time
	ResolveNote string
	// Token is the token of the last write that set one (a claim, a
	// takeover, an outcome, a resolution): a writer whose reply was lost
	// reads the row back and knows whether its write applied. While an
	// attempt is in flight it is the claim's token, which rebuilds the
	// attempt (Client.Attempt): show it to nobody who may not settle it.
	// The console and the command never show it.
	Token string
	// Recovery is the recovery its kind had when it was last claimed:
	// every process that recovers it applies this, whatever kinds it was
	// told about. RecoveryDefault for rows written before it was
	// recorded.
	Recovery Recovery
	// Retention is how long its kind keeps it once finished, as recorded
	// at the claim; zero for rows written before it was recorded.
	Retention time.Duration
	// RetainUntil is when a finished action may be purged: its own
	// deadline, set when it finished. Zero while it is not finished.
	RetainUntil time.Time
	// RedriveAfter is how long, once released, it waits for a delivery
	// before it counts as waiting; Redrive says whether the application
	// that claimed it has a Redrive hook for its kind. Both are recorded
	// at the claim, so a process that knows nothing of the kind (once
	// serve) tells a released action its application will re-drive from
	// one nobody will.
	RedriveAfter time.Duration
	Redrive      bool
	// OnExpiry is, for an action whose first claim waited for approval,
	// where the wait goes when it expires unanswered: StatusFailed or
	// StatusReview. Empty for an action that never waited. Recorded at
	// the claim, so any process's reaper applies it.
	OnExpiry Status
}

// ClaimRequest asks a store to claim a key for a new attempt.
type ClaimRequest struct {
	Key         Key
	Fingerprint Fingerprint
	Run         string
	Step        int64
	Kind        string
	Target      string
	Payload     []byte
	// Lease is how long the claim is held without a heartbeat, counted
	// from the database's clock.
	Lease time.Duration
	// Token is written to the row when the claim wins: a random value
	// the claimer looks for if the claim's reply is lost.
	Token string
	// Origin names the claiming process in the claimed event.
	Origin string
	// Recovery, Retention, RedriveAfter and Redrive (whether the
	// application has a Redrive hook for the kind) are the kind's,
	// recorded in the row so that any process applies them.
	Recovery     Recovery
	Retention    time.Duration
	RedriveAfter time.Duration
	Redrive      bool
	// Unconfigured says the claiming process does not configure the
	// kind (Client.Configured): it claims by its Default's policy. A
	// released row it claims again keeps the recovery the row
	// recorded, which the kind's own process chose.
	Unconfigured bool
	// Refuse are recoveries, as rows record them (Recovery.String), of
	// a released row this claim must not claim again: the ones only a
	// process with the kind's verifier takes (Verifiable.Recoveries),
	// when this one has none for the kind. Such a row is answered as
	// it stands, released, for a process that can verify it.
	Refuse []string
	// Approval, when positive, makes a new key wait for a person: the
	// row is written awaiting approval, with no lease, expiring
	// Approval from the database's now, and OnExpiry recorded. It
	// changes nothing for a key that stands.
	Approval time.Duration
	OnExpiry Status
}

// ClaimResult is what a claim found.
type ClaimResult struct {
	// Claimed is true when this request won: a new row was inserted (in
	// flight, or awaiting approval), or a released or approved row with
	// the same fingerprint was claimed again.
	Claimed bool
	// Action is the row after the claim: the new attempt if Claimed, the
	// standing row otherwise.
	Action Action
	// Now is the database's clock when the claim ran; lease arithmetic
	// compares against it, never against the caller's clock.
	Now time.Time
	// From is the status a claim that won took the row from: empty for
	// a new row, StatusReleased or StatusApproved for a claim again.
	From Status
}

// Transition is a fenced compare-and-set on one action: it applies only
// if the row is still at Attempt and in one of From.
type Transition struct {
	Key     Key
	Attempt int
	From    []Status
	To      Status
	// NewAttempt takes the action over: the attempt number goes up by
	// one and claimed_at is reset.
	NewAttempt bool
	// Lease, when positive, sets lease_until to the database's now plus
	// Lease; otherwise lease_until is cleared.
	Lease time.Duration
	// Hold, when set, additionally requires the row's hold token to
	// equal it: the hold a recoverer took with Recoverable is still its
	// own. A heartbeat, a claim and every applied transition clear the
	// token, so a worker that came back or a second recoverer wins
	// instead.
	Hold string
	// Waiting, when set, additionally requires the action to be still
	// waiting for a delivery, as Filter.Waiting finds it: released, and
	// not updated for its RedriveAfter. Of two reapers that found it
	// waiting, only the first to mark it re-driven does, since the mark
	// updates it.
	Waiting bool
	// Fingerprint, when set, additionally requires the row's payload
	// to be this one: a person's approval applies to the payload the
	// person saw.
	Fingerprint Fingerprint
	// Unexpired and Expired, when set, additionally require the row's
	// lease_until to be after, or at or before, the database's now: an
	// approval is given only before its wait expires, and the reaper
	// expires it only after, so the two never both apply.
	Unexpired bool
	Expired   bool
	// Result is stored when To is StatusSucceeded.
	Result json.RawMessage
	// Error is stored as the action's error message (cleared if empty).
	Error string
	// VerifyFailures is stored as the action's verifier failure count.
	VerifyFailures int
	// ResolvedBy and ResolveNote, when ResolvedBy is set, record a
	// person's decision with the database's now.
	ResolvedBy  string
	ResolveNote string
	// Token, when set, is written to the row when the transition
	// applies, so a writer whose reply was lost can tell.
	Token string
	// Event is appended to the action's trail in the same transaction
	// when the transition applies.
	Event Event
}

// EventType names what happened to an action.
type EventType string

// The events of an action's trail. Two of them reach hooks only and are
// never written: EventReplayed (a duplicate got a stored success or
// failure; writing it would turn every duplicate, a read, into a write)
// and EventLeaseExpired (recovery took an in-flight action whose lease
// lapsed; the decision that follows is written). docs/state_machine.md
// says which transition writes each of the others.
const (
	EventClaimed      EventType = "claimed"
	EventReplayed     EventType = "replayed"
	EventSucceeded    EventType = "succeeded"
	EventFailed       EventType = "failed"
	EventUnknown      EventType = "unknown"
	EventReleased     EventType = "released"
	EventReview       EventType = "review"
	EventTakenOver    EventType = "taken_over"
	EventVerified     EventType = "verified"
	EventVerifyFailed EventType = "verify_failed"
	EventResolved     EventType = "resolved"
	EventRefused      EventType = "refused"
	EventLeaseExpired EventType = "lease_expired"
	// EventRedriven: a released action that waited too long for a
	// delivery was handed to its kind's Redrive hook.
	EventRedriven EventType = "redriven"
	// EventAwaitingApproval reaches hooks only: a first claim wrote the
	// row awaiting a person's approval. The trail tells it as the first
	// claim, to awaiting_approval, which the row itself is.
	EventAwaitingApproval EventType = "awaiting_approval"
	// EventApproved and EventRejected: a person's decision on an action
	// awaiting approval. EventExpired: the reaper found it unanswered
	// past its expiry.
	EventApproved EventType = "approved"
	EventRejected EventType = "rejected"
	EventExpired  EventType = "expired"
)

// Event is one entry of an action's append-only trail.
type Event struct {
	ID      int64
	Key     Key
	At      time.Time
	Type    EventType
	Attempt int
	From    Status
	To      Status
	// Actor is who caused it: ActorWorker, ActorReaper, or a person's
	// name.
	Actor string
	Note  string
	// Origin is the process that wrote it: Config.Origin, by default
	// host:pid.
	Origin string
}

// RecoverRequest asks for actions due for recovery: in flight with a
// lapsed lease, or with an unknown outcome whose next try is due.
type RecoverRequest struct {
	// Key limits the request to one action (inline recovery); empty
	// means any.
	Key Key
	// Limit caps the batch.
	Limit int
	// Hold pushes the lease of every returned action this far past the
	// database's now, so no other reaper or worker takes it while this one
	// decides.
	Hold time.Duration
	// KindHolds, for an action whose kind it names, is that action's
	// hold instead of Hold: a reaper holds each action for what its own
	// kind's decision needs, so a duplicate that meets the hold is not
	// sent away for the longest of every kind's.
	KindHolds map[string]time.Duration
	// DueBy, when set, takes only actions that were due by then (by the
	// database's clock): a reaper's pass takes what was due when it
	// began, not an action it deferred a moment ago.
	DueBy time.Time
	// Verifiable says which of the actions whose recovery only a process
	// holding their kind may carry out (VerifyThenDecide: its verifier
	// asks the provider) this process may take; the others are left
	// alone.
	Verifiable Verifiable
	// Token is written to every returned action as its hold token; the
	// decisions that follow name it in Transition.Hold. Required: a
	// random value no other recoverer uses.
	Token string
}

// Verifiable says which actions a process may take whose recorded
// recovery only a process that holds their kind can carry out. The
// Client computes it from its policies, and a store only substitutes its
// values: no store names a recovery mode.
type Verifiable struct {
	// Recoveries are those recoveries, as a row records them
	// (Recovery.String): an action that recorded one of them is taken
	// only if its kind is in Kinds, or Others is true and its kind is
	// not in Except. Any other action is taken by any process. Empty
	// restricts nothing.
	Recoveries []string
	// Kinds are the kinds the process configures; Others is true when
	// Config.Default has a verifier, for every kind not in Except.
	Kinds  []string
	Others bool
	Except []string
}

// StatusCount is one cell of Stats: how many actions of a kind, recorded
// with one recovery, are in a status.
type StatusCount struct {
	Kind   string
	Status Status
	// Recovery is the recovery the counted actions recorded when they
	// were claimed (RecoveryDefault for rows from before it was).
	Recovery Recovery
	Count    int64
	// AsOf is when the count was made, when it was not made by the call
	// that returned it: both stores count a large log's finished actions
	// now and then, not at each call. Zero for a count the call made.
	AsOf time.Time
}

// PurgeRequest deletes finished actions (succeeded, failed) past their
// own retention deadline (Action.RetainUntil), with their events.
type PurgeRequest struct {
	// OlderThan, when positive, deletes finished actions not updated for
	// this long instead, whatever their deadline says.
	OlderThan time.Duration
	// Limit caps the rows deleted in one call.
	Limit int
	// DryRun counts instead of deleting.
	DryRun bool
}

// Filter selects actions for List. Zero fields match everything.
type Filter struct {
	Status Status
	Kind   string
	Run    string
	// KeyPrefix keeps actions whose key starts with it (lowercase hex),
	// as people type keys from a listing.
	KeyPrefix string
	// Since keeps actions updated at or after it.
	Since time.Time
	// Before keeps actions last updated before it.
	Before time.Time
	// Waiting keeps released and approved actions that no delivery has
	// claimed for longer than their recorded RedriveAfter (DefaultRedriveAfter where
	// none was recorded), by the database's clock.
	Waiting bool
	// OldestFirst lists the least recently updated first, so a limit
	// keeps what has waited longest.
	OldestFirst bool
	// Due keeps actions due for recovery: in flight with a lapsed lease,
	// or unknown and due for their verifier, by the database's clock.
	Due bool
	// Expired keeps actions awaiting approval past their expiry, by the
	// database's clock.
	Expired bool
	// Recovery keeps actions that recorded this recovery at their claim;
	// RecoveryDefault keeps all.
	Recovery Recovery
	// ByStep lists in step order (then by key), for a run's steps, and
	// AfterKey, when set, continues after the action at AfterStep with
	// that key: the last one of the page before.
	ByStep    bool
	AfterStep int64
	AfterKey  Key
	// Brief leaves Payload and Result out (nil): a list shows neither,
	// and a payload may be a mebibyte.
	Brief bool
	// Limit caps the number of rows; zero means 100.
	Limit int
}

// EventQuery asks for one page of an action's trail.
type EventQuery struct {
	Key Key
	// Newest pages from the newest event back, newest first; otherwise
	// from the oldest on, oldest first.
	Newest bool
	// After, when positive, continues after the event with this ID:
	// the page before's EventPage.Next.
	After int64
	// Limit caps the page's written events; zero means 100. The one or
	// two events a store never writes, which the action's row tells (the
	// first claim and the first attempt's outcome: storekit.WithHappyPath),
	// come on top, in the page where they fall.
	Limit int
}

// EventPage is one page of an action's trail.
type EventPage struct {
	// Events are in the order asked (EventQuery.Newest).
	Events []Event
	// Total is how many events the whole trail holds.
	Total int64
	// Next is the next page's EventQuery.After; zero on the last page.
	Next int64
}

// Store is the database underneath a Client. It is only SQL: every rule
// about statuses, fencing and recovery lives in this package, once, and a
// store carries out the compare-and-set operations those rules ask for.
// The storetest package is the suite every Store must pass.
//
// Stores must be safe for concurrent use by many goroutines, processes
// and machines: the database, not the caller, arbitrates every claim.
type Store interface {
	// Claim inserts a new in-flight action for the key, or claims a
	// released action with the same fingerprint as attempt+1, and records
	// a claimed event (a store may leave a first claim's event unwritten,
	// read back from the row: docs/state_machine.md). When the key is
	// held, it returns the standing row with Claimed false.
	Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error)
	// Heartbeat extends the lease of an in-flight attempt to Now+lease by
	// the database's clock. It reports false if the attempt no longer
	// holds the claim.
	Heartbeat(ctx context.Context, key Key, attempt int, lease time.Duration) (leaseUntil time.Time, held bool, err error)
	// Transition applies t and reports whether the row matched. When it
	// does, t.Event is appended to the trail in the same transaction.
	Transition(ctx context.Context, t Transition) (bool, error)
	// Recoverable atomically takes a batch of actions due for recovery
	// and holds them (see RecoverRequest); concurrent callers never get
	// the same action. It returns the database's now.
	Recoverable(ctx context.Context, req RecoverRequest) ([]Action, time.Time, error)
	// AppendEvent adds an event to an action's trail.
	AppendEvent(ctx context.Context, e Event) error
	// Events returns an action's trail, oldest first.
	Events(ctx context.Context, key Key) ([]Event, error)
	// EventPage returns one page of an action's trail (see EventQuery),
	// and how many events the whole trail holds: a trail may be long,
	// and a reader holds one page of it at a time.
	EventPage(ctx context.Context, q EventQuery) (EventPage, error)
	// RecentEvents returns the newest events of the given types across
	// all actions, newest first (every type when types is empty).
	RecentEvents(ctx context.Context, types []EventType, limit int) ([]Event, error)
	// Version returns the newest schema migration applied, 0 if none.
	Version(ctx context.Context) (int, error)
	// Stats counts actions by kind, status and recovery, ordered so, as
	// bytes.
	// The open statuses' counts are made by the call; a store may take
	// the finished statuses' from a count made earlier, and say when
	// (StatusCount.AsOf).
	Stats(ctx context.Context) ([]StatusCount, error)
	// Purge deletes finished actions (succeeded, failed); it never
	// touches in-flight, unknown, review or released rows, whose attempt
	// numbers still fence an attempt that may be alive. It returns how
	// many it deleted (or would).
	Purge(ctx context.Context, req PurgeRequest) (int, error)
	// Get returns one action, or an error matching ErrNotFound.
	Get(ctx context.Context, key Key) (Action, error)
	// List returns actions matching f, most recently updated first
	// (f.OldestFirst, f.ByStep aside).
	List(ctx context.Context, f Filter) ([]Action, error)
	// Count returns how many actions match f, its limit, order and
	// cursor aside.
	Count(ctx context.Context, f Filter) (int64, error)
	// Migrate creates or upgrades the schema. It is safe to run twice and
	// from several processes at once.
	Migrate(ctx context.Context) error
	// Migrations returns the schema's migrations as SQL, rendered for the
	// store's schema and table prefix, for teams that apply SQL with a
	// tool of their own (once migrate --print).
	Migrations() ([]Migration, error)
	// Close releases what the store opened. A store made over a caller's
	// pool or database leaves it open.
	Close() error
}

// WaitRequest asks a store to wait until an action may have moved on
// from where a claim last saw it (Do's WaitFor).
type WaitRequest struct {
	Key Key
	// Status and Attempt are where the action stood; an empty Status
	// means no row was visible (a transaction not yet committed holds
	// the key).
	Status  Status
	Attempt int
	// Until bounds the wait, by this process's clock.
	Until time.Time
}

// Moved reports whether an action read as status and attempt (found
// false when no row was there) is no longer where r saw it. A heartbeat
// moves nothing: only a change of status or attempt, a row appearing or
// a row going.
func (r WaitRequest) Moved(found bool, status Status, attempt int) bool {
	if !found || r.Status == "" {
		return found != (r.Status != "")
	}
	return status != r.Status || attempt != r.Attempt
}

// Waiter is a Store that can wait for an action to change without
// holding a connection while it waits; the engine polls Get on a store
// that is not one. Both stores here are.
type Waiter interface {
	// Wait returns nil when the action may have moved on from req (see
	// WaitRequest.Moved), or at req.Until, whichever comes first; the
	// caller then claims again, so a spurious return costs a read, never
	// a wrong answer. It returns ctx's error when ctx ends first, and
	// any other error when it cannot wait at all (a store bound to a
	// transaction that holds what the other attempt needs to finish),
	// at once. It must not hold a connection between its reads: many
	// callers may wait at once.
	Wait(ctx context.Context, req WaitRequest) error
}

// Migration is one numbered schema migration, rendered as SQL.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// TxBinder is a Store that can work inside a caller's transaction of
// type TX (pgx.Tx for the postgres store, *sql.Tx for the sqlite store),
// for DoTx. Because DoTx takes the binder with its type, a transaction of
// the wrong type does not compile.
type TxBinder[TX any] interface {
	Store
	// BindTx returns a Store whose statements run in tx.
	BindTx(tx TX) Store
}
