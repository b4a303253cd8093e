package riverjob

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/oncehq/once"
	"github.com/oncehq/once/postgres"
)

// DoTx runs an effect that is a write to the database River and store
// share, for a River worker of your own. In one transaction, begun on
// the store's pool, once.DoTx claims the intent and runs fn with the
// transaction, river.JobCompleteTx marks job completed, and the
// transaction commits: the effect, the action's record and the job's
// completion are one commit. There is no moment in which the effect
// happened but the job could run it again.
//
// A duplicate job gets the stored result back (Result.Replayed) without
// running fn, and is completed in the same way. When fn, the record or
// the completion fails, the transaction rolls back and nothing of the
// three happened: return Dispose(err) and River retries the job (or
// cancels it, when fn returned once.Permanent). A commit whose reply was
// lost may have committed: then River finds the job completed and keeps
// it so, and a retry would replay.
//
// job must be the job River is working, with the River client in ctx (a
// worker's Work context), since river.JobCompleteTx needs both. The
// River client must use the riverpgxv5 driver on the same database as
// store.
func DoTx[T river.JobArgs, R any](ctx context.Context, c *once.Client, store *postgres.Store, job *river.Job[T], in once.Intent, fn func(ctx context.Context, tx pgx.Tx, a once.Attempt) (R, error)) (once.Result[R], error) {
	switch {
	case c == nil:
		return once.Result[R]{}, errors.New("riverjob: DoTx called with a nil *once.Client")
	case store == nil:
		return once.Result[R]{}, errors.New("riverjob: DoTx called with a nil *postgres.Store; pass the store the client was made with")
	case job == nil || job.JobRow == nil:
		return once.Result[R]{}, errors.New("riverjob: DoTx called without the River job being worked; pass the job Work received")
	case fn == nil:
		return once.Result[R]{}, errors.New("riverjob: DoTx called with a nil effect function")
	}
	return doTx(ctx, c, store, job, in, fn)
}

func doTx[T river.JobArgs, R any](ctx context.Context, c *once.Client, store *postgres.Store, job *river.Job[T], in once.Intent, fn func(context.Context, pgx.Tx, once.Attempt) (R, error)) (once.Result[R], error) {
	var zero once.Result[R]
	tx, err := store.Pool().Begin(ctx)
	if err != nil {
		return zero, fmt.Errorf("riverjob: job %d: beginning the transaction: %w", job.ID, err)
	}
	// After a commit this does nothing; otherwise it undoes the claim,
	// the effect and the completion together. It must run even when
	// River cancelled ctx.
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	res, err := once.DoTx(ctx, c, store, tx, in, fn)
	if err != nil {
		return zero, err
	}
	if _, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job); err != nil {
		return zero, fmt.Errorf("riverjob: job %d: completing the job in the effect's transaction: %w; nothing was committed", job.ID, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return zero, fmt.Errorf("riverjob: job %d: committing the effect, its record and the job's completion: %w; if the commit went through, the job stays completed, otherwise nothing happened and the job is retried", job.ID, err)
	}
	return res, nil
}
