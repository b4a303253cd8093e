package riverjob_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/postgres"
	"github.com/oncehq/once/riverjob"
)

// WelcomeArgs is a River job that sends a welcome email. It embeds
// riverjob.Redriven so that a re-drive inserts one job per released
// attempt.
type WelcomeArgs struct {
	UserID string `json:"user_id"`
	Email  string `json:"email"`
	riverjob.Redriven
}

func (WelcomeArgs) Kind() string { return "welcome_email" }

// A welcome email sent from a River job: the job inserted twice — an
// at-least-once producer, a retried request — sends one email, and both
// jobs complete. River and once share one PostgreSQL pool.
func Example() {
	ctx := context.Background()
	pool, schema, cleanup, err := exampleDatabase(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer cleanup()
	store, err := postgres.New(pool, postgres.Config{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	// An insert-only River client for the Redrive hook: the once client
	// needs it before the workers, which need the once client, exist.
	inserter, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: schema, Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	client, err := once.New(once.Config{Store: store, Kinds: map[string]once.KindPolicy{
		"send_email": {
			Recovery: once.RetryWithProviderKey, // the mail API takes an idempotency key
			Redrive: riverjob.Redrive(inserter, func(a once.Action) (river.JobArgs, *river.InsertOpts, error) {
				var args WelcomeArgs // the intent's payload is the args
				err := json.Unmarshal(a.Payload, &args)
				args.Redriven = riverjob.RedrivenFrom(a)
				return args, nil, err
			}),
		},
	}})
	if err != nil {
		log.Fatal(err)
	}

	var sent atomic.Int32
	worker, err := riverjob.NewWorker(riverjob.WorkerConfig[WelcomeArgs, string]{
		Client: client,
		Intent: func(job *river.Job[WelcomeArgs]) once.Intent {
			return once.Intent{Run: "welcome-" + job.Args.UserID, Kind: "send_email", Target: job.Args.Email, Payload: job.Args}
		},
		Effect: func(ctx context.Context, job *river.Job[WelcomeArgs], a once.Attempt) (string, error) {
			sent.Add(1) // the mail API call, with a.ProviderKey as its idempotency key
			return "msg-" + a.ProviderKey[:8], nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, worker)
	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Schema:  schema,
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 2}},
		Workers: workers,
		Logger:  quiet,
	})
	if err != nil {
		log.Fatal(err)
	}
	completed, unsubscribe := rc.Subscribe(river.EventKindJobCompleted)
	defer unsubscribe()
	if err := rc.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer rc.Stop(ctx)

	for range 2 {
		if _, err := rc.Insert(ctx, WelcomeArgs{UserID: "4711", Email: "ada@example.com"}, nil); err != nil {
			log.Fatal(err)
		}
		select {
		case <-completed:
		case <-time.After(30 * time.Second):
			log.Fatal("the job did not complete within 30s")
		}
	}
	fmt.Println("jobs completed: 2, emails sent:", sent.Load())
	// Output: jobs completed: 2, emails sent: 1
}

// exampleDatabase opens a small pool on the test PostgreSQL and a schema
// of its own with River's tables; cleanup drops it.
func exampleDatabase(ctx context.Context) (*pgxpool.Pool, string, func(), error) {
	cfg, err := pgxpool.ParseConfig(testdb.PostgresURL())
	if err != nil {
		return nil, "", nil, err
	}
	cfg.MaxConns = 4
	pool, err := testdb.RetryTooManyClients(ctx, func() (*pgxpool.Pool, error) {
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err == nil {
			if err = p.Ping(ctx); err != nil {
				p.Close()
			}
		}
		return p, err
	})
	if err != nil {
		return nil, "", nil, err
	}
	var b [6]byte
	rand.Read(b[:])
	schema := "riverjob_example_" + hex.EncodeToString(b[:])
	cleanup := func() {
		pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		pool.Close()
	}
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{schema}.Sanitize()); err != nil {
		cleanup()
		return nil, "", nil, err
	}
	if err := migrateRiver(ctx, pool, schema); err != nil {
		cleanup()
		return nil, "", nil, err
	}
	return pool, schema, cleanup, nil
}
