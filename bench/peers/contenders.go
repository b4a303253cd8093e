package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/oncehq/once"
	"github.com/oncehq/once/postgres"
)

// Arm names, as the output and --arms spell them.
const (
	armDo              = "do"
	armDBOSWorkflow    = "dbos_workflow"
	armRiverInsert     = "river_insert"
	armRiverInsertMany = "river_insert_many"
)

// allArms is every arm, in the order the output lists them.
var allArms = []string{armDo, armDBOSWorkflow, armRiverInsert, armRiverInsertMany}

// insertManyBatch is how many jobs one river_insert_many call inserts.
const insertManyBatch = 64

// The schemas each contender's tables live in, inside its own database.
const (
	schemaOnce  = "once"
	schemaDBOS  = "dbos"
	schemaRiver = "river"
)

// arm is one measured way of doing an action.
type arm struct {
	name string
	// batch is how many actions one call performs.
	batch int
	// call performs one call; n is unique within the run, for the
	// call's keys, workflow IDs and job arguments.
	call func(ctx context.Context, n int64) error
	// owner is the contender whose pool and database the arm uses.
	owner *contender
}

// contender is one library under test, in a database of its own with one
// pool, and the arms that measure it.
type contender struct {
	name string
	db   string
	pool *pgxpool.Pool
	arms []*arm
	// close stops the library's client; the pool is closed after it.
	close func(context.Context) error
}

// quiet discards the libraries' informational logs; warnings still go
// to stderr.
var quiet = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

// setupDo makes the once contender: a Client over the PostgreSQL store in
// schema "once", and the do arm, one Do per action with a new key and an
// effect that does nothing.
func setupDo(ctx context.Context, c *contender, runID string) error {
	store, err := postgres.New(c.pool, postgres.Config{Schema: schemaOnce})
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil {
		return fmt.Errorf("migrating the once store: %w", err)
	}
	client, err := once.New(once.Config{Store: store, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return err
	}
	noop := func(context.Context, once.Attempt) (string, error) { return "ok", nil }
	run := "peers-" + runID
	c.arms = append(c.arms, &arm{name: armDo, batch: 1, call: func(ctx context.Context, n int64) error {
		res, err := once.Do(ctx, client, once.Intent{Run: run, Step: n, Kind: "noop", Target: "peers"}, noop)
		if err == nil && res.Replayed {
			return fmt.Errorf("do: step %d was replayed, but every action has a new key", n)
		}
		return err
	}})
	c.close = func(context.Context) error { return store.Close() }
	return nil
}

// noopStep is the DBOS workflow's one step: it does nothing and returns
// a small value.
func noopStep(_ context.Context, n int64) (int64, error) { return n, nil }

// oneStepWorkflow is the workflow the dbos_workflow arm starts and awaits.
func oneStepWorkflow(ctx dbos.Context, n int64) (int64, error) {
	return dbos.RunAsStep(ctx, func(sctx context.Context) (int64, error) { return noopStep(sctx, n) }, dbos.WithStepName("noop"))
}

// setupDBOS launches a DBOS context whose system database is the
// contender's database (schema "dbos", created and migrated by Launch)
// over the contender's pool, and the dbos_workflow arm: one one-step
// workflow per action, started with a new workflow ID and awaited.
func setupDBOS(ctx context.Context, c *contender, runID string) error {
	dctx, err := dbos.NewContext(ctx, dbos.Config{
		AppName:        "once-peers",
		SystemDBPool:   c.pool,
		DatabaseSchema: schemaDBOS,
		Logger:         quiet,
	})
	if err != nil {
		return fmt.Errorf("starting DBOS: %w", err)
	}
	dbos.RegisterWorkflow(dctx, oneStepWorkflow, dbos.WithWorkflowName("peers_one_step"))
	if err := dbos.Launch(dctx); err != nil {
		return fmt.Errorf("launching DBOS: %w", err)
	}
	// DBOS closes the pool it was given when it shuts down.
	c.close = func(context.Context) error { return dbos.Shutdown(dctx, 10*time.Second) }
	c.arms = append(c.arms, &arm{name: armDBOSWorkflow, batch: 1, call: func(_ context.Context, n int64) error {
		h, err := dbos.RunWorkflow(dctx, oneStepWorkflow, n, dbos.WithWorkflowID(fmt.Sprintf("peers-%s-%d", runID, n)))
		if err != nil {
			return err
		}
		got, err := h.GetResult()
		if err == nil && got != n {
			return fmt.Errorf("dbos_workflow: workflow %d returned %d", n, got)
		}
		return err
	}})
	return nil
}

// noopArgs is the job the River arms insert. No worker runs it.
type noopArgs struct {
	N int64 `json:"n"`
}

func (noopArgs) Kind() string { return "peers_noop" }

// setupRiver migrates River into schema "river" of the contender's
// database and makes an insert-only client (no queues, no workers), with
// two arms: river_insert, Insert of one job per action, and
// river_insert_many, InsertMany of insertManyBatch jobs per call.
func setupRiver(ctx context.Context, c *contender) error {
	driver := riverpgxv5.New(c.pool)
	if _, err := c.pool.Exec(ctx, "CREATE SCHEMA "+schemaRiver); err != nil {
		return fmt.Errorf("creating River's schema: %w", err)
	}
	m, err := rivermigrate.New(driver, &rivermigrate.Config{Schema: schemaRiver, Logger: quiet})
	if err != nil {
		return err
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("migrating River: %w", err)
	}
	client, err := river.NewClient(driver, &river.Config{Schema: schemaRiver, Logger: quiet})
	if err != nil {
		return err
	}
	c.close = func(context.Context) error { return nil }
	c.arms = append(c.arms,
		&arm{name: armRiverInsert, batch: 1, call: func(ctx context.Context, n int64) error {
			_, err := client.Insert(ctx, noopArgs{N: n}, nil)
			return err
		}},
		&arm{name: armRiverInsertMany, batch: insertManyBatch, call: func(ctx context.Context, n int64) error {
			params := make([]river.InsertManyParams, insertManyBatch)
			for i := range params {
				params[i] = river.InsertManyParams{Args: noopArgs{N: n*insertManyBatch + int64(i)}}
			}
			res, err := client.InsertMany(ctx, params)
			if err == nil && len(res) != insertManyBatch {
				return fmt.Errorf("river_insert_many: %d jobs inserted of %d", len(res), insertManyBatch)
			}
			return err
		}},
	)
	return nil
}
