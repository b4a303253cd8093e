package riverjob_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/oncehq/once"
	"github.com/oncehq/once/riverjob"
)

// overLimit asks for approval of a charge over 1000, for expiry. The
// payload is the whole args.
func overLimit(expiry time.Duration) once.ApprovalPolicy {
	return once.ApprovalPolicy{Expiry: expiry, When: func(in once.Intent) bool { return in.Payload.(chargeArgs).Amount > 1000 }}
}

func (e *env) approve(t *testing.T, c *once.Client, orderID string) {
	t.Helper()
	if _, err := c.Approve(context.Background(), e.action(t, c, orderID).Key, once.Approval{By: "ada"}); err != nil {
		t.Fatal(err)
	}
}

// TestApprovalSnoozedUntilApproved: a charge over the limit, on a kind
// with no Redrive hook, is not run: its job is snoozed (no attempt used
// up), not failed or cancelled. Once a person approves it, the job's
// next run charges, once, and a duplicate job replays.
func TestApprovalSnoozedUntilApproved(t *testing.T) {
	e := newEnv(t)
	// The wait is short, so the snooze (a minute at most, or just past
	// the expiry) brings the job back within the test.
	c := e.client(t, once.Config{Kinds: map[string]once.KindPolicy{"charge": {Approval: overLimit(5 * time.Second)}}})
	_, events := e.start(t, e.chargeWorker(t, c, nil))
	job := e.insert(t, chargeArgs{OrderID: "order-ap", Amount: 2500})
	waitEvent(t, events, job.ID, river.EventKindJobSnoozed)
	if got := e.effects(t); len(got) != 0 {
		t.Fatalf("the charge ran %d times before anyone approved it", len(got))
	}
	if a := e.action(t, c, "order-ap"); a.Status != once.StatusAwaitingApproval {
		t.Fatalf("action is %s; want awaiting_approval", a.Status)
	}
	e.approve(t, c, "order-ap")
	done := e.waitState(t, job.ID, rivertype.JobStateCompleted)
	if got := e.effects(t); len(got) != 1 || got[0].Attempt != 2 {
		t.Fatalf("effects %+v; want one charge, as attempt 2", got)
	}
	if len(done.Errors) != 0 {
		t.Fatalf("the job recorded errors %v; a wait for approval is no failure", done.Errors)
	}
	dup := e.insert(t, chargeArgs{OrderID: "order-ap", Amount: 2500})
	e.waitState(t, dup.ID, rivertype.JobStateCompleted)
	if got := e.effects(t); len(got) != 1 {
		t.Fatalf("the charge ran %d times after a duplicate job; want once", len(got))
	}
	// Under the limit: no approval asked.
	small := e.insert(t, chargeArgs{OrderID: "order-small", Amount: 10})
	e.waitState(t, small.ID, rivertype.JobStateCompleted)
}

// TestApprovalCancelledThenRedriven: on a kind with a Redrive hook, a
// job awaiting approval is cancelled at once. Once approved, the reaper
// inserts a job for it after RedriveAfter, which charges, once.
func TestApprovalCancelledThenRedriven(t *testing.T) {
	e := newEnv(t)
	pol := once.KindPolicy{Approval: overLimit(time.Hour), Redrive: riverjob.Redrive(e.inserter, rebuild), RedriveAfter: 100 * time.Millisecond}
	c := e.client(t, once.Config{Kinds: map[string]once.KindPolicy{"charge": pol}})
	_, events := e.start(t, e.chargeWorker(t, c, nil))
	job := e.insert(t, chargeArgs{OrderID: "order-rd", Amount: 5000})
	waitEvent(t, events, job.ID, river.EventKindJobCancelled)
	e.approve(t, c, "order-rd")
	reaper, err := once.NewReaper(c, once.ReaperConfig{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		rep, err := reaper.RunOnce(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if rep.Redriven == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the reaper did not re-drive the approved action within 20s (last pass %+v)", rep)
		}
		time.Sleep(50 * time.Millisecond)
	}
	deadline = time.Now().Add(20 * time.Second)
	for e.action(t, c, "order-rd").Status != once.StatusSucceeded {
		if time.Now().After(deadline) {
			t.Fatalf("the re-driven action is %s after 20s; want succeeded", e.action(t, c, "order-rd").Status)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := e.effects(t); len(got) != 1 {
		t.Fatalf("the charge ran %d times; want once", len(got))
	}
	jobs, err := e.inserter.JobList(context.Background(), river.NewJobListParams().Kinds("charge"))
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs.Jobs) != 2 {
		t.Fatalf("%d charge jobs; want the cancelled one and its re-drive", len(jobs.Jobs))
	}
	for _, j := range jobs.Jobs {
		if j.ID == job.ID {
			continue
		}
		var mark riverjob.Redriven
		json.Unmarshal(j.EncodedArgs, &mark)
		if mark.OnceKey != e.action(t, c, "order-rd").Key {
			t.Fatalf("the re-driven job's args %s carry no mark for the action", j.EncodedArgs)
		}
		e.waitState(t, j.ID, rivertype.JobStateCompleted)
	}
}

// TestApprovalExpiredCancelled: the snoozes end with the wait. A job
// nobody approved is cancelled on its first run after the wait expired,
// and never charges.
func TestApprovalExpiredCancelled(t *testing.T) {
	e := newEnv(t)
	c := e.client(t, once.Config{Kinds: map[string]once.KindPolicy{"charge": {Approval: overLimit(time.Second)}}})
	_, events := e.start(t, e.chargeWorker(t, c, nil))
	job := e.insert(t, chargeArgs{OrderID: "order-ex", Amount: 1001})
	waitEvent(t, events, job.ID, river.EventKindJobSnoozed)
	done := e.waitState(t, job.ID, rivertype.JobStateCancelled)
	if !errorsContain(done, "expired") {
		t.Fatalf("the cancelled job's errors %v do not say the wait expired", done.Errors)
	}
	if got := e.effects(t); len(got) != 0 {
		t.Fatalf("the charge ran %d times; nobody approved it", len(got))
	}
}
