package riverjob_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/oncehq/once"
	"github.com/oncehq/once/riverjob"
)

// creditArgs credits an account in the same database: the effect is a
// ledger row, written in the transaction that records the action and
// completes the job.
type creditArgs struct {
	Ref     string `json:"ref"`
	Account string `json:"account"`
	Amount  int    `json:"amount"`
}

func (creditArgs) Kind() string { return "credit" }

func creditIntent(job *river.Job[creditArgs]) once.Intent {
	return once.Intent{Run: job.Args.Ref, Kind: "credit", Target: job.Args.Account, Payload: job.Args}
}

func (e *env) ledger(t *testing.T) {
	t.Helper()
	// The reference is unique, checked at commit: a row that breaks it
	// makes the commit fail after the effect, the record and the job's
	// completion were all written.
	if _, err := e.pool.Exec(context.Background(), `CREATE TABLE `+e.table("ledger")+` (
		id bigserial PRIMARY KEY, ref text NOT NULL, account text NOT NULL, amount int NOT NULL, river_attempt int NOT NULL,
		CONSTRAINT ledger_ref_unique UNIQUE (ref) DEFERRABLE INITIALLY DEFERRED)`); err != nil {
		t.Fatal(err)
	}
}

type ledgerRow struct {
	Ref          string
	Account      string
	Amount       int
	RiverAttempt int
}

func (e *env) ledgerRows(t *testing.T) []ledgerRow {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT ref, account, amount, river_attempt FROM `+e.table("ledger")+` ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[ledgerRow])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// credit writes the ledger row in tx; ref overrides the job's reference
// when not empty.
func (e *env) credit(ctx context.Context, tx pgx.Tx, job *river.Job[creditArgs], ref string) (int64, error) {
	if ref == "" {
		ref = job.Args.Ref
	}
	var id int64
	err := tx.QueryRow(ctx, `INSERT INTO `+e.table("ledger")+` (ref, account, amount, river_attempt) VALUES ($1, $2, $3, $4) RETURNING id`,
		ref, job.Args.Account, job.Args.Amount, job.Attempt).Scan(&id)
	return id, err
}

func (e *env) creditWorker(t *testing.T, c *once.Client, effect func(ctx context.Context, tx pgx.Tx, job *river.Job[creditArgs], a once.Attempt) (int64, error)) *river.Workers {
	t.Helper()
	w, err := riverjob.NewWorker(riverjob.WorkerConfig[creditArgs, int64]{Client: c, Store: e.store, Intent: creditIntent, EffectTx: effect})
	if err != nil {
		t.Fatal(err)
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, w)
	return workers
}

func (e *env) creditAction(t *testing.T, c *once.Client, args creditArgs) (once.Action, error) {
	t.Helper()
	key, _, err := once.KeyOf(creditIntent(&river.Job[creditArgs]{Args: args}))
	if err != nil {
		t.Fatal(err)
	}
	return c.Get(context.Background(), key)
}

// Jobs that carry the same credit — two at once, and one more after
// both finished — write one ledger row. The duplicates replay the stored
// result and are completed in a transaction of their own.
func TestEffectTxWritesOnceForDuplicateJobs(t *testing.T) {
	e := newEnv(t)
	e.ledger(t)
	c := e.client(t, once.Config{})
	replays := make(chan int64, 10)
	w := river.WorkFunc(func(ctx context.Context, job *river.Job[creditArgs]) error {
		res, err := riverjob.DoTx(ctx, c, e.store, job, creditIntent(job), func(ctx context.Context, tx pgx.Tx, _ once.Attempt) (int64, error) {
			return e.credit(ctx, tx, job, "")
		})
		if err == nil && res.Replayed {
			replays <- res.Value
		}
		return riverjob.Dispose(err)
	})
	workers := river.NewWorkers()
	river.AddWorker(workers, w)
	e.start(t, workers)

	args := creditArgs{Ref: "credit-1", Account: "acct-1", Amount: 250}
	a, b := e.insert(t, args), e.insert(t, args)
	e.waitState(t, a.ID, rivertype.JobStateCompleted)
	e.waitState(t, b.ID, rivertype.JobStateCompleted)
	late := e.insert(t, args)
	e.waitState(t, late.ID, rivertype.JobStateCompleted)

	rows := e.ledgerRows(t)
	if len(rows) != 1 {
		t.Fatalf("%d ledger rows for three jobs of one credit: %+v", len(rows), rows)
	}
	act, err := e.creditAction(t, c, args)
	if err != nil {
		t.Fatal(err)
	}
	if act.Status != once.StatusSucceeded || act.Attempt != 1 {
		t.Fatalf("action %s at attempt %d; want succeeded at 1", act.Status, act.Attempt)
	}
	// The job that met the open transaction either waited for its commit
	// and replayed, or was retried after the claim timeout and replayed
	// then: every duplicate replays.
	if n := len(replays); n != 2 {
		t.Fatalf("%d replays; want 2", n)
	}
	if v := <-replays; fmt.Sprint(v) != string(act.Result) {
		t.Fatalf("replayed %d; stored %s", v, act.Result)
	}
}

// The job's completion commits with the effect: a worker that goes wrong
// after the commit (here it returns an error, as a process that died
// there would never report back) leaves the job completed, not retried.
func TestDoTxCompletesTheJobInTheTransaction(t *testing.T) {
	e := newEnv(t)
	e.ledger(t)
	c := e.client(t, once.Config{})
	w := river.WorkFunc(func(ctx context.Context, job *river.Job[creditArgs]) error {
		_, err := riverjob.DoTx(ctx, c, e.store, job, creditIntent(job), func(ctx context.Context, tx pgx.Tx, _ once.Attempt) (int64, error) {
			return e.credit(ctx, tx, job, "")
		})
		if err != nil {
			return err
		}
		return errors.New("lost after the commit")
	})
	workers := river.NewWorkers()
	river.AddWorker(workers, w)
	_, events := e.start(t, workers)
	j := e.insert(t, creditArgs{Ref: "credit-5", Account: "acct-5", Amount: 5})
	ev := waitEvent(t, events, j.ID, river.EventKindJobCompleted)
	if ev.Job.Attempt != 1 {
		t.Fatalf("job completed at attempt %d; want 1, completed by the effect's commit", ev.Job.Attempt)
	}
	if got := e.waitState(t, j.ID, rivertype.JobStateCompleted); got.Attempt != 1 {
		t.Fatalf("job is at attempt %d; want 1", got.Attempt)
	}
	if rows := e.ledgerRows(t); len(rows) != 1 {
		t.Fatalf("ledger %+v; want one row", rows)
	}
}

// An effect that fails inside the transaction leaves nothing behind: no
// ledger row, no record of the action, the job not completed. River
// retries it, and the retry writes the row once.
func TestEffectTxErrorRollsBackAndRetries(t *testing.T) {
	e := newEnv(t)
	e.ledger(t)
	c := e.client(t, once.Config{})
	e.start(t, e.creditWorker(t, c, func(ctx context.Context, tx pgx.Tx, job *river.Job[creditArgs], _ once.Attempt) (int64, error) {
		id, err := e.credit(ctx, tx, job, "")
		if err != nil {
			return 0, err
		}
		if job.Attempt == 1 {
			return 0, errors.New("ledger service says no")
		}
		return id, nil
	}))
	args := creditArgs{Ref: "credit-2", Account: "acct-2", Amount: 10}
	j := e.insert(t, args)
	done := e.waitState(t, j.ID, rivertype.JobStateCompleted)
	if done.Attempt != 2 || !errorsContain(done, "ledger service says no") {
		t.Fatalf("job completed at attempt %d with errors %v; want attempt 2 after the failure", done.Attempt, done.Errors)
	}
	rows := e.ledgerRows(t)
	if len(rows) != 1 || rows[0].RiverAttempt != 2 {
		t.Fatalf("ledger %+v; want the one row of River's attempt 2", rows)
	}
	e.checkOneClaim(t, c, args)
}

// checkOneClaim checks that the action's trail holds one claim: the
// failed attempts' claims were rolled back with their effects.
func (e *env) checkOneClaim(t *testing.T, c *once.Client, args creditArgs) {
	t.Helper()
	act, err := e.creditAction(t, c, args)
	if err != nil {
		t.Fatal(err)
	}
	if act.Status != once.StatusSucceeded || act.Attempt != 1 {
		t.Fatalf("action %s at attempt %d; want succeeded at 1: the failed try's claim must have rolled back", act.Status, act.Attempt)
	}
	evs, err := c.Events(context.Background(), act.Key)
	if err != nil {
		t.Fatal(err)
	}
	claims := 0
	for _, ev := range evs {
		if ev.Type == once.EventClaimed {
			claims++
		}
	}
	if claims != 1 {
		t.Fatalf("%d claims in the trail %+v; want 1", claims, evs)
	}
}

// A commit that fails after the effect, the record and the job's
// completion were written undoes all three: the job is retried, not left
// completed with its effect lost, and the action is not recorded as done.
func TestEffectTxCommitFailureUndoesAll(t *testing.T) {
	e := newEnv(t)
	e.ledger(t)
	if _, err := e.pool.Exec(context.Background(), `INSERT INTO `+e.table("ledger")+` (ref, account, amount, river_attempt) VALUES ('taken', 'x', 0, 0)`); err != nil {
		t.Fatal(err)
	}
	c := e.client(t, once.Config{})
	e.start(t, e.creditWorker(t, c, func(ctx context.Context, tx pgx.Tx, job *river.Job[creditArgs], _ once.Attempt) (int64, error) {
		ref := ""
		if job.Attempt == 1 {
			ref = "taken" // breaks the deferred unique constraint at commit
		}
		return e.credit(ctx, tx, job, ref)
	}))
	args := creditArgs{Ref: "credit-3", Account: "acct-3", Amount: 30}
	j := e.insert(t, args)
	done := e.waitState(t, j.ID, rivertype.JobStateCompleted)
	if done.Attempt != 2 || !errorsContain(done, "committing the effect") || !errorsContain(done, "ledger_ref_unique") {
		t.Fatalf("job completed at attempt %d with errors %v; want attempt 2 after a failed commit", done.Attempt, done.Errors)
	}
	rows := e.ledgerRows(t)
	if len(rows) != 2 || rows[1].Ref != "credit-3" || rows[1].RiverAttempt != 2 {
		t.Fatalf("ledger %+v; want the seed row and attempt 2's", rows)
	}
	e.checkOneClaim(t, c, args)
}

// The connection that holds the transaction dies in the middle of the
// effect: the server rolls everything back, and River's retry writes the
// row once.
func TestEffectTxConnectionKilled(t *testing.T) {
	e := newEnv(t)
	e.ledger(t)
	c := e.client(t, once.Config{})
	e.start(t, e.creditWorker(t, c, func(ctx context.Context, tx pgx.Tx, job *river.Job[creditArgs], _ once.Attempt) (int64, error) {
		id, err := e.credit(ctx, tx, job, "")
		if err != nil {
			return 0, err
		}
		if job.Attempt == 1 {
			_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
			return 0, fmt.Errorf("after the connection was killed: %v", err)
		}
		return id, nil
	}))
	args := creditArgs{Ref: "credit-6", Account: "acct-6", Amount: 60}
	j := e.insert(t, args)
	done := e.waitState(t, j.ID, rivertype.JobStateCompleted)
	if done.Attempt != 2 {
		t.Fatalf("job completed at attempt %d with errors %v; want 2", done.Attempt, done.Errors)
	}
	rows := e.ledgerRows(t)
	if len(rows) != 1 || rows[0].RiverAttempt != 2 {
		t.Fatalf("ledger %+v; want the one row of River's attempt 2", rows)
	}
	e.checkOneClaim(t, c, args)
}

// A permanent failure inside the transaction records nothing (the
// transaction rolls back) and cancels the job: retrying would change
// nothing.
func TestEffectTxPermanentCancels(t *testing.T) {
	e := newEnv(t)
	e.ledger(t)
	c := e.client(t, once.Config{})
	_, events := e.start(t, e.creditWorker(t, c, func(ctx context.Context, tx pgx.Tx, job *river.Job[creditArgs], _ once.Attempt) (int64, error) {
		if _, err := e.credit(ctx, tx, job, ""); err != nil {
			return 0, err
		}
		return 0, once.Permanent(errors.New("account closed"))
	}))
	args := creditArgs{Ref: "credit-4", Account: "acct-4", Amount: 40}
	j := e.insert(t, args)
	ev := waitEvent(t, events, j.ID, river.EventKindJobCancelled)
	if ev.Job.Attempt != 1 || !errorsContain(ev.Job, "account closed") {
		t.Fatalf("cancelled at attempt %d with errors %v", ev.Job.Attempt, ev.Job.Errors)
	}
	if rows := e.ledgerRows(t); len(rows) != 0 {
		t.Fatalf("ledger %+v; want nothing written", rows)
	}
	if _, err := e.creditAction(t, c, args); !errors.Is(err, once.ErrNotFound) {
		t.Fatalf("action lookup: %v; want ErrNotFound, nothing recorded", err)
	}
}

func TestDoTxRefusesBadInput(t *testing.T) {
	ctx := context.Background()
	c := offlineClient(t, once.Config{})
	e := &env{}
	fn := func(context.Context, pgx.Tx, once.Attempt) (int, error) { return 0, nil }
	job := &river.Job[creditArgs]{JobRow: &rivertype.JobRow{ID: 1}}
	in := once.Intent{Run: "r", Kind: "credit"}
	for _, tc := range []struct {
		name string
		call func() error
		want string
	}{
		{"nil client", func() error { _, err := riverjob.DoTx(ctx, nil, e.store, job, in, fn); return err }, "nil *once.Client"},
		{"nil store", func() error { _, err := riverjob.DoTx(ctx, c, nil, job, in, fn); return err }, "nil *postgres.Store"},
		{"nil job", func() error {
			_, err := riverjob.DoTx(ctx, c, offlineStore(t), (*river.Job[creditArgs])(nil), in, fn)
			return err
		}, "without the River job"},
		{"nil fn", func() error {
			_, err := riverjob.DoTx[creditArgs, int](ctx, c, offlineStore(t), job, in, nil)
			return err
		}, "nil effect"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v; want one containing %q", err, tc.want)
			}
		})
	}
}
