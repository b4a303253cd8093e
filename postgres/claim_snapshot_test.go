package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/postgres"
)

// TestClaimSeesARowCommittedAfterItsSnapshot: a claim whose statement
// began while another transaction was inserting the same key does not
// see that row in its snapshot, and its insert waits, then meets the
// conflict. It must answer with that row, claimed by the other, and not
// with an error or a second claim: alone, batched alone, and in a batch
// of two.
func TestClaimSeesARowCommittedAfterItsSnapshot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, mode := range []string{"unbatched", "alone", "batch"} {
		t.Run(mode, func(t *testing.T) {
			s, schema := groupStore(t, postgres.Config{Unbatched: mode == "unbatched"})
			key, other := groupKey(t, 0), groupKey(t, 1)
			tx, err := sharedPool(t).Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if res, err := s.BindTx(tx).Claim(ctx, claimOf(key, "first")); err != nil || !res.Claimed {
				t.Fatalf("the first claim, in its transaction: %+v, %v", res, err)
			}
			type answer struct {
				res once.ClaimResult
				err error
			}
			done := make(chan answer, 1)
			go func() {
				cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				defer cancel()
				if mode != "batch" {
					res, err := s.Claim(cctx, claimOf(key, "second"))
					done <- answer{res, err}
					return
				}
				res, errs := s.ClaimMany(cctx, []once.ClaimRequest{claimOf(key, "second"), claimOf(other, "third")})
				if errs[1] != nil || !res[1].Claimed {
					errs[0] = fmt.Errorf("the other key in the batch: %+v, %v", res[1], errs[1])
				}
				done <- answer{res[0], errs[0]}
			}()
			waitForLockWait(t, schema)
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			a := <-done
			if a.err != nil || a.res.Claimed || a.res.Action.Token != "first" || a.res.Action.Status != once.StatusInFlight {
				t.Fatalf("the second claim: claimed %v, token %q, status %s, %v; want the first claim's row, not claimed",
					a.res.Claimed, a.res.Action.Token, a.res.Action.Status, a.err)
			}
		})
	}
}

// waitForLockWait waits until a statement on schema waits for a lock.
func waitForLockWait(t *testing.T, schema string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var n int
		err := sharedPool(t).QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
WHERE wait_event_type = 'Lock' AND position($1 in query) > 0`, schema).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no statement waited for the uncommitted row's lock")
		}
		time.Sleep(time.Millisecond)
	}
}
