package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/oncehq/once"
	"github.com/oncehq/once/postgres"
	"github.com/oncehq/once/sqlite"
)

// orderRow is the order step's row, and its payload.
type orderRow struct {
	Run      string `json:"run"`
	Customer string `json:"customer"`
	Charge   string `json:"charge"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// database is the store of the ledger and, beside it, the application's
// orders table, which DoTx writes in the same transaction as the record.
type database struct {
	store once.Store
	name  string
	close func()
	// writeOrder inserts the order row with once.DoTx and commits.
	writeOrder func(ctx context.Context, c *once.Client, in once.Intent, o orderRow) (once.Result[int64], error)
}

func isPostgres(db string) bool {
	return strings.HasPrefix(db, "postgres://") || strings.HasPrefix(db, "postgresql://")
}

// openDatabase opens and migrates the ledger at db, and creates the
// orders table beside it.
func openDatabase(ctx context.Context, db string) (*database, error) {
	switch {
	case isPostgres(db):
		return openPostgres(ctx, db)
	case db == "":
		return nil, errors.New("--db is empty; give a SQLite file path (agent.db) or a postgres:// URL")
	case strings.Contains(db, "://") || strings.HasPrefix(db, "postgres:") || strings.HasPrefix(db, "postgresql:"):
		return nil, errors.New("--db takes a SQLite file path or a postgres://user@host:5432/db URL; this is neither")
	}
	return openSQLite(ctx, db)
}

// The orders table carries no unique constraint on the run: a second row
// for one run would be a duplicate effect, and the test counts rows to
// show DoTx never writes one, rather than letting a constraint hide it.

func openSQLite(ctx context.Context, path string) (*database, error) {
	s, err := sqlite.Open(path, sqlite.Config{})
	if err != nil {
		return nil, err
	}
	if err := s.Migrate(ctx); err != nil {
		s.Close()
		return nil, err
	}
	if _, err := s.DB().ExecContext(ctx, `CREATE TABLE IF NOT EXISTS orders (
		id INTEGER PRIMARY KEY AUTOINCREMENT,
		run_id TEXT NOT NULL, action_key TEXT NOT NULL,
		customer TEXT NOT NULL, charge TEXT NOT NULL,
		amount INTEGER NOT NULL, currency TEXT NOT NULL,
		created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)`); err != nil {
		s.Close()
		return nil, fmt.Errorf("creating the orders table in %s: %w", path, err)
	}
	return &database{
		store: s,
		name:  s.String(),
		close: func() { s.Close() },
		writeOrder: orderWriter(s,
			func(ctx context.Context) (*sql.Tx, error) { return s.DB().BeginTx(ctx, nil) },
			func(_ context.Context, tx *sql.Tx) error { return tx.Commit() },
			func(_ context.Context, tx *sql.Tx) error { return tx.Rollback() },
			func(ctx context.Context, tx *sql.Tx, key once.Key, o orderRow) (id int64, err error) {
				err = tx.QueryRowContext(ctx, `INSERT INTO orders (run_id, action_key, customer, charge, amount, currency)
					VALUES (?, ?, ?, ?, ?, ?) RETURNING id`, o.Run, string(key), o.Customer, o.Charge, o.Amount, o.Currency).Scan(&id)
				return id, err
			}),
	}, nil
}

func openPostgres(ctx context.Context, raw string) (*database, error) {
	// once_schema places once's tables (as for the once command), and
	// the orders table goes beside them.
	u, err := url.Parse(raw)
	if err != nil {
		return nil, errors.New("--db: the postgres URL does not parse; expected postgres://user@host:5432/dbname")
	}
	q := u.Query()
	schema := q.Get("once_schema")
	q.Del("once_schema")
	u.RawQuery = q.Encode()
	s, err := postgres.Open(ctx, u.String(), postgres.Config{Schema: schema})
	if err != nil {
		return nil, err
	}
	if err := s.Migrate(ctx); err != nil {
		s.Close()
		return nil, err
	}
	if schema == "" {
		schema = "public"
	}
	orders := pgx.Identifier{schema, "orders"}.Sanitize()
	if _, err := s.Pool().Exec(ctx, `CREATE TABLE IF NOT EXISTS `+orders+` (
		id bigserial PRIMARY KEY,
		run_id text NOT NULL, action_key text NOT NULL,
		customer text NOT NULL, charge text NOT NULL,
		amount bigint NOT NULL, currency text NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		s.Close()
		return nil, fmt.Errorf("creating the orders table in %s: %w", s, err)
	}
	return &database{
		store: s,
		name:  s.String(),
		close: func() { s.Close() },
		writeOrder: orderWriter(s,
			func(ctx context.Context) (pgx.Tx, error) { return s.Pool().Begin(ctx) },
			func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) },
			func(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) },
			func(ctx context.Context, tx pgx.Tx, key once.Key, o orderRow) (id int64, err error) {
				err = tx.QueryRow(ctx, `INSERT INTO `+orders+` (run_id, action_key, customer, charge, amount, currency)
					VALUES ($1, $2, $3, $4, $5, $6) RETURNING id`, o.Run, string(key), o.Customer, o.Charge, o.Amount, o.Currency).Scan(&id)
				return id, err
			}),
	}, nil
}

// orderWriter is the order step for a store whose transactions are TX: a
// transaction in which DoTx claims the step's key, inserts the row and
// records its id, then commits. A run killed before the commit leaves
// neither the row nor the record (the database rolls the transaction
// back), so the resumed run inserts it; a run killed after it finds the
// record and replays the id.
func orderWriter[TX any](store once.TxBinder[TX],
	begin func(context.Context) (TX, error),
	commit, rollback func(context.Context, TX) error,
	insert func(context.Context, TX, once.Key, orderRow) (int64, error),
) func(context.Context, *once.Client, once.Intent, orderRow) (once.Result[int64], error) {
	return func(ctx context.Context, c *once.Client, in once.Intent, o orderRow) (once.Result[int64], error) {
		tx, err := begin(ctx)
		if err != nil {
			return once.Result[int64]{}, fmt.Errorf("beginning the order's transaction: %w", err)
		}
		res, err := once.DoTx(ctx, c, store, tx, in, func(ctx context.Context, tx TX, a once.Attempt) (int64, error) {
			return insert(ctx, tx, a.Key, o)
		})
		if err != nil {
			rollback(context.WithoutCancel(ctx), tx)
			return res, err
		}
		if err := commit(ctx, tx); err != nil {
			// If the commit did not apply, neither the row nor its
			// record is in and the next try runs the step; if it applied
			// and only its reply was lost, the next try replays it.
			rollback(context.WithoutCancel(ctx), tx)
			return once.Result[int64]{}, fmt.Errorf("committing the order: %w", err)
		}
		return res, nil
	}
}
