package storetest

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/oncehq/once"
)

// An adversary's cases for approval gates: each is what a careless
// operator or a hostile caller does, and what must hold all the same.

func approvalAdversaryTests() []namedTest {
	return []namedTest{
		{name: "ApprovalHugeExpiryStillWaits", fn: testApprovalHugeExpiry},
		{name: "ApprovalRejectedNotRunByRetry", fn: testApprovalRejectedNotRunByRetry},
		{name: "ApprovalRefusalAfterRetryNamesNoApprover", fn: testApprovalRefusalAfterRetry, serial: true},
		{name: "ApprovalHostileKeyRefusedBeforeIO", fn: testApprovalHostileKey},
		{name: "ApprovalReusedAfterPurge", fn: testApprovalReusedAfterPurge},
		{name: "ApprovalHalfSetPolicyRefused", fn: testApprovalHalfSetPolicy},
		{name: "ApprovalExpiredToReviewNotRecordedDone", fn: testApprovalExpiredToReviewNotDone},
	}
}

// An operator who means "never expire" writes the largest duration.
// Either once.New refuses it, naming Expiry, or the action waits for a
// person, as the kind asks: it must not be claimed in flight, to be run
// by recovery once its lease lapses, with nobody's approval.
func testApprovalHugeExpiry(t *testing.T, h Harness) {
	cfg := once.Config{Kinds: map[string]once.KindPolicy{"send_email": {Lease: 100 * time.Millisecond, Recovery: once.RetryWithProviderKey,
		Approval: once.ApprovalPolicy{Always: true, Expiry: time.Duration(math.MaxInt64)}}}}
	s, _ := newStore(t, h)
	cfg.Store = s
	c, err := once.New(cfg)
	if err != nil {
		if !strings.Contains(err.Error(), "Expiry") {
			t.Fatalf("once.New refused a huge Expiry without naming it: %v", err)
		}
		return
	}
	in := intent(1)
	var runs counter
	_, err = once.Do(ctx(t), c, in, runs.fn("sent"))
	var w *once.AwaitingApprovalError
	if !errors.As(err, &w) || w.Expired {
		t.Errorf("Do with a huge Expiry = %v; want a wait that has not expired", err)
	}
	a := mustGet(t, s, keyOf(t, in))
	if a.Status != once.StatusAwaitingApproval {
		// Claimed in flight: once its lease lapses, the next delivery
		// takes it over and runs it.
		time.Sleep(300 * time.Millisecond)
		res, err := once.Do(ctx(t), c, in, runs.fn("sent"))
		t.Fatalf("row %s (lease until %v), not awaiting approval; a delivery after its lease = %+v, %v, and the effect ran %d times with nobody's approval",
			a.Status, a.LeaseUntil, res.Value, err, runs.n.Load())
	}
	if _, err := c.Approve(ctx(t), a.Key, once.Approval{By: "ada"}); err != nil {
		t.Fatalf("Approve of a wait with a huge Expiry: %v", err)
	}
}

// A rejected action was never approved: a person's Retry in the review
// queue (Resolve on a failed action) must not make it run, or every
// rejected payment runs at a "retry all failed".
func testApprovalRejectedNotRunByRetry(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, gated(0))
	in := intent(1)
	var runs counter
	awaiting(t, c, in, &runs)
	k := keyOf(t, in)
	if _, err := c.Reject(ctx(t), k, once.Approval{By: "grace", Note: "wrong customer"}); err != nil {
		t.Fatal(err)
	}
	_, rerr := c.Resolve(ctx(t), k, once.Resolution{Decision: once.DecisionRetry, By: "bob", Note: "retrying the failures"})
	_, err := once.Do(ctx(t), c, in, runs.fn("sent"))
	if runs.n.Load() != 0 {
		a := mustGet(t, s, k)
		t.Fatalf("Resolve(Retry) of a rejected action = %v, and the next delivery ran it (%v; row %s attempt %d): an effect nobody approved ran",
			rerr, err, a.Status, a.Attempt)
	}
}

// A wait that expired to review, a person's Retry, and the run after:
// an Approve sent then is refused, and must not say someone approved
// it, when nobody did.
func testApprovalRefusalAfterRetry(t *testing.T, h Harness) {
	s, c, in, k, runs := expiredToReview(t, h)
	if _, err := c.Resolve(ctx(t), k, once.Resolution{Decision: once.DecisionRetry, By: "bob", Note: "send it after all"}); err != nil {
		t.Fatal(err)
	}
	if _, err := once.Do(ctx(t), c, in, runs.fn("sent")); err != nil {
		t.Fatal(err)
	}
	_, err := c.Approve(ctx(t), k, once.Approval{By: "ada"})
	if !errors.Is(err, once.ErrConflict) {
		t.Fatalf("Approve after the run = %v; want a conflict", err)
	}
	if a := mustGet(t, s, k); strings.Contains(err.Error(), "approved by") {
		t.Fatalf("the refusal says %q; nobody approved it (bob resolved the review item, trail %s)", err, trail(t, s, a.Key))
	}
}

// A wait that expired to review never ran: a person who records it Done
// would tell every duplicate an effect happened that did not. Done is
// refused, saying so, and the review stands; Retry (the person's say
// that it runs) and Abandon are the decisions left.
func testApprovalExpiredToReviewNotDone(t *testing.T, h Harness) {
	s, c, in, k, runs := expiredToReview(t, h)
	_, err := c.Resolve(ctx(t), k, once.Resolution{Decision: once.DecisionDone, By: "bob", Note: "looks done"})
	if !errors.Is(err, once.ErrConflict) || !strings.Contains(err.Error(), "never ran") {
		t.Fatalf("Done of a wait that expired to review = %v; want a conflict saying it never ran", err)
	}
	if a := mustGet(t, s, k); a.Status != once.StatusReview {
		t.Fatalf("after the refused Done the action is %s; want it still in review", a.Status)
	}
	if _, err := c.Resolve(ctx(t), k, once.Resolution{Decision: once.DecisionRetry, By: "bob", Note: "send it"}); err != nil {
		t.Fatalf("Retry: %v", err)
	}
	if res, err := once.Do(ctx(t), c, in, runs.fn("sent")); err != nil || res.Value != "sent" || runs.n.Load() != 1 {
		t.Fatalf("Do after Retry = %+v, %v, ran %d; want it run once", res, err, runs.n.Load())
	}
}

// expiredToReview is a gated action whose wait expired to review, by a
// reaper pass, with the counter of its effect's runs.
func expiredToReview(t *testing.T, h Harness) (once.Store, *once.Client, once.Intent, once.Key, *counter) {
	cfg := once.Config{Kinds: map[string]once.KindPolicy{"send_email": {Approval: once.ApprovalPolicy{Always: true, Expiry: time.Second, OnExpiry: once.StatusReview}}}}
	s, c, _ := setup(t, h, cfg)
	in := intent(1)
	runs := new(counter)
	awaiting(t, c, in, runs)
	time.Sleep(1500 * time.Millisecond)
	if rep, err := reaper(t, c).RunOnce(ctx(t)); err != nil || rep.Expired != 1 {
		t.Fatalf("reaper pass = %+v, %v", rep, err)
	}
	return s, c, in, keyOf(t, in), runs
}

// Approve and Reject take a key from a form or a URL: one no action can
// have (a NUL, bad UTF-8, a megabyte) is refused before any I/O, as the
// rest of the decision is, or answered ErrNotFound; never a database
// error.
func testApprovalHostileKey(t *testing.T, h Harness) {
	_, c, _ := setup(t, h, gated(0))
	for name, k := range map[string]once.Key{
		"NUL":      "ab\x00cd",
		"bad UTF8": "ab\xff\xfecd",
		"1 MiB":    once.Key(strings.Repeat("k", 1<<20)),
		"empty":    "",
	} {
		for _, reject := range []bool{false, true} {
			d := once.Approval{By: "ada", Note: "looked at it"}
			var err error
			if reject {
				_, err = c.Reject(ctx(t), k, d)
			} else {
				_, err = c.Approve(ctx(t), k, d)
			}
			if !errors.Is(err, once.ErrInvalidResolution) && !isNotFound(err) {
				t.Errorf("%s key (reject %v): %v; want ErrInvalidResolution or ErrNotFound", name, reject, err)
			}
		}
	}
}

// A decision sent twice (a retried webhook, a form posted again) after
// the action it approved ran and was purged, and the same intent came
// back and waits again: the person saw the first wait, not this one.
// The second copy names the same attempt and payload; only when the
// wait began (Approval.Since, which the console's forms, its API and the
// webhook's body carry) tells the waits apart. Without it, it approved
// the new wait, and the effect ran a second time that nobody approved.
func testApprovalReusedAfterPurge(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, gated(0))
	in := intent(1)
	var runs counter
	awaiting(t, c, in, &runs)
	k := keyOf(t, in)
	first := mustGet(t, s, k)
	d := once.Approval{By: "ada", Note: "ok", Attempt: first.Attempt, Fingerprint: first.Fingerprint, Since: first.CreatedAt, Via: "api"}
	if _, err := c.Approve(ctx(t), k, d); err != nil {
		t.Fatal(err)
	}
	if _, err := once.Do(ctx(t), c, in, runs.fn("sent")); err != nil || runs.n.Load() != 1 {
		t.Fatalf("Do after approval = %v (ran %d)", err, runs.n.Load())
	}
	time.Sleep(20 * time.Millisecond)
	if n, err := c.Purge(ctx(t), once.PurgeOptions{OlderThan: time.Millisecond}); err != nil || n != 1 {
		t.Fatalf("Purge = %d, %v; want the finished action purged", n, err)
	}
	if _, err := once.Do(ctx(t), c, in, runs.fn("sent")); !errors.Is(err, once.ErrAwaitingApproval) {
		t.Fatalf("the intent after the purge = %v; want a new wait", err)
	}
	if _, err := c.Approve(ctx(t), k, d); err == nil {
		res, err := once.Do(ctx(t), c, in, runs.fn("sent"))
		t.Fatalf("the first wait's approval, sent again, approved the new wait (then Do = %+v, %v; ran %d in all)", res.Value, err, runs.n.Load())
	}
}

// An operator gates a kind by giving it an expiry and what expiry makes
// of it, and forgets Always (or When): the policy asks nobody, and the
// kind's effects run at once. once.New must refuse a policy that sets
// the gate's details but not the gate, or the effect must wait.
func testApprovalHalfSetPolicy(t *testing.T, h Harness) {
	s, _ := newStore(t, h)
	c, err := once.New(once.Config{Store: s, Kinds: map[string]once.KindPolicy{"send_email": {
		Approval: once.ApprovalPolicy{Expiry: time.Hour, OnExpiry: once.StatusReview}}}})
	if err != nil {
		if !strings.Contains(err.Error(), "Approval") {
			t.Fatalf("once.New refused the policy without naming Approval: %v", err)
		}
		return
	}
	var runs counter
	_, err = once.Do(ctx(t), c, intent(1), runs.fn("sent"))
	if runs.n.Load() != 0 {
		t.Fatalf("a kind whose ApprovalPolicy sets Expiry and OnExpiry, but neither Always nor When, ran its effect at once (%v): nobody approved it, and once.New said nothing", err)
	}
}
