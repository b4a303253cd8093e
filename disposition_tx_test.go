package once_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/testdb"
)

// A Permanent error from a DoTx effect is returned as it is and nothing
// is recorded: delivering the job again would only fail again, so it
// must not be retried, and with no record in the ledger the queue's
// dead-letter is the only trace left: drop, not ack.
func TestDisposePermanentFromDoTx(t *testing.T) {
	ctx := context.Background()
	c, s := testdb.SQLiteClient(t, once.Config{})
	tx, err := s.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	in := once.Intent{Run: "job-1", Kind: "ledger_write"}
	_, err = once.DoTx(ctx, c, s, tx, in, func(ctx context.Context, tx *sql.Tx, a once.Attempt) (int, error) {
		return 0, once.Permanent(errors.New("account closed"))
	})
	if !errors.Is(err, once.ErrPermanent) {
		t.Fatalf("DoTx returned %v; want the effect's permanent error", err)
	}
	if d := once.Dispose(err); d.Action != once.JobDrop {
		t.Fatalf("Dispose(%v) = %v (%s); want drop: it would fail again on every delivery and nothing recorded it", err, d.Action, d.Reason)
	}
	// The transaction is rolled back: no record, so a later Do runs it.
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	key, _, err := once.KeyOf(in)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, key); !errors.Is(err, once.ErrNotFound) {
		t.Fatalf("after rollback Get = %v; want ErrNotFound", err)
	}
}
