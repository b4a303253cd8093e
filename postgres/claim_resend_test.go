package postgres_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncehq/once"
	"github.com/oncehq/once/postgres"
)

// deadSecondClaim is the store with one fault: before its second Claim,
// the server ends every connection its pool holds idle
// (pg_terminate_backend, from admin), so that the claim is sent on one
// of them, dead (pgxpool pings before handing out only a connection
// idle for over a second, and these were just released): the failure
// the resend of do.go's claim was made for. The claims themselves are
// the real statements.
type deadSecondClaim struct {
	*postgres.Store
	admin  *postgres.Store
	t      *testing.T
	claims atomic.Int32
	// before, when set, runs before the first claim is sent.
	before func()
	gets   atomic.Int32
	// beforeGet, when set, runs before the nth Get is sent.
	beforeGet func(n int32)
}

func (s *deadSecondClaim) Get(ctx context.Context, key once.Key) (once.Action, error) {
	if n := s.gets.Add(1); s.beforeGet != nil {
		s.beforeGet(n)
	}
	return s.Store.Get(ctx, key)
}

func (s *deadSecondClaim) Claim(ctx context.Context, req once.ClaimRequest) (once.ClaimResult, error) {
	n := s.claims.Add(1)
	if n == 1 && s.before != nil {
		s.before()
	}
	if n == 2 {
		s.killIdle(ctx)
	}
	return s.Store.Claim(ctx, req)
}

// killIdle ends, on the server, the connections the store's pool holds
// idle, and waits until they are gone.
func (s *deadSecondClaim) killIdle(ctx context.Context) {
	var pids []uint32
	for _, c := range s.Store.Pool().AcquireAllIdle(ctx) {
		pids = append(pids, c.Conn().PgConn().PID())
		c.Release()
	}
	if len(pids) == 0 {
		s.t.Error("the pool held no idle connection to end before the second claim")
		return
	}
	if _, err := s.admin.Pool().Exec(ctx, `SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid`, pids); err != nil {
		s.t.Errorf("ending the idle connections: %v", err)
		return
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		var left int
		if err := s.admin.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1::int[])`, pids).Scan(&left); err == nil && left == 0 {
			return
		}
	}
	s.t.Error("the ended connections' backends are still there")
}

// TestResendTakesTheLateFirstClaimAsItsOwn: a Do that waits (WaitFor)
// meets a key an open DoTx holds; its first claim waits out
// ClaimTimeout on the transaction's lock, the read-back sees no row, and
// the claim, sent again, lands on a dead idle connection (storetest's
// ResendOnDeadConnectionStillWaitsForTheTransaction). Here the
// transaction rolls back while the resend fails. The store is reached
// through a fault proxy that refuses new connections while the claims
// are sent, so pgx's cancel request for the first claim, given up on at
// ClaimTimeout, is lost (as behind a proxy or pooler that drops it), and
// that claim still waits on the server for the transaction's lock. The
// transaction rolls back just before the resend's read-back, and the
// first claim commits the row in flight under its token, which the
// call's pending claims hold: the read-back meets the call's own claim,
// and Do runs the effect once. Before, the read-back compared the row's
// token with the resend's alone and returned the resend's error: the
// row stayed in flight under a token no live call held, the effect
// never ran, and when the lease ran out the kind's recovery (a person,
// by default) was asked about an effect that never started.
func TestResendTakesTheLateFirstClaimAsItsOwn(t *testing.T) {
	in := once.Intent{Run: "resend-orphan", Kind: "send_email", Target: "ada@example.com"}
	d, schema := newStoreWith(t, postgres.Config{Unbatched: true})
	if err := d.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	holder, err := once.New(once.Config{Store: d})
	if err != nil {
		t.Fatal(err)
	}
	k, _, err := once.KeyOf(in)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tx, err := d.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := once.DoTx(ctx, holder, d, tx, in, func(context.Context, pgx.Tx, once.Attempt) (string, error) {
		return "from the transaction", nil
	}); err != nil {
		t.Fatal(err)
	}
	ps, proxy := proxiedStoreWith(t, postgres.Config{Schema: schema, Unbatched: true, PollOnly: true})
	ws := &deadSecondClaim{Store: ps, admin: d, t: t, before: func() { proxy.Refuse(true) }}
	ws.beforeGet = func(n int32) {
		if n != 2 {
			return
		}
		// The resend has failed: the transaction rolls back now, and
		// the first claim, still waiting on the server, commits.
		proxy.Refuse(false)
		tx.Rollback(context.Background())
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if _, err := d.Get(context.Background(), k); err == nil {
				return
			}
		}
		t.Error("the first claim never committed after the rollback: its cancel request was not lost")
	}
	c, err := once.New(once.Config{Store: ws, ClaimTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// Fill the proxied pool, so the claim and the read-backs find
	// connections open while new ones are refused.
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ps.Pool().Exec(ctx, `SELECT pg_sleep(0.2)`)
		}()
	}
	wg.Wait()
	var ran atomic.Int32
	res, err := once.Do(ctx, c, in, func(context.Context, once.Attempt) (string, error) {
		ran.Add(1)
		return "sent", nil
	}, once.WaitFor(15*time.Second))
	a, gerr := d.Get(context.Background(), k)
	if err != nil || ran.Load() != 1 || res.Value != "sent" {
		t.Fatalf("Do whose resend failed after its first claim committed late (claims sent %d) = %+v, %v; effect ran %d times;\n"+
			"the row now: %s attempt %d (%v); want the effect run once by this call, whose claim the row is",
			ws.claims.Load(), res, err, ran.Load(), a.Status, a.Attempt, gerr)
	}
	if gerr != nil || a.Status != once.StatusSucceeded {
		t.Fatalf("after Do: row %s, %v; want succeeded", a.Status, gerr)
	}
}
