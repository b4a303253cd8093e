package postgres_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/oncehq/once"
	"github.com/oncehq/once/postgres"
)

// TestClaimInAnOlderSnapshot: inside a caller's REPEATABLE READ or
// SERIALIZABLE transaction (BindTx, DoTx), whose snapshot was taken
// while the first attempt ran, a duplicate claim made after that
// attempt succeeded must not answer with the row as the snapshot had
// it, in flight, as if it stood so now: the claim's insert meets the
// newer row and PostgreSQL refuses it as a serialization failure, which
// the caller retries, and then replays.
func TestClaimInAnOlderSnapshot(t *testing.T) {
	for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
		t.Run(string(iso), func(t *testing.T) {
			t.Run("Claim", func(t *testing.T) { claimInOlderSnapshot(t, iso) })
			t.Run("DoTx", func(t *testing.T) { doTxInOlderSnapshot(t, iso) })
		})
	}
}

func claimInOlderSnapshot(t *testing.T, iso pgx.TxIsoLevel) {
	ctx := context.Background()
	s, _ := groupStore(t, postgres.Config{})
	key := groupKey(t, 0)
	if res, err := s.Claim(ctx, claimOf(key, "first")); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	tx, err := sharedPool(t).BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1`); err != nil { // the snapshot
		t.Fatal(err)
	}
	if ok, err := s.Transition(ctx, succeed(key, "first", `{"id":"m"}`)); err != nil || !ok {
		t.Fatalf("outcome: %v, %v", ok, err)
	}
	res, err := s.BindTx(tx).Claim(ctx, claimOf(key, "dup"))
	if err == nil && res.Action.Status != once.StatusSucceeded {
		t.Errorf("a duplicate claim in an older snapshot answered status %q, claimed %v, with no error; the row has succeeded",
			res.Action.Status, res.Claimed)
	}
}

func doTxInOlderSnapshot(t *testing.T, iso pgx.TxIsoLevel) {
	s, _ := migrated(t)
	c, _ := client(t, s)
	f := startFirst(t, c, waitIntent)
	ctx := context.Background()
	tx, err := sharedPool(t).BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1`); err != nil { // the snapshot, the first attempt in flight
		t.Fatal(err)
	}
	f.finish("done")
	_, err = once.DoTx(ctx, c, s, tx, waitIntent, func(context.Context, pgx.Tx, once.Attempt) (string, error) {
		t.Error("DoTx ran the effect again")
		return "", nil
	})
	var ife *once.InFlightError
	if errors.As(err, &ife) {
		t.Errorf("DoTx answered %v for an action that has succeeded", err)
	}
}
