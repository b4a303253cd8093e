package riverjob_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"
	"go.uber.org/goleak"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/postgres"
	"github.com/oncehq/once/riverjob"
)

func TestMain(m *testing.M) {
	if os.Getenv(envChildSchema) != "" {
		os.Exit(childMain())
	}
	// The Example needs PostgreSQL too, and an Example cannot skip: a
	// machine without it skips the package as the tests would, except
	// under CI, where it fails.
	if err := probePostgres(); err != nil {
		msg := "riverjob: PostgreSQL is not reachable at " + testdb.PostgresURL() + " (" + err.Error() + "); start it or set ONCE_TEST_DATABASE_URL"
		if os.Getenv("CI") == "true" {
			fmt.Fprintln(os.Stderr, msg)
			os.Exit(1)
		}
		fmt.Println("skipping:", msg)
		os.Exit(0)
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines leaked:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func probePostgres() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := testdb.RetryTooManyClients(ctx, func() (*pgx.Conn, error) { return pgx.Connect(ctx, testdb.PostgresURL()) })
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.Ping(ctx)
}

// quiet discards River's and once's logs: a job that errors on purpose
// would otherwise print a stack of warnings.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// chargeArgs is a job that charges an order: the intent's payload is the
// whole args, so a re-drive that changed them would be refused.
type chargeArgs struct {
	OrderID string `json:"order_id"`
	Amount  int    `json:"amount"`
	riverjob.Redriven
}

func (chargeArgs) Kind() string { return "charge" }

func chargeIntent(job *river.Job[chargeArgs]) once.Intent {
	return once.Intent{Run: job.Args.OrderID, Kind: "charge", Target: job.Args.OrderID, Payload: job.Args}
}

// env is one test's database: a schema of its own holding River's tables,
// once's and the effects', on a small pool that River and once share.
type env struct {
	pool     *pgxpool.Pool
	schema   string
	store    *postgres.Store
	inserter *river.Client[pgx.Tx]
}

func newEnv(t *testing.T) *env {
	t.Helper()
	url := testdb.RequirePostgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	// The server's max_connections is shared with every package under
	// test: River's listener, its producer and completer, and once's
	// claims and heartbeats fit in five.
	cfg.MaxConns = 5
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := testdb.RetryTooManyClients(ctx, func() (struct{}, error) { return struct{}{}, pool.Ping(ctx) }); err != nil {
		t.Fatal(err)
	}
	var b [6]byte
	rand.Read(b[:])
	e := &env{pool: pool, schema: "riverjob_test_" + hex.EncodeToString(b[:])}
	quoted := pgx.Identifier{e.schema}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+quoted); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+quoted+` CASCADE`); err != nil {
			t.Errorf("dropping schema %s: %v", e.schema, err)
		}
	})
	if err := migrateRiver(ctx, pool, e.schema); err != nil {
		t.Fatal(err)
	}
	if e.store, err = postgres.New(pool, postgres.Config{Schema: e.schema}); err != nil {
		t.Fatal(err)
	}
	if err := e.store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+e.table("effects")+` (
		id bigserial PRIMARY KEY, order_id text NOT NULL, provider_key text NOT NULL, attempt int NOT NULL, pid int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	// An insert-only client: what a once.KindPolicy.Redrive hook needs,
	// made before the once client that the workers need.
	if e.inserter, err = river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: e.schema, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	return e
}

func migrateRiver(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	m, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: schema, Logger: quiet})
	if err != nil {
		return err
	}
	_, err = m.Migrate(ctx, rivermigrate.DirectionUp, nil)
	return err
}

func (e *env) table(name string) string { return pgx.Identifier{e.schema, name}.Sanitize() }

func (e *env) client(t *testing.T, cfg once.Config) *once.Client {
	t.Helper()
	cfg.Store = e.store
	cfg.Logger = quiet
	c, err := once.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// quickRetry retries a failed job after 50ms instead of River's seconds.
type quickRetry struct{}

func (quickRetry) NextRetry(*rivertype.JobRow) time.Time {
	return time.Now().Add(50 * time.Millisecond)
}

// start runs a River client on the env's schema with workers, and stops it
// when the test ends. It returns the client and its job events.
func (e *env) start(t *testing.T, workers *river.Workers) (*river.Client[pgx.Tx], <-chan *river.Event) {
	t.Helper()
	rc, err := river.NewClient(riverpgxv5.New(e.pool), e.riverConfig(workers))
	if err != nil {
		t.Fatal(err)
	}
	events, unsubscribe := rc.Subscribe(river.EventKindJobCompleted, river.EventKindJobCancelled, river.EventKindJobFailed, river.EventKindJobSnoozed)
	if err := rc.Start(context.Background()); err != nil {
		unsubscribe()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := rc.Stop(ctx); err != nil {
			t.Errorf("stopping River: %v", err)
		}
		unsubscribe()
	})
	return rc, events
}

func (e *env) riverConfig(workers *river.Workers) *river.Config {
	return &river.Config{
		Schema:            e.schema,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}},
		Workers:           workers,
		FetchCooldown:     10 * time.Millisecond,
		FetchPollInterval: 50 * time.Millisecond,
		RetryPolicy:       quickRetry{},
		TestOnly:          true,
		Logger:            quiet,
	}
}

func (e *env) insert(t *testing.T, args river.JobArgs) *rivertype.JobRow {
	t.Helper()
	res, err := e.inserter.Insert(context.Background(), args, nil)
	if err != nil {
		t.Fatal(err)
	}
	return res.Job
}

// waitState polls the job until it reaches state, or fails the test.
func (e *env) waitState(t *testing.T, id int64, state rivertype.JobState) *rivertype.JobRow {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		j, err := e.inserter.JobGet(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if j.State == state {
			return j
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %d is %s after 20s (attempt %d, errors %v); want %s", id, j.State, j.Attempt, j.Errors, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitEvent waits for an event of kind about job id.
func waitEvent(t *testing.T, events <-chan *river.Event, id int64, kind river.EventKind) *river.Event {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case ev := <-events:
			if ev.Job != nil && ev.Job.ID == id && ev.Kind == kind {
				return ev
			}
		case <-timeout:
			t.Fatalf("no %s event for job %d within 20s", kind, id)
		}
	}
}

type effectRow struct {
	OrderID     string
	ProviderKey string
	Attempt     int
	PID         int
}

func (e *env) effects(t *testing.T) []effectRow {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT order_id, provider_key, attempt, pid FROM `+e.table("effects")+` ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[effectRow])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// recordEffect is the stand-in for a call to a payment provider: a row
// written outside any transaction of once's, on the shared pool.
func (e *env) recordEffect(ctx context.Context, orderID string, a once.Attempt) error {
	_, err := e.pool.Exec(ctx, `INSERT INTO `+e.table("effects")+` (order_id, provider_key, attempt, pid) VALUES ($1, $2, $3, $4)`,
		orderID, a.ProviderKey, a.Number, os.Getpid())
	return err
}

func (e *env) action(t *testing.T, c *once.Client, orderID string) once.Action {
	t.Helper()
	key, _, err := once.KeyOf(chargeIntent(&river.Job[chargeArgs]{Args: chargeArgs{OrderID: orderID, Amount: 100}}))
	if err != nil {
		t.Fatal(err)
	}
	a, err := c.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func errorsContain(j *rivertype.JobRow, sub string) bool {
	for _, e := range j.Errors {
		if strings.Contains(e.Error, sub) {
			return true
		}
	}
	return false
}

var errDeclined = errors.New("card declined")
