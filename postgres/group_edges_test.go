package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/postgres"
)

// release moves key's first attempt from in_flight to released.
func release(key once.Key) once.Transition {
	return once.Transition{Key: key, Attempt: 1, From: []once.Status{once.StatusInFlight}, To: once.StatusReleased,
		Error: "retry later", Token: "released",
		Event: once.Event{Type: once.EventReleased, From: once.StatusInFlight, Actor: once.ActorWorker}}
}

// TestGroupCommitClaimManyReleasedInOrder: two claims of one released key
// in one ClaimMany are answered as if made one after the other: the
// first claims it again, the second finds the first's claim. The batch
// answers both with the released row, and each is then claimed again on
// its own; done side by side, either may win.
func TestGroupCommitClaimManyReleasedInOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := groupStore(t, postgres.Config{})
	const n = 16
	var reqs []once.ClaimRequest
	for i := range n {
		k := groupKey(t, i)
		if _, err := s.Claim(ctx, claimOf(k, "old")); err != nil {
			t.Fatal(err)
		}
		if ok, err := s.Transition(ctx, release(k)); err != nil || !ok {
			t.Fatalf("release: %v, %v", ok, err)
		}
		reqs = append(reqs, claimOf(k, fmt.Sprint("first-", i)), claimOf(k, fmt.Sprint("second-", i)))
	}
	res, errs := s.ClaimMany(ctx, reqs)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		first, second := res[2*i], res[2*i+1]
		if !first.Claimed || first.Action.Token != fmt.Sprint("first-", i) {
			t.Errorf("key %d: the first claim got %v with token %q; want it claimed again by the first", i, first.Claimed, first.Action.Token)
		}
		if second.Claimed {
			t.Errorf("key %d: the second claim won over the first made before it", i)
		}
	}
}

// TestGroupCommitTransitionManySentAloneInOrder: a batch refused for
// one request's data is sent again request by request; two transitions
// of one key in it still apply in the order given (a move to review,
// then a person's decision on it), not side by side.
func TestGroupCommitTransitionManySentAloneInOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := groupStore(t, postgres.Config{})
	const n = 16
	reqs := make([]once.ClaimRequest, n+1)
	for i := range reqs {
		reqs[i] = claimOf(groupKey(t, i), fmt.Sprint("tok-", i))
	}
	if _, errs := s.ClaimMany(ctx, reqs); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...))
	}
	var ts []once.Transition
	for i := range n {
		k := reqs[i].Key
		ts = append(ts,
			once.Transition{Key: k, Attempt: 1, From: []once.Status{once.StatusInFlight}, To: once.StatusReview, Error: "unknown",
				Token: fmt.Sprint("review-", i), Event: once.Event{Type: once.EventReview, From: once.StatusInFlight, Actor: once.ActorWorker}},
			once.Transition{Key: k, Attempt: 1, From: []once.Status{once.StatusReview}, To: once.StatusSucceeded, Result: []byte(`"sent"`),
				ResolvedBy: "ops", ResolveNote: "it went out", Token: fmt.Sprint("resolved-", i),
				Event: once.Event{Type: once.EventResolved, From: once.StatusReview, Actor: "ops"}})
	}
	// Not JSON: PostgreSQL refuses the batch, and it is sent alone.
	ts = append(ts, succeed(reqs[n].Key, "bad", `{"id":`))
	ok, errs := s.TransitionMany(ctx, ts)
	for i := range n {
		if errs[2*i] != nil || errs[2*i+1] != nil || !ok[2*i] || !ok[2*i+1] {
			t.Errorf("key %d: the move to review %v, %v, then the decision %v, %v; want both applied, in order",
				i, ok[2*i], errs[2*i], ok[2*i+1], errs[2*i+1])
		}
	}
	if errs[2*n] == nil {
		t.Errorf("the outcome that is not JSON was recorded")
	}
}

// TestGroupCommitAloneLeavesConnections: requests of one ClaimMany sent
// again alone, which wait on locks another transaction holds, do not
// take every connection of the pool: a heartbeat still gets one.
func TestGroupCommitAloneLeavesConnections(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, schema := groupStore(t, postgres.Config{})
	const conns = 4
	s, err := postgres.Open(ctx, testdb.RequirePostgres(t)+poolParam(conns), postgres.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	live := groupKey(t, 100)
	if res, err := s.Claim(ctx, claimOf(live, "live")); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	// Another transaction claims conns keys and holds them.
	tx, err := sharedPool(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var reqs []once.ClaimRequest
	for i := range conns {
		k := groupKey(t, i)
		if _, err := s.BindTx(tx).Claim(ctx, claimOf(k, "tx")); err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, claimOf(k, fmt.Sprint("many-", i)))
	}
	reqs = append(reqs, claimOf(groupKey(t, conns), "free"))
	mctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.ClaimMany(mctx, reqs)
	}()
	// The batch waits past its lock timeout, and its claims are sent
	// alone; those of the held keys wait on the locks.
	if err := waitLocked(ctx, sharedPool(t), schema, 2); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // let every claim sent alone take what it will
	hctx, hcancel := context.WithTimeout(ctx, 2*time.Second)
	_, held, err := s.Heartbeat(hctx, live, 1, time.Minute)
	hcancel()
	if err != nil || !held {
		t.Errorf("a heartbeat while the claims wait: %v, %v; want the lease kept", held, err)
	}
	tx.Rollback(ctx)
	<-done
}

// poolParam is a URL parameter sizing a pool.
func poolParam(n int) string { return fmt.Sprintf("&pool_max_conns=%d", n) }

// waitLocked waits until at least n sessions wait on a lock on the
// schema's action table's rows (a transaction's id).
func waitLocked(ctx context.Context, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, schema string, n int) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var got int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%'||$1||'%'`, schema).Scan(&got)
		if err != nil {
			return err
		}
		if got >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d sessions wait on a lock, want %d", got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestGroupCommitHungBatchHoldsNoOne: a batch whose connection hangs
// (black-holed, not refused), sent for a caller that set no deadline,
// does not stop the store's other callers: a claim made after, with a
// deadline, on a connection that works, is sent and answered.
func TestGroupCommitHungBatchHoldsNoOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, schema := groupStore(t, postgres.Config{})
	s, proxy := proxiedStoreWith(t, postgres.Config{Schema: schema, BatchesInFlight: 1})
	hung := proxy.HangAfter([]byte("WITH ORDINALITY AS b(key, fingerprint"), nil)
	go s.ClaimMany(ctx, []once.ClaimRequest{claimOf(groupKey(t, 0), "a"), claimOf(groupKey(t, 1), "b")})
	select {
	case <-hung:
	case <-time.After(30 * time.Second):
		t.Fatal("the batch was not sent")
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	res, err := s.Claim(cctx, claimOf(groupKey(t, 99), "later"))
	if err != nil || !res.Claimed {
		t.Errorf("a claim with a deadline, after a batch hung for a caller with none: %v, %v (%d requests wait for a runner); want it claimed",
			res.Claimed, err, postgres.Queued(s))
	}
}

// TestGroupCommitNotifiesWaiters: outcomes written in one batch wake
// the waiters of each of their rows, as outcomes written one by one do;
// the store's poll is an hour, so only a notification wakes them.
func TestGroupCommitNotifiesWaiters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, schema := migrated(t)
	listening(t, s)
	const n = 6
	reqs := make([]once.ClaimRequest, n)
	for i := range reqs {
		reqs[i] = claimOf(groupKey(t, i), fmt.Sprint("tok-", i))
	}
	if _, errs := s.ClaimMany(ctx, reqs); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...))
	}
	woken := make(chan error, n)
	for i := range n {
		go func() {
			woken <- s.Wait(ctx, once.WaitRequest{Key: reqs[i].Key, Status: once.StatusInFlight, Attempt: 1, Until: time.Now().Add(time.Hour)})
		}()
	}
	eventually(t, "every waiter marking its row", func() bool {
		for i := range n {
			if !marked(t, schema, reqs[i].Key) {
				return false
			}
		}
		return true
	})
	ts := make([]once.Transition, n)
	for i := range ts {
		ts[i] = succeed(reqs[i].Key, fmt.Sprint("done-", i), `{"id":1}`)
	}
	if ok, errs := s.TransitionMany(ctx, ts); errors.Join(errs...) != nil || slices.Contains(ok, false) {
		t.Fatalf("outcomes: %v, %v", ok, errors.Join(errs...))
	}
	for range n {
		select {
		case err := <-woken:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a waiter was not woken by its row's outcome, written in a batch")
		}
	}
}

// TestGroupCommitLockTimeoutStaysInTheBatch: the lock timeout a batch
// sets ends with its transaction, in each way statements are sent: a
// statement run after it on the same connection (a claim sent alone, a
// caller's DoTx) waits on locks as long as the server's setting says.
func TestGroupCommitLockTimeoutStaysInTheBatch(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"cache_statement", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			_, schema := groupStore(t, postgres.Config{})
			s, err := postgres.Open(ctx, testdb.RequirePostgres(t)+"&default_query_exec_mode="+mode+poolParam(2), postgres.Config{Schema: schema})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			reqs := []once.ClaimRequest{claimOf(groupKey(t, 0), "a"), claimOf(groupKey(t, 1), "b"), claimOf(groupKey(t, 2), "c")}
			if _, errs := s.ClaimMany(ctx, reqs); errors.Join(errs...) != nil {
				t.Fatal(errors.Join(errs...))
			}
			var conns []*pgxpool.Conn
			for range 2 {
				c, err := s.Pool().Acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				conns = append(conns, c)
			}
			for _, c := range conns {
				var lt string
				if err := c.QueryRow(ctx, `SHOW lock_timeout`).Scan(&lt); err != nil {
					t.Fatal(err)
				}
				if lt != "0" {
					t.Errorf("a connection's lock_timeout after a batch is %s, want the server's, 0", lt)
				}
				c.Release()
			}
			// And within the batch it applies: a batch behind a held
			// row gives up, and the other outcome is written alone.
			tx, err := sharedPool(t).Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, `SELECT 1 FROM `+pgx.Identifier{schema, "once_action"}.Sanitize()+` WHERE key = $1 FOR UPDATE`, string(reqs[1].Key)); err != nil {
				t.Fatal(err)
			}
			tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			ok, errs := s.TransitionMany(tctx, []once.Transition{succeed(reqs[0].Key, "done-0", `1`), succeed(reqs[1].Key, "done-1", `1`)})
			if errs[0] != nil || !ok[0] {
				t.Errorf("the outcome of a free row, batched with one of a held row: %v, %v; want it written", ok[0], errs[0])
			}
		})
	}
}

// TestGroupCommitManyKeepsOneKeysOrderAcrossBatches: two requests for
// one key, given in order to ClaimMany or TransitionMany, are answered
// in that order also when Config.MaxBatch puts them in two batches,
// which runners would otherwise send at the same time, and when the
// first's batch rolled back and its requests are sent again one at a
// time: the first claim wins and the second finds it; an outcome that
// only applies after the first applies.
func TestGroupCommitManyKeepsOneKeysOrderAcrossBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := groupStore(t, postgres.Config{MaxBatch: 4})
	const n, at = 40, 3 // requests at and at+1 fall in two batches of 4
	for round := range 8 {
		reqs := make([]once.ClaimRequest, n)
		for i := range reqs {
			reqs[i] = claimOf(groupKey(t, round*n+i), "first")
		}
		if round%2 == 1 {
			// The first batch rolls back, and is sent again alone.
			reqs[0].Target = "nul\x00byte"
		}
		reqs[at+1] = claimOf(reqs[at].Key, "second")
		res, errs := s.ClaimMany(ctx, reqs)
		if errs[at] != nil || errs[at+1] != nil || !res[at].Claimed || res[at+1].Claimed || res[at+1].Action.Token != "first" {
			t.Fatalf("round %d: two claims of one key, in order: the first claimed %v (%v), the second %v (%v), the row's token %q; want the first to win",
				round, res[at].Claimed, errs[at], res[at+1].Claimed, errs[at+1], res[at+1].Action.Token)
		}
		ts := make([]once.Transition, n)
		for i := range ts {
			ts[i] = once.Transition{Key: reqs[i].Key, Attempt: 1, From: []once.Status{once.StatusInFlight}, To: once.StatusUnknown, Lease: time.Minute,
				Event: once.Event{Type: once.EventUnknown, From: once.StatusInFlight, Actor: once.ActorWorker}}
		}
		ts[at+1] = once.Transition{Key: reqs[at].Key, Attempt: 1, From: []once.Status{once.StatusUnknown}, To: once.StatusSucceeded,
			Result: []byte(`"ok"`), Event: once.Event{Type: once.EventSucceeded, From: once.StatusUnknown, Actor: once.ActorWorker}}
		ok, terrs := s.TransitionMany(ctx, ts)
		if terrs[at] != nil || terrs[at+1] != nil || !ok[at] || !ok[at+1] {
			a, _ := s.Get(ctx, reqs[at].Key)
			t.Fatalf("round %d: two transitions of one key, in order, each applying after the one before: applied %v (%v) and %v (%v); the row is %s",
				round, ok[at], terrs[at], ok[at+1], terrs[at+1], a.Status)
		}
	}
}

// TestGroupCommitTransitionManyKeepsTheOutcomeBeforeADecision: the first
// attempt's success and a person's decision on it, in one
// TransitionMany, both apply, and the trail keeps the success, as when
// the two are made one after the other: the success is written out
// before the decision changes the row (keepOutcome) only once it
// applied.
func TestGroupCommitTransitionManyKeepsTheOutcomeBeforeADecision(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := groupStore(t, postgres.Config{})
	c, err := once.New(once.Config{Store: s})
	if err != nil {
		t.Fatal(err)
	}
	reqs := []once.ClaimRequest{claimOf(groupKey(t, 0), "tok"), claimOf(groupKey(t, 1), "tok"), claimOf(groupKey(t, 2), "tok")}
	if _, errs := s.ClaimMany(ctx, reqs); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...))
	}
	k := reqs[1].Key
	decide := once.Transition{Key: k, Attempt: 1, From: []once.Status{once.StatusSucceeded, once.StatusFailed}, To: once.StatusFailed,
		Error: "a person says no", ResolvedBy: "ada", ResolveNote: "no",
		Event: once.Event{Type: once.EventResolved, From: once.StatusSucceeded, Actor: "ada", Note: "no"}}
	ok, errs := s.TransitionMany(ctx, []once.Transition{succeed(reqs[0].Key, "tok", `"r0"`), succeed(k, "tok", `"r1"`), succeed(reqs[2].Key, "tok", `"r2"`), decide})
	evs, err := c.Events(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	var trail []string
	kept := false
	for _, e := range evs {
		trail = append(trail, fmt.Sprintf("%s#%d %s->%s by %s", e.Type, e.Attempt, e.From, e.To, e.Actor))
		kept = kept || (e.Type == once.EventSucceeded && e.Attempt == 1)
	}
	if !ok[1] || !ok[3] || errors.Join(errs...) != nil || !kept {
		t.Errorf("the success applied %v, the decision %v (%v); the trail %v; want both applied and the success kept", ok[1], ok[3], errors.Join(errs...), trail)
	}
}
