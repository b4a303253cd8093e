package riverjob_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/oncehq/once"
)

// errMailboxFull is what a sending library marks permanent (a 552); the
// effect may still decide to come back later.
var errMailboxFull = once.Permanent(errors.New("552 mailbox full"))

// An effect that returns RetryLater over an error some library marked
// Permanent has said its last word: it did not happen, try later. once
// releases the action for the next delivery, so the job must be retried,
// not cancelled: a cancelled job leaves a released action that nobody
// delivers again.
func TestRetryLaterOverPermanentRetriesTheJob(t *testing.T) {
	e := newEnv(t)
	c := e.client(t, once.Config{Kinds: map[string]once.KindPolicy{"charge": {Lease: time.Second}}})
	e.start(t, e.chargeWorker(t, c, func(_ context.Context, job *river.Job[chargeArgs], _ once.Attempt) error {
		if job.Attempt == 1 {
			return once.RetryLater(fmt.Errorf("the customer's mailbox is full, trying again later: %w", errMailboxFull))
		}
		return nil
	}))
	j := e.insert(t, chargeArgs{OrderID: "order-20", Amount: 100})
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := e.inserter.JobGet(context.Background(), j.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State == rivertype.JobStateCompleted {
			break
		}
		if got.State == rivertype.JobStateCancelled || time.Now().After(deadline) {
			a := e.action(t, c, "order-20")
			t.Fatalf("job is %s at attempt %d (errors %v) while its action is %s at attempt %d; want the job retried and completed", got.State, got.Attempt, got.Errors, a.Status, a.Attempt)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := e.effects(t); len(got) != 1 || got[0].Attempt != 2 {
		t.Fatalf("effects %+v; want one, by attempt 2", got)
	}
}

// An effect that gives up — Permanent over an error a library marked
// RetryLater (the provider deferred it once too often) — has said its
// last word: it did not happen and never will. The action must fail for
// good, as the job's cancellation says, not be left released for a
// delivery that never comes; inside DoTx, where nothing is recorded, the
// job must be cancelled rather than retried to give up again.
func TestPermanentOverRetryLaterFailsTheAction(t *testing.T) {
	deferred := once.RetryLater(errors.New("451 try again later"))
	giveUp := once.Permanent(fmt.Errorf("giving up: %w", deferred))
	t.Run("Do", func(t *testing.T) {
		e := newEnv(t)
		c := e.client(t, once.Config{Kinds: map[string]once.KindPolicy{"charge": {Lease: time.Second}}})
		e.start(t, e.chargeWorker(t, c, func(context.Context, *river.Job[chargeArgs], once.Attempt) error {
			return giveUp
		}))
		j := e.insert(t, chargeArgs{OrderID: "order-21", Amount: 100})
		e.waitCancelledAtFirst(t, j.ID)
		if a := e.action(t, c, "order-21"); a.Status != once.StatusFailed || a.Attempt != 1 {
			t.Fatalf("action is %s at attempt %d; want failed for good at 1", a.Status, a.Attempt)
		}
		if got := e.effects(t); len(got) != 0 {
			t.Fatalf("effects %+v; want none", got)
		}
	})
	t.Run("DoTx", func(t *testing.T) {
		e := newEnv(t)
		e.ledger(t)
		c := e.client(t, once.Config{})
		e.start(t, e.creditWorker(t, c, func(context.Context, pgx.Tx, *river.Job[creditArgs], once.Attempt) (int64, error) {
			return 0, giveUp
		}))
		j := e.insert(t, creditArgs{Ref: "credit-21", Account: "acct-21", Amount: 21})
		e.waitCancelledAtFirst(t, j.ID)
		if rows := e.ledgerRows(t); len(rows) != 0 {
			t.Fatalf("ledger %+v; want nothing written", rows)
		}
	})
}

// waitCancelledAtFirst waits for the job to be cancelled at its first
// attempt, and fails the test as soon as River runs it a second time.
func (e *env) waitCancelledAtFirst(t *testing.T, id int64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := e.inserter.JobGet(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if got.State == rivertype.JobStateCancelled && got.Attempt == 1 {
			return
		}
		if got.Attempt > 1 || time.Now().After(deadline) {
			t.Fatalf("job is %s at attempt %d (errors %v); want it cancelled at its first attempt: the effect gave up", got.State, got.Attempt, got.Errors)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
