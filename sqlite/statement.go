package sqlite

import (
	"context"
	"database/sql"
	"sync"
	"time"
)

// stmtID names one of the store's statements.
type stmtID int

const (
	stClaim stmtID = iota
	stReclaim
	stSelectRow
	stHeartbeat
	stTransition
	stOutcome
	stBackfill
	stEvent
	stGet
	stState
	stEventsRow
	stEvents
	stTrailInfo
	stEventsAfter
	stEventsBefore
	stRecent
	stRecoverable
	stRecoverKey
	stStats
	stOpenStats
	stFinishedStats
	stEstimate
	stPurgeDue
	stPurgeOlder
	stPurgeEvents
	stCountDue
	stCountOlder
	stNow
	nStmt
)

// statements prepares the store's statements once and keeps them, so
// that a claim or an outcome runs a program SQLite already compiled:
// parsing and planning the claim's text costs more than running it. A
// statement is prepared on a connection the first time it runs there
// (database/sql keeps one per connection), and the driver resets it
// between runs instead of finalizing it.
//
// All are prepared together, on a connection of the pool, the first time
// one is needed outside a transaction: a store bound to a transaction,
// its caller's or its own, holds a connection, and with a pool of one
// preparing on another would wait for ever. Until then, and if preparing
// fails (the schema is not migrated yet), statements run from their text,
// and preparing is tried again a second later, or after a migration.
// SQLite prepares a statement again by itself when the schema changes
// under it.
type statements struct {
	db   *sql.DB
	text [nStmt]string

	mu     sync.Mutex
	ready  bool
	closed bool
	failed time.Time // when preparing last failed
	stmts  [nStmt]*sql.Stmt
}

// prepareRetry is how long statements run from their text after
// preparing them failed, before it is tried again.
const prepareRetry = time.Second

func newStatements(db *sql.DB, text [nStmt]string) *statements {
	return &statements{db: db, text: text}
}

// get returns the prepared statement id, preparing them all first when
// prepare is set and they are not yet; nil when they are not prepared.
func (c *statements) get(ctx context.Context, id stmtID, prepare bool) *sql.Stmt {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.ready && prepare && !c.closed && time.Since(c.failed) >= prepareRetry {
		c.prepare(ctx)
	}
	return c.stmts[id]
}

// prepare prepares every statement, or none.
func (c *statements) prepare(ctx context.Context) {
	var stmts [nStmt]*sql.Stmt
	for i, text := range c.text {
		st, err := c.db.PrepareContext(ctx, text)
		if err != nil {
			for _, st := range stmts[:i] {
				st.Close()
			}
			c.failed = time.Now()
			return
		}
		stmts[i] = st
	}
	c.stmts, c.ready = stmts, true
}

// migrated lets the next call prepare the statements at once: the
// schema they failed on may have changed.
func (c *statements) migrated() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failed = time.Time{}
}

// close closes the statements; later calls run from the text.
func (c *statements) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, st := range c.stmts {
		if st != nil {
			st.Close()
		}
		c.stmts[i] = nil
	}
	c.ready, c.closed = false, true
}

// stmt returns the prepared statement id for this store's connection or
// transaction, nil when it must run from its text.
func (s *Store) stmt(ctx context.Context, id stmtID) *sql.Stmt {
	switch {
	case s.ownTx != nil:
		if st := s.stmts.get(ctx, id, false); st != nil {
			return s.ownTx.StmtContext(ctx, st)
		}
	case !s.inTx:
		return s.stmts.get(ctx, id, true)
	}
	return nil
}

// query runs statement id with args on the store's database or
// transaction.
func (s *Store) query(ctx context.Context, id stmtID, args ...any) (*sql.Rows, error) {
	if st := s.stmt(ctx, id); st != nil {
		return st.QueryContext(ctx, args...)
	}
	return s.db.QueryContext(ctx, s.stmts.text[id], args...)
}

// exec runs statement id with args on the store's database or
// transaction.
func (s *Store) exec(ctx context.Context, id stmtID, args ...any) (sql.Result, error) {
	if st := s.stmt(ctx, id); st != nil {
		return st.ExecContext(ctx, args...)
	}
	return s.db.ExecContext(ctx, s.stmts.text[id], args...)
}

// execOnly is exec for a statement whose result tells nothing.
func (s *Store) execOnly(ctx context.Context, id stmtID, args ...any) error {
	_, err := s.exec(ctx, id, args...)
	return err
}

// queryRow runs statement id and scans its only row with scan, reading
// on to the statement's end: a write's commit, outside a transaction,
// happens there, and its error is the statement's. It returns
// sql.ErrNoRows when there is no row.
func (s *Store) queryRow(ctx context.Context, id stmtID, scan func(*sql.Rows) error, args ...any) error {
	rows, err := s.query(ctx, id, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	found := false
	for rows.Next() {
		if !found {
			if err := scan(rows); err != nil {
				return err
			}
			found = true
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if err := rows.Close(); err != nil {
		return err
	}
	if !found {
		return sql.ErrNoRows
	}
	return nil
}
