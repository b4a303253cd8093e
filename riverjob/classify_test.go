package riverjob_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

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
