package once

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// Recovery is what happens to an action whose outcome is unknown: its
// worker died holding the claim, or its effect returned an unclassified
// error. It is a product decision per kind of action, so it is named by
// what it does.
type Recovery int

const (
	// RecoveryDefault, the zero value, takes Config.Default's recovery
	// (and its Verifier) in a kind policy, and AskPerson in
	// Config.Default itself.
	RecoveryDefault Recovery = iota
	// AskPerson never re-executes: the action is put up for review with
	// the reason, and a person decides (Client.Resolve). The default, and
	// the honest answer for plain SMTP, which cannot be asked whether it
	// delivered.
	AskPerson
	// RetryWithProviderKey re-executes with the same Attempt.ProviderKey:
	// the provider (Stripe, most payment and messaging APIs) absorbs the
	// duplicate.
	RetryWithProviderKey
	// VerifyThenDecide asks the kind's Verifier whether the effect landed:
	// if it did, the action succeeds with the verifier's result; if it did
	// not, it is retried; if the verifier cannot tell, it is asked again
	// later with backoff, and after MaxVerifyFailures the action goes to
	// review.
	VerifyThenDecide
)

// ParseRecovery is the inverse of Recovery.String for the named modes;
// anything else is RecoveryDefault.
func ParseRecovery(s string) Recovery {
	for _, r := range []Recovery{AskPerson, RetryWithProviderKey, VerifyThenDecide} {
		if r.String() == s {
			return r
		}
	}
	return RecoveryDefault
}

func (r Recovery) String() string {
	switch r {
	case RecoveryDefault:
		return "default"
	case AskPerson:
		return "ask_person"
	case RetryWithProviderKey:
		return "retry_with_provider_key"
	case VerifyThenDecide:
		return "verify_then_decide"
	}
	return fmt.Sprintf("Recovery(%d)", int(r))
}

// Verifier asks the provider whether an action's effect landed. It
// returns landed=true with the result to store (as Do would have), or
// landed=false if the provider has no trace of it. An error means it
// could not tell; it will be asked again later.
type Verifier func(ctx context.Context, a Action) (landed bool, result json.RawMessage, err error)

// KindPolicy is what one kind of action needs: how long a claim is held,
// how long an effect may run, how long its record is kept, and what to do
// when its outcome is unknown.
type KindPolicy struct {
	// Lease is how long a claim survives without a heartbeat, by the
	// database's clock. While the effect runs, Do extends it every Lease/3,
	// so it bounds how long a dead worker's claim blocks recovery, not how
	// long an effect may take. Zero means DefaultLease (2 minutes).
	Lease time.Duration
	// MaxExecution bounds the context given to the effect. Zero means
	// DefaultMaxExecution (5 minutes).
	MaxExecution time.Duration
	// Retention is how long a finished action is kept before Purge may
	// delete it. It must exceed the longest time your queue may redeliver
	// a job: a duplicate that arrives after its action was purged runs
	// again. Zero means DefaultRetention (30 days).
	Retention time.Duration
	// Recovery is what to do with an unknown outcome. Zero
	// (RecoveryDefault) means Config.Default's, and AskPerson where
	// Default names none.
	Recovery Recovery
	// Verifier is required with VerifyThenDecide. A kind that takes its
	// recovery from Config.Default takes Default's Verifier with it.
	Verifier Verifier
	// MaxVerifyFailures is how many verifier errors send the action to
	// review. Zero means DefaultMaxVerifyFailures (5).
	MaxVerifyFailures int
	// VerifyBackoff is the wait after the first verifier error, doubled
	// after each further one up to an hour. Zero means 10 seconds.
	VerifyBackoff time.Duration
	// Redrive hands a released action back to whatever delivers its job
	// (publish the job again, say). A released action runs only when its
	// job is delivered again; when that job was already acknowledged or
	// dropped — a person chose Retry on a review item, recovery released
	// a claim whose job was acked — nobody would deliver it. The reaper
	// calls Redrive for released actions that no delivery claimed within
	// RedriveAfter, and again every RedriveAfter until one does. Nil
	// takes Config.Default's; with none, such actions are only counted
	// (ReapReport.Waiting, the console's overview).
	//
	// Before it calls Redrive, the reaper marks the action re-driven
	// (event redriven in its trail), fenced so that of several reapers,
	// in one process or many, only the one whose mark applied calls the
	// hook and counts it (ReapReport.Redriven). A hook that fails is
	// called again after another RedriveAfter.
	//
	// Redrive may run the action itself, calling once.Do with the
	// intent rebuilt from a (for a job with no queue to go back to):
	// the Do claims the released action as the next attempt, and a
	// delivery that arrives meanwhile replays or meets its claim. It
	// runs on the reaper's goroutine, one action after another, under a
	// context bounded by MaxExecution, so a slow effect holds up the
	// pass; return Do's error, so a Do that did not settle the action
	// counts as waiting. Publishing the job again is the usual hook.
	Redrive func(ctx context.Context, a Action) error
	// RedriveAfter is how long a released action waits for a delivery
	// before Redrive is called. Zero means DefaultRedriveAfter (5
	// minutes).
	RedriveAfter time.Duration
	// Approval makes an action of the kind wait for a person before its
	// effect runs: for anything irreversible, ask first. The zero value
	// asks nobody; a kind that sets none takes Config.Default's, and one
	// that must not wait under a Default that asks sets a When that
	// returns false.
	Approval ApprovalPolicy
}

// ApprovalPolicy says which actions of a kind wait for a person's
// approval before they run, and for how long.
//
// A new key that needs approval is claimed into StatusAwaitingApproval:
// nothing runs and no lease is held, and Do returns an
// *AwaitingApprovalError to it and to every duplicate. A person approves
// (Client.Approve) or rejects (Client.Reject) it, fenced by its attempt
// and payload, so a double click or a retried webhook applies once. An
// approved action runs at its next delivery, once, however many race;
// a rejected one fails, and every duplicate gets the rejection. Approval
// is asked once per action, at its first claim: a retry after it runs
// was approved already.
type ApprovalPolicy struct {
	// Always makes every action of the kind wait.
	Always bool
	// When, if set, makes the actions it returns true for wait: an
	// amount over a limit, a recipient outside the company. It is
	// called with the intent before the claim, and must not block or
	// have effects. A When that panics fails the call, and nothing is
	// claimed.
	When func(Intent) bool
	// Expiry is how long an action waits for a decision. Zero means
	// DefaultApprovalExpiry (24 hours).
	Expiry time.Duration
	// OnExpiry is what an action that waited past Expiry becomes, when
	// the reaper finds it: StatusFailed (the default: nobody approved
	// it, so it does not happen) or StatusReview (a person decides
	// what then).
	OnExpiry Status
}

// DefaultApprovalExpiry is how long an action waits for approval, and
// MaxApprovalExpiry the longest wait a policy may ask for.
const (
	DefaultApprovalExpiry = 24 * time.Hour
	MaxApprovalExpiry     = 366 * 24 * time.Hour
)

// set reports whether p asks for approval at all.
func (p ApprovalPolicy) set() bool { return p.Always || p.When != nil }

// needs reports whether in waits for approval under p. A When that
// panics is reported as an error: a claim without the approval its
// kind asks for would run an effect nobody approved.
func (p ApprovalPolicy) needs(in Intent) (need bool, err error) {
	if p.Always {
		return true, nil
	}
	if p.When == nil {
		return false, nil
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("once: the ApprovalPolicy.When of kind %q panicked: %v; nothing was claimed", in.Kind, r)
		}
	}()
	return p.When(in), nil
}

// DefaultRedriveAfter is how long a released action waits for a delivery
// before the reaper re-drives it or counts it as waiting.
const DefaultRedriveAfter = 5 * time.Minute

var packageDefaults = KindPolicy{
	Recovery:          AskPerson,
	Lease:             DefaultLease,
	MaxExecution:      DefaultMaxExecution,
	Retention:         DefaultRetention,
	MaxVerifyFailures: DefaultMaxVerifyFailures,
	VerifyBackoff:     10 * time.Second,
	RedriveAfter:      DefaultRedriveAfter,
	Approval:          ApprovalPolicy{Expiry: DefaultApprovalExpiry, OnExpiry: StatusFailed},
}

// withDefaults fills p's zero fields from d. Every field is inherited the
// same way: a kind that sets only a Lease keeps Default's recovery.
func (p KindPolicy) withDefaults(d KindPolicy) KindPolicy {
	if p.Recovery == RecoveryDefault {
		p.Recovery = d.Recovery
		if p.Verifier == nil {
			p.Verifier = d.Verifier
		}
	}
	if p.Lease == 0 {
		p.Lease = d.Lease
	}
	if p.MaxExecution == 0 {
		p.MaxExecution = d.MaxExecution
	}
	if p.Retention == 0 {
		p.Retention = d.Retention
	}
	if p.MaxVerifyFailures == 0 {
		p.MaxVerifyFailures = d.MaxVerifyFailures
	}
	if p.VerifyBackoff == 0 {
		p.VerifyBackoff = d.VerifyBackoff
	}
	if p.Redrive == nil {
		p.Redrive = d.Redrive
	}
	if p.RedriveAfter == 0 {
		p.RedriveAfter = d.RedriveAfter
	}
	if !p.Approval.set() {
		p.Approval.Always, p.Approval.When = d.Approval.Always, d.Approval.When
	}
	if p.Approval.Expiry == 0 {
		p.Approval.Expiry = d.Approval.Expiry
	}
	if p.Approval.OnExpiry == "" {
		p.Approval.OnExpiry = d.Approval.OnExpiry
	}
	return p
}

func (p KindPolicy) validate(name string) error {
	switch {
	case p.Lease < 0 || p.MaxExecution < 0 || p.Retention < 0 || p.MaxVerifyFailures < 0 || p.VerifyBackoff < 0 || p.RedriveAfter < 0:
		return fmt.Errorf("once: Config.%s has a negative duration or count; zero means the default", name)
	case p.Lease > 0 && p.Lease < 30*time.Millisecond:
		return fmt.Errorf("once: Config.%s.Lease is %v; it must be at least 30ms so heartbeats can keep it", name, p.Lease)
	case p.Recovery < RecoveryDefault || p.Recovery > VerifyThenDecide:
		return fmt.Errorf("once: Config.%s.Recovery is %v; use AskPerson, RetryWithProviderKey or VerifyThenDecide", name, p.Recovery)
	case p.Verifier != nil && p.Recovery != VerifyThenDecide && p.Recovery != RecoveryDefault:
		return fmt.Errorf("once: Config.%s has a Verifier but Recovery is %v; a verifier is only asked under VerifyThenDecide", name, p.Recovery)
	case p.Approval.Expiry < 0:
		return fmt.Errorf("once: Config.%s.Approval.Expiry is %v; zero means the default, %v", name, p.Approval.Expiry, DefaultApprovalExpiry)
	case p.Approval.Expiry > 0 && p.Approval.Expiry < time.Second:
		return fmt.Errorf("once: Config.%s.Approval.Expiry is %v; give a person at least a second", name, p.Approval.Expiry)
	case p.Approval.Expiry > MaxApprovalExpiry:
		return fmt.Errorf("once: Config.%s.Approval.Expiry is %v, over the longest wait, %v (a year): a wait nobody answers in a year is not answered; choose OnExpiry: once.StatusReview to keep it for a person",
			name, p.Approval.Expiry, MaxApprovalExpiry)
	case p.Approval.OnExpiry != "" && p.Approval.OnExpiry != StatusFailed && p.Approval.OnExpiry != StatusReview:
		return fmt.Errorf("once: Config.%s.Approval.OnExpiry is %q; use once.StatusFailed or once.StatusReview", name, p.Approval.OnExpiry)
	case p.Approval.Always && p.Approval.When != nil:
		return fmt.Errorf("once: Config.%s.Approval sets both Always and When; Always asks for every action, so drop one", name)
	}
	return nil
}

// validateMerged checks a policy after its defaults were filled in;
// raw is the policy as given.
func (p KindPolicy) validateMerged(name string, raw KindPolicy) error {
	switch {
	case !p.Approval.set() && (raw.Approval.Expiry != 0 || raw.Approval.OnExpiry != ""):
		// The gate's details without the gate: the operator thinks the
		// kind waits for a person, and it runs at once
		// (TestClient/ApprovalHalfSetPolicyRefused).
		return fmt.Errorf("once: Config.%s.Approval sets Expiry or OnExpiry but neither Always nor When, so it asks nobody; set Always: true, or a When", name)
	case p.Recovery == VerifyThenDecide && p.Verifier == nil:
		return fmt.Errorf("once: Config.%s.Recovery is VerifyThenDecide but Verifier is nil; give it a function that asks the provider", name)
	case p.Recovery != VerifyThenDecide && p.Verifier != nil:
		return fmt.Errorf("once: Config.%s has a Verifier but its recovery is %v (taken from Config.Default); set Recovery: once.VerifyThenDecide, or the verifier is never asked", name, p.Recovery)
	}
	return nil
}

// margin is how long before its lease runs out a worker that cannot
// reach the database stops its effect, and how long after it recovery
// may take over: the claim is written with Lease+margin by the
// database's clock, and the worker cancels its effect at Lease−margin
// after it last sent a heartbeat that got through. Between the two the
// effect has time to wind down, and clocks that tick at slightly
// different rates cannot let two attempts overlap.
func (p KindPolicy) margin() time.Duration { return p.Lease / 5 }

// storedLease is the lease written to the database.
func (p KindPolicy) storedLease() time.Duration { return p.Lease + p.margin() }

// backoff is the wait after the n-th verifier failure (n from 1).
func (p KindPolicy) backoff(n int) time.Duration {
	d := p.VerifyBackoff
	for i := 1; i < n && d < time.Hour; i++ {
		d *= 2
	}
	return min(d, time.Hour)
}
