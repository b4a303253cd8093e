package riverjob_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/postgres"
	"github.com/oncehq/once/riverjob"
)

// chargeWorker registers a Worker for chargeArgs whose effect is
// recordEffect, preceded by around when it is not nil.
func (e *env) chargeWorker(t *testing.T, c *once.Client, around func(ctx context.Context, job *river.Job[chargeArgs], a once.Attempt) error) *river.Workers {
	t.Helper()
	workers, err := e.chargeWorkers(c, around)
	if err != nil {
		t.Fatal(err)
	}
	return workers
}

func (e *env) chargeWorkers(c *once.Client, around func(ctx context.Context, job *river.Job[chargeArgs], a once.Attempt) error) (*river.Workers, error) {
	w, err := riverjob.NewWorker(riverjob.WorkerConfig[chargeArgs, string]{
		Client: c,
		Intent: chargeIntent,
		Effect: func(ctx context.Context, job *river.Job[chargeArgs], a once.Attempt) (string, error) {
			if around != nil {
				if err := around(ctx, job, a); err != nil {
					return "", err
				}
			}
			if err := e.recordEffect(ctx, job.Args.OrderID, a); err != nil {
				return "", once.RetryLater(err)
			}
			return "ch_" + a.ProviderKey[:8], nil
		},
	})
	if err != nil {
		return nil, err
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, w)
	return workers, nil
}

// Two jobs that carry the same charge — inserted twice, as an
// at-least-once producer does — run the effect once, and both complete.
func TestDuplicateJobsRunTheEffectOnce(t *testing.T) {
	e := newEnv(t)
	c := e.client(t, once.Config{Kinds: map[string]once.KindPolicy{"charge": {Lease: time.Second}}})
	e.start(t, e.chargeWorker(t, c, nil))

	first := e.insert(t, chargeArgs{OrderID: "order-1", Amount: 100})
	second := e.insert(t, chargeArgs{OrderID: "order-1", Amount: 100})
	if first.ID == second.ID {
		t.Fatal("River returned one job for two inserts; the test needs two")
	}
	e.waitState(t, first.ID, rivertype.JobStateCompleted)
	e.waitState(t, second.ID, rivertype.JobStateCompleted)

	if got := e.effects(t); len(got) != 1 {
		t.Fatalf("the effect ran %d times for two jobs of one intent: %+v", len(got), got)
	}
	a := e.action(t, c, "order-1")
	if a.Status != once.StatusSucceeded || a.Attempt != 1 {
		t.Fatalf("action is %s at attempt %d; want succeeded at 1", a.Status, a.Attempt)
	}
}

// A job that meets the claim of another attempt still running is snoozed
// until the claim's lease runs out — without using up one of its
// attempts — and then replays the result.
func TestInFlightSnoozesThenReplays(t *testing.T) {
	e := newEnv(t)
	c := e.client(t, once.Config{Kinds: map[string]once.KindPolicy{"charge": {Lease: time.Second}}})
	started := make(chan struct{})
	release := make(chan struct{})
	var first atomic.Bool
	_, events := e.start(t, e.chargeWorker(t, c, func(ctx context.Context, job *river.Job[chargeArgs], a once.Attempt) error {
		if first.CompareAndSwap(false, true) {
			// The first effect holds the claim until released.
			close(started)
			select {
			case <-release:
			case <-ctx.Done():
				return once.RetryLater(ctx.Err())
			}
		}
		return nil
	}))

	a := e.insert(t, chargeArgs{OrderID: "order-2", Amount: 100})
	select {
	case <-started:
	case <-time.After(20 * time.Second):
		t.Fatal("the first job's effect did not start within 20s")
	}
	b := e.insert(t, chargeArgs{OrderID: "order-2", Amount: 100})
	ev := waitEvent(t, events, b.ID, river.EventKindJobSnoozed)
	var meta struct {
		Snoozes int `json:"snoozes"`
	}
	if err := json.Unmarshal(ev.Job.Metadata, &meta); err != nil {
		t.Fatal(err)
	}
	if meta.Snoozes < 1 || ev.Job.Attempt != 0 {
		t.Fatalf("snoozed job has snoozes=%d attempt=%d; want snoozes>=1 and its attempt given back (0)", meta.Snoozes, ev.Job.Attempt)
	}
	if len(ev.Job.Errors) != 0 {
		t.Fatalf("a snooze recorded errors: %v", ev.Job.Errors)
	}
	close(release)

	e.waitState(t, a.ID, rivertype.JobStateCompleted)
	done := e.waitState(t, b.ID, rivertype.JobStateCompleted)
	if done.Attempt != 1 || len(done.Errors) != 0 {
		t.Fatalf("the snoozed job completed at attempt %d with errors %v; want attempt 1 and none: snoozes must not count", done.Attempt, done.Errors)
	}
	if got := e.effects(t); len(got) != 1 {
		t.Fatalf("the effect ran %d times: %+v", len(got), got)
	}
}

// A permanent failure cancels the job — never retried — and a duplicate
// job gets the stored failure back and is cancelled too, without running
// the effect.
func TestPermanentFailureCancels(t *testing.T) {
	e := newEnv(t)
	c := e.client(t, once.Config{Kinds: map[string]once.KindPolicy{"charge": {Lease: time.Second}}})
	ran := make(chan struct{}, 10)
	_, events := e.start(t, e.chargeWorker(t, c, func(context.Context, *river.Job[chargeArgs], once.Attempt) error {
		ran <- struct{}{}
		return once.Permanent(errDeclined)
	}))

	a := e.insert(t, chargeArgs{OrderID: "order-3", Amount: 100})
	ev := waitEvent(t, events, a.ID, river.EventKindJobCancelled)
	if ev.Job.Attempt != 1 || !errorsContain(ev.Job, errDeclined.Error()) {
		t.Fatalf("cancelled job: attempt %d, errors %v; want attempt 1 with %q", ev.Job.Attempt, ev.Job.Errors, errDeclined)
	}
	b := e.insert(t, chargeArgs{OrderID: "order-3", Amount: 100})
	waitEvent(t, events, b.ID, river.EventKindJobCancelled)

	if n := len(ran); n != 1 {
		t.Fatalf("the effect ran %d times; want 1", n)
	}
	if j := e.waitState(t, a.ID, rivertype.JobStateCancelled); j.Attempt != 1 {
		t.Fatalf("the cancelled job was retried: attempt %d", j.Attempt)
	}
	act := e.action(t, c, "order-3")
	if act.Status != once.StatusFailed {
		t.Fatalf("action is %s; want failed", act.Status)
	}
}

// A job whose effect did not happen (RetryLater) is retried by River
// with its backoff, and the retry runs the effect.
func TestRetryLaterRetriesTheJob(t *testing.T) {
	e := newEnv(t)
	c := e.client(t, once.Config{Kinds: map[string]once.KindPolicy{"charge": {Lease: time.Second}}})
	e.start(t, e.chargeWorker(t, c, func(_ context.Context, job *river.Job[chargeArgs], _ once.Attempt) error {
		if job.Attempt == 1 {
			return once.RetryLater(errors.New("provider busy"))
		}
		return nil
	}))
	j := e.insert(t, chargeArgs{OrderID: "order-4", Amount: 100})
	done := e.waitState(t, j.ID, rivertype.JobStateCompleted)
	if done.Attempt != 2 || !errorsContain(done, "provider busy") {
		t.Fatalf("job completed at attempt %d with errors %v; want attempt 2 after one 'provider busy'", done.Attempt, done.Errors)
	}
	got := e.effects(t)
	if len(got) != 1 || got[0].Attempt != 2 {
		t.Fatalf("effects %+v; want one, by once attempt 2", got)
	}
}

// A re-driven job whose args name another action is cancelled, not run:
// its Redrive build function is wrong.
func TestWorkerRefusesAMismatchedRedrive(t *testing.T) {
	e := newEnv(t)
	c := e.client(t, once.Config{Kinds: map[string]once.KindPolicy{"charge": {Lease: time.Second}}})
	_, events := e.start(t, e.chargeWorker(t, c, nil))
	j := e.insert(t, chargeArgs{OrderID: "order-5", Amount: 100, Redriven: riverjob.Redriven{OnceKey: "0000", OnceAttempt: 1}})
	ev := waitEvent(t, events, j.ID, river.EventKindJobCancelled)
	if !errorsContain(ev.Job, "was re-driven for action 0000") {
		t.Fatalf("errors %v; want the mismatch named", ev.Job.Errors)
	}
	if got := e.effects(t); len(got) != 0 {
		t.Fatalf("the effect ran: %+v", got)
	}
}

func TestNewWorkerRefusesBadConfig(t *testing.T) {
	c := offlineClient(t, once.Config{})
	effect := func(context.Context, *river.Job[chargeArgs], once.Attempt) (string, error) { return "", nil }
	for _, tc := range []struct {
		name string
		cfg  riverjob.WorkerConfig[chargeArgs, string]
		want string
	}{
		{"no client", riverjob.WorkerConfig[chargeArgs, string]{Intent: chargeIntent, Effect: effect}, "Client is nil"},
		{"no intent", riverjob.WorkerConfig[chargeArgs, string]{Client: c, Effect: effect}, "Intent is nil"},
		{"no effect", riverjob.WorkerConfig[chargeArgs, string]{Client: c, Intent: chargeIntent}, "neither Effect nor EffectTx"},
		{"tx without store", riverjob.WorkerConfig[chargeArgs, string]{Client: c, Intent: chargeIntent,
			EffectTx: func(context.Context, pgx.Tx, *river.Job[chargeArgs], once.Attempt) (string, error) { return "", nil }}, "needs Store"},
		{"negative timeout", riverjob.WorkerConfig[chargeArgs, string]{Client: c, Intent: chargeIntent, Effect: effect, Timeout: -2}, "Timeout is -2ns"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := riverjob.NewWorker(tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v; want one containing %q", err, tc.want)
			}
		})
	}
}

// River's timeout for a job defaults to the kind's MaxExecution and a
// margin, so once's limit is the one that cuts a slow effect off.
func TestWorkerTimeoutCoversMaxExecution(t *testing.T) {
	c := offlineClient(t, once.Config{Kinds: map[string]once.KindPolicy{"charge": {MaxExecution: 7 * time.Minute}}})
	effect := func(context.Context, *river.Job[chargeArgs], once.Attempt) (string, error) { return "", nil }
	w, err := riverjob.NewWorker(riverjob.WorkerConfig[chargeArgs, string]{Client: c, Intent: chargeIntent, Effect: effect})
	if err != nil {
		t.Fatal(err)
	}
	job := &river.Job[chargeArgs]{JobRow: &rivertype.JobRow{}, Args: chargeArgs{OrderID: "o"}}
	if got, want := w.Timeout(job), 7*time.Minute+riverjob.TimeoutMargin; got != want {
		t.Fatalf("Timeout = %v; want %v", got, want)
	}
	w, err = riverjob.NewWorker(riverjob.WorkerConfig[chargeArgs, string]{Client: c, Intent: chargeIntent, Effect: effect, Timeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	if got := w.Timeout(job); got != -1 {
		t.Fatalf("Timeout = %v; want -1 as configured", got)
	}
}

// offlineStore is a store for tests that make no call to the database:
// its pool connects only when used, and nothing uses it.
func offlineStore(t *testing.T) *postgres.Store {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), testdb.PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := postgres.New(pool, postgres.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return store
}

func offlineClient(t *testing.T, cfg once.Config) *once.Client {
	t.Helper()
	cfg.Store = offlineStore(t)
	c, err := once.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
