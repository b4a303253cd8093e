package riverjob_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/postgres"
	"github.com/oncehq/once/riverjob"
)

// envChildSchema, set, makes the test binary a worker process on that
// schema (see childMain).
const envChildSchema = "RIVERJOB_TEST_CHILD_SCHEMA"

// killPolicy is the charge kind's policy in both processes (the action
// records its RedriveAfter when it is claimed): a short lease, a provider
// that absorbs a repeated call with the same key, and a re-drive through
// ins.
func killPolicy(ins riverjob.Inserter) once.KindPolicy {
	return once.KindPolicy{
		Lease:        time.Second,
		Recovery:     once.RetryWithProviderKey,
		Redrive:      riverjob.Redrive(ins, rebuild),
		RedriveAfter: 100 * time.Millisecond,
	}
}

// rebuild is the Redrive build function: the intent's payload is the
// whole args, so the action's payload gives them back.
func rebuild(a once.Action) (river.JobArgs, *river.InsertOpts, error) {
	var args chargeArgs
	if err := json.Unmarshal(a.Payload, &args); err != nil {
		return nil, nil, err
	}
	args.Redriven = riverjob.RedrivenFrom(a)
	return args, nil, nil
}

// childMain is a worker process: a River client working charge jobs whose
// effect records itself and then hangs, until the test kills the process
// with SIGKILL.
func childMain() int {
	err := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cfg, err := pgxpool.ParseConfig(testdb.PostgresURL())
		if err != nil {
			return err
		}
		cfg.MaxConns = 3
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return err
		}
		defer pool.Close()
		if err := testdb.Warm(ctx, pool); err != nil {
			return err
		}
		e := &env{pool: pool, schema: os.Getenv(envChildSchema)}
		if e.store, err = postgres.New(pool, postgres.Config{Schema: e.schema}); err != nil {
			return err
		}
		if e.inserter, err = river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: e.schema, Logger: quiet}); err != nil {
			return err
		}
		c, err := once.New(once.Config{Store: e.store, Logger: quiet, Kinds: map[string]once.KindPolicy{"charge": killPolicy(e.inserter)}})
		if err != nil {
			return err
		}
		workers, err := e.chargeWorkers(c, func(ctx context.Context, _ *river.Job[chargeArgs], a once.Attempt) error {
			if err := e.recordEffect(ctx, "order-9", a); err != nil {
				return once.RetryLater(err)
			}
			<-ctx.Done() // the call hangs; the process dies here
			return ctx.Err()
		})
		if err != nil {
			return err
		}
		rc, err := river.NewClient(riverpgxv5.New(pool), e.riverConfig(workers))
		if err != nil {
			return err
		}
		if err := rc.Start(ctx); err != nil {
			return err
		}
		<-ctx.Done()
		return errors.New("not killed within a minute")
	}()
	fmt.Fprintln(os.Stderr, "worker:", err)
	return 1
}

// A worker process dies with SIGKILL in the middle of an effect. River
// still holds its job as running (its rescuer waits an hour); once's
// reaper recovers the lapsed claim under RetryWithProviderKey, and its
// Redrive hook inserts a job that runs the effect once more, with the
// same provider key, in this process.
func TestRedriveAfterTheWorkerIsKilled(t *testing.T) {
	e := newEnv(t)
	orig := e.insert(t, chargeArgs{OrderID: "order-9", Amount: 100})

	var stderr bytes.Buffer
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChildSchema+"="+e.schema)
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	deadline := time.Now().Add(30 * time.Second)
	for len(e.effects(t)) == 0 {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("the worker process exited before its effect ran: %v\n%s", err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the worker process's effect did not run within 30s\n%s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-exited
	exited <- nil

	c := e.client(t, once.Config{Kinds: map[string]once.KindPolicy{"charge": killPolicy(e.inserter)}})
	e.start(t, e.chargeWorker(t, c, nil))
	reaper, err := once.NewReaper(c, once.ReaperConfig{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	var released, redriven int
	deadline = time.Now().Add(30 * time.Second)
	for redriven == 0 {
		rep, err := reaper.RunOnce(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		released += rep.Released
		redriven += rep.Redriven
		if time.Now().After(deadline) {
			t.Fatalf("after 30s the reaper released %d and re-drove %d actions; want the dead worker's released and re-driven", released, redriven)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if released != 1 {
		t.Fatalf("the reaper released %d actions; want 1", released)
	}

	deadline = time.Now().Add(20 * time.Second)
	for {
		a := e.action(t, c, "order-9")
		if a.Status == once.StatusSucceeded {
			if a.Attempt != 2 {
				t.Fatalf("action succeeded at attempt %d; want 2", a.Attempt)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the re-driven action is %s at attempt %d after 20s; want succeeded", a.Status, a.Attempt)
		}
		time.Sleep(20 * time.Millisecond)
	}
	got := e.effects(t)
	if len(got) != 2 || got[0].ProviderKey != got[1].ProviderKey || got[0].Attempt != 1 || got[1].Attempt != 2 ||
		got[0].PID != cmd.Process.Pid || got[1].PID != os.Getpid() {
		t.Fatalf("effects %+v; want attempt 1 in the killed process and attempt 2 here, with one provider key", got)
	}

	jobs, err := e.inserter.JobList(context.Background(), river.NewJobListParams().Kinds("charge"))
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs.Jobs) != 2 {
		t.Fatalf("%d charge jobs; want the original and one re-driven", len(jobs.Jobs))
	}
	for _, j := range jobs.Jobs {
		if j.ID == orig.ID {
			if j.State != rivertype.JobStateRunning {
				t.Fatalf("the killed worker's job is %s; River should still hold it running", j.State)
			}
			continue
		}
		var mark riverjob.Redriven
		json.Unmarshal(j.EncodedArgs, &mark)
		if mark.OnceAttempt != 1 || mark.OnceKey == "" {
			t.Fatalf("the re-driven job's args %s carry no mark for attempt 1", j.EncodedArgs)
		}
		e.waitState(t, j.ID, rivertype.JobStateCompleted)
	}
	rep, err := reaper.RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Redriven != 0 || rep.Released != 0 || rep.Waiting != 0 {
		t.Fatalf("a pass after the re-driven job ran: %+v; want nothing to do", rep)
	}
}

// The reaper calls a Redrive hook again every RedriveAfter until a
// delivery claims the action: each released attempt gets one job.
func TestRedriveInsertsOneJobPerReleasedAttempt(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.client(t, once.Config{Kinds: map[string]once.KindPolicy{"charge": {Lease: time.Second}}})
	in := chargeIntent(&river.Job[chargeArgs]{Args: chargeArgs{OrderID: "order-7", Amount: 100}})
	release := func(want int) once.Action {
		t.Helper()
		_, err := once.Do(ctx, c, in, func(context.Context, once.Attempt) (string, error) {
			return "", once.RetryLater(errors.New("provider busy"))
		})
		if !errors.Is(err, once.ErrRetryLater) {
			t.Fatalf("Do: %v; want it released", err)
		}
		a := e.action(t, c, "order-7")
		if a.Status != once.StatusReleased || a.Attempt != want {
			t.Fatalf("action %s at attempt %d; want released at %d", a.Status, a.Attempt, want)
		}
		return a
	}
	count := func() int {
		t.Helper()
		jobs, err := e.inserter.JobList(ctx, river.NewJobListParams().Kinds("charge").First(100))
		if err != nil {
			t.Fatal(err)
		}
		return len(jobs.Jobs)
	}
	hook := riverjob.Redrive(e.inserter, rebuild)

	a1 := release(1)
	for range 3 {
		if err := hook(ctx, a1); err != nil {
			t.Fatal(err)
		}
	}
	if n := count(); n != 1 {
		t.Fatalf("three re-drives of attempt 1 inserted %d jobs; want 1", n)
	}
	a2 := release(2)
	for range 2 {
		if err := hook(ctx, a2); err != nil {
			t.Fatal(err)
		}
	}
	if n := count(); n != 2 {
		t.Fatalf("re-drives of attempts 1 and 2 inserted %d jobs; want 2", n)
	}

	// Args without the mark: every call inserts, which once absorbs.
	plain := riverjob.Redrive(e.inserter, func(a once.Action) (river.JobArgs, *river.InsertOpts, error) {
		args, _, err := rebuild(a)
		if err != nil {
			return nil, nil, err
		}
		ca := args.(chargeArgs)
		ca.Redriven = riverjob.Redriven{}
		return ca, nil, nil
	})
	for range 2 {
		if err := plain(ctx, a2); err != nil {
			t.Fatal(err)
		}
	}
	if n := count(); n != 4 {
		t.Fatalf("%d jobs after two unmarked re-drives; want 4", n)
	}

	// A mark for another attempt is the build function's mistake.
	stale := riverjob.Redrive(e.inserter, func(once.Action) (river.JobArgs, *river.InsertOpts, error) {
		args, _, err := rebuild(a1)
		return args, nil, err
	})
	if err := stale(ctx, a2); err == nil || !strings.Contains(err.Error(), "RedrivenFrom") {
		t.Fatalf("stale mark: err = %v; want it refused", err)
	}

	// A re-drive whose job was cancelled is inserted again: River's
	// default unique states leave cancelled jobs out.
	marked := func(attempt int) int64 {
		t.Helper()
		jobs, err := e.inserter.JobList(ctx, river.NewJobListParams().Kinds("charge").States(rivertype.JobStateAvailable).First(100))
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range jobs.Jobs {
			var m riverjob.Redriven
			json.Unmarshal(j.EncodedArgs, &m)
			if m.OnceAttempt == attempt {
				return j.ID
			}
		}
		t.Fatalf("no available job marked for attempt %d", attempt)
		return 0
	}
	if _, err := e.inserter.JobCancel(ctx, marked(2)); err != nil {
		t.Fatal(err)
	}
	if err := hook(ctx, a2); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 5 {
		t.Fatalf("%d jobs; want a new one for attempt 2 after its re-drive was cancelled", n)
	}

	// Unique options of the caller's that count cancelled jobs: River
	// skips the insert as a duplicate of a job that will never run, and
	// the hook says so, so the reaper counts the action as waiting
	// rather than re-driven.
	states := append(rivertype.UniqueOptsByStateDefault(), rivertype.JobStateCancelled)
	counting := riverjob.Redrive(e.inserter, func(a once.Action) (river.JobArgs, *river.InsertOpts, error) {
		args, _, err := rebuild(a)
		return args, &river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true, ByState: states}}, err
	})
	a3 := release(3)
	if err := counting(ctx, a3); err != nil {
		t.Fatal(err)
	}
	if _, err := e.inserter.JobCancel(ctx, marked(3)); err != nil {
		t.Fatal(err)
	}
	if err := counting(ctx, a3); err == nil || !strings.Contains(err.Error(), "cancelled and will not run again") {
		t.Fatalf("duplicate of a cancelled job: err = %v; want it reported", err)
	}
	if n := count(); n != 6 {
		t.Fatalf("%d jobs; want 6", n)
	}
}

func TestRedriveRefusesBadInput(t *testing.T) {
	ctx := context.Background()
	a := once.Action{Key: "k", Attempt: 1}
	if err := riverjob.Redrive(nil, rebuild)(ctx, a); err == nil || !strings.Contains(err.Error(), "nil Inserter") {
		t.Fatalf("nil inserter: %v", err)
	}
	ins := &river.Client[pgx.Tx]{}
	if err := riverjob.Redrive(ins, nil)(ctx, a); err == nil || !strings.Contains(err.Error(), "nil build") {
		t.Fatalf("nil build: %v", err)
	}
	none := func(once.Action) (river.JobArgs, *river.InsertOpts, error) { return nil, nil, nil }
	if err := riverjob.Redrive(ins, none)(ctx, a); err == nil || !strings.Contains(err.Error(), "no job args") {
		t.Fatalf("nil args: %v", err)
	}
	failing := func(once.Action) (river.JobArgs, *river.InsertOpts, error) { return nil, nil, errors.New("order gone") }
	if err := riverjob.Redrive(ins, failing)(ctx, a); err == nil || !strings.Contains(err.Error(), "order gone") {
		t.Fatalf("build error: %v", err)
	}
}
