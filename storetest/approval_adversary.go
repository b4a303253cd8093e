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
