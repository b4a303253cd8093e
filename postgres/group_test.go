package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/faultproxy"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/postgres"
)

// groupStore is a migrated store in a fresh schema with cfg.
func groupStore(t *testing.T, cfg postgres.Config) (*postgres.Store, string) {
	t.Helper()
	s, schema := newStoreWith(t, cfg)
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s, schema
}

// groupKey is the key of the n-th intent of a test.
func groupKey(t *testing.T, n int) once.Key {
	t.Helper()
	k, _, err := once.KeyOf(once.Intent{Run: t.Name(), Step: int64(n), Kind: "send_email", Target: "ada@example.com"})
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func claimOf(key once.Key, token string) once.ClaimRequest {
	return once.ClaimRequest{Key: key, Fingerprint: "fp", Run: "r", Kind: "send_email", Target: "ada@example.com",
		Payload: []byte(`{"to":"ada"}`), Lease: time.Minute, Token: token, Origin: "test"}
}

func succeed(key once.Key, token, result string) once.Transition {
	return once.Transition{Key: key, Attempt: 1, From: []once.Status{once.StatusInFlight}, To: once.StatusSucceeded,
		Result: []byte(result), Token: token,
		Event: once.Event{Type: once.EventSucceeded, From: once.StatusInFlight, Actor: once.ActorWorker}}
}

// holdFirst returns a beforeBatch hook that holds the first batch
// (sent while nothing else waited) until, with it, total requests have
// been made, so the rest go in the next batch, together.
func holdFirst(t *testing.T, s **postgres.Store, total int) func(int) {
	return holdPhases(t, s, total, 1)
}

// holdPhases is holdFirst for each of phases rounds of total requests
// (the claims of total Do calls, then their outcomes): the first batch
// of each is held until the round's requests have all been made.
func holdPhases(t *testing.T, s **postgres.Store, total, phases int) func(int) {
	var mu sync.Mutex
	seen := 0
	return func(n int) {
		mu.Lock()
		start := seen%total == 0 && seen/total < phases
		seen += n
		mu.Unlock()
		if !start {
			return
		}
		deadline := time.Now().Add(30 * time.Second)
		for postgres.Queued(*s)+n < total {
			if time.Now().After(deadline) {
				t.Errorf("only %d requests were made, want %d", postgres.Queued(*s)+n, total)
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// commits counts the transactions that last wrote the schema's actions:
// rows written in one transaction share its id (xmin).
func commits(t *testing.T, schema string) int {
	t.Helper()
	var n int
	err := sharedPool(t).QueryRow(context.Background(),
		`SELECT count(DISTINCT xmin::text) FROM `+pgx.Identifier{schema, "once_action"}.Sanitize()).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestGroupCommitOneWinnerPerKey: goroutines claiming distinct keys and
// the same keys at once, batched, get one winner per key, whose token the
// row carries; two claims of one key in one batch are answered as if one
// followed the other, as are two transitions of one key.
func TestGroupCommitOneWinnerPerKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := groupStore(t, postgres.Config{})
	const keys, per = 16, 4
	type answer struct {
		token string
		res   once.ClaimResult
		err   error
	}
	answers := make([][]answer, keys)
	for k := range answers {
		answers[k] = make([]answer, per)
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for k := range keys {
		for j := range per {
			wg.Go(func() {
				<-start
				tok := fmt.Sprintf("tok-%d-%d", k, j)
				res, err := s.Claim(ctx, claimOf(groupKey(t, k), tok))
				answers[k][j] = answer{tok, res, err}
			})
		}
	}
	close(start)
	wg.Wait()
	for k := range keys {
		var winners []string
		for _, a := range answers[k] {
			if a.err != nil {
				t.Fatalf("claim of key %d: %v", k, a.err)
			}
			if a.res.Claimed {
				winners = append(winners, a.token)
			}
		}
		if len(winners) != 1 {
			t.Fatalf("key %d has %d winners (%v), want 1", k, len(winners), winners)
		}
		row, err := s.Get(ctx, groupKey(t, k))
		if err != nil || row.Token != winners[0] || row.Attempt != 1 {
			t.Fatalf("key %d: row %+v, %v; want the winner's token %s", k, row, err, winners[0])
		}
		for _, a := range answers[k] {
			if !a.res.Claimed && (a.res.Action.Token != winners[0] || a.res.Action.Status != once.StatusInFlight) {
				t.Fatalf("key %d: a loser saw %+v, want the winner's claim", k, a.res.Action)
			}
		}
	}

	// One batch: a key twice, another once.
	k1, k2 := groupKey(t, 100), groupKey(t, 101)
	res, errs := s.ClaimMany(ctx, []once.ClaimRequest{claimOf(k1, "a"), claimOf(k1, "b"), claimOf(k2, "c")})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("ClaimMany[%d]: %v", i, err)
		}
	}
	if !res[0].Claimed || res[1].Claimed || res[1].Action.Token != "a" || !res[2].Claimed {
		t.Fatalf("ClaimMany = %+v; want the first claim of each key to win, the second to find it", res)
	}
	ok, errs := s.TransitionMany(ctx, []once.Transition{succeed(k1, "s1", `1`), succeed(k1, "s2", `2`), succeed(k2, "s3", `3`)})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("TransitionMany[%d]: %v", i, err)
		}
	}
	if !ok[0] || ok[1] || !ok[2] {
		t.Fatalf("TransitionMany = %v; want the first transition of k1 to apply and fence out the second", ok)
	}
	if row, err := s.Get(ctx, k1); err != nil || string(row.Result) != "1" || row.Token != "s1" {
		t.Fatalf("k1 = %+v, %v; want the first transition's result", row, err)
	}
}

// TestGroupCommitBadRequest: a batch holding a request whose data
// PostgreSQL refuses gives that request the refusal, and every other
// its own answer, written.
func TestGroupCommitBadRequest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := groupStore(t, postgres.Config{})
	const n, bad = 6, 3
	reqs := make([]once.ClaimRequest, n)
	for i := range reqs {
		reqs[i] = claimOf(groupKey(t, i), fmt.Sprint("tok-", i))
	}
	reqs[bad].Target = "nul\x00byte" // text cannot hold a NUL
	res, errs := s.ClaimMany(ctx, reqs)
	for i := range reqs {
		switch {
		case i == bad:
			if !errors.Is(errs[i], once.ErrRejected) {
				t.Fatalf("the bad claim: %v, want ErrRejected", errs[i])
			}
			if _, err := s.Get(ctx, reqs[i].Key); !errors.Is(err, once.ErrNotFound) {
				t.Fatalf("the bad claim's row: %v, want none", err)
			}
		case errs[i] != nil || !res[i].Claimed || res[i].Action.Token != reqs[i].Token:
			t.Fatalf("claim %d beside a bad one: %+v, %v; want it claimed", i, res[i], errs[i])
		}
	}

	var ts []once.Transition
	for i := range reqs {
		if i != bad {
			ts = append(ts, succeed(reqs[i].Key, fmt.Sprint("done-", i), `{"id":1}`))
		}
	}
	ts[1].Result = []byte(`{not json`)
	ok, errs := s.TransitionMany(ctx, ts)
	for i, tr := range ts {
		row, err := s.Get(ctx, tr.Key)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case i == 1:
			if !errors.Is(errs[i], once.ErrRejected) || row.Status != once.StatusInFlight {
				t.Fatalf("the bad transition: %v, row %s; want ErrRejected and the claim untouched", errs[i], row.Status)
			}
		case errs[i] != nil || !ok[i] || row.Status != once.StatusSucceeded || row.Token != tr.Token:
			t.Fatalf("transition %d beside a bad one: %v, %v, row %+v; want it applied", i, ok[i], errs[i], row)
		}
	}
}

// TestGroupCommitCallerGivesUp: a caller whose context ends while its
// request rides in a batch stops waiting at once; the others get their
// answers, and the request is answered by the row, as a lost reply is:
// its token is there if the batch committed it.
func TestGroupCommitCallerGivesUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var s *postgres.Store
	s, _ = groupStore(t, postgres.Config{BatchesInFlight: 1})
	gone := make(chan error, 1)
	actx, cancelA := context.WithCancel(ctx)
	var batches atomic.Int32
	first := holdFirst(t, &s, 4)
	postgres.SetBeforeBatch(s, func(n int) {
		switch batches.Add(1) {
		case 1:
			first(n)
		case 2:
			// The batch of three is taken: one of its callers gives up.
			cancelA()
			if err := <-gone; !errors.Is(err, context.Canceled) {
				t.Errorf("the caller who gave up got %v, want context.Canceled", err)
			}
		}
	})
	var wg sync.WaitGroup
	wg.Go(func() {
		if _, err := s.Claim(ctx, claimOf(groupKey(t, 0), "first")); err != nil {
			t.Error(err)
		}
	})
	for batches.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	wg.Go(func() {
		_, err := s.Claim(actx, claimOf(groupKey(t, 1), "gave-up"))
		gone <- err
	})
	results := make([]once.ClaimResult, 2)
	errs := make([]error, 2)
	for i := range 2 {
		for postgres.Queued(s) < i+1 {
			time.Sleep(time.Millisecond)
		}
		wg.Go(func() { results[i], errs[i] = s.Claim(ctx, claimOf(groupKey(t, 2+i), fmt.Sprint("stays-", i))) })
	}
	wg.Wait()
	for i := range 2 {
		if errs[i] != nil || !results[i].Claimed {
			t.Fatalf("a caller that kept waiting: %+v, %v; want its claim", results[i], errs[i])
		}
	}
	row, err := s.Get(ctx, groupKey(t, 1))
	if err != nil || row.Token != "gave-up" {
		t.Fatalf("the row of the request given up on: %+v, %v; want it committed with its token", row, err)
	}
}

// TestGroupCommitLostCommit: the reply to a batch is lost after its
// COMMIT: every caller in it is told the connection failed, none is
// told its claim or outcome failed or won, and each Do reads its claim
// or outcome back by its token, and runs its effect once.
func TestGroupCommitLostCommit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, marker string }{
		{"claims", "WITH ORDINALITY AS b(key, fingerprint"},
		{"outcomes", "WITH ORDINALITY AS b(key, attempt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			_, schema := groupStore(t, postgres.Config{})
			var ps *postgres.Store
			ps, proxy := proxiedStoreWith(t, postgres.Config{Schema: schema, BatchesInFlight: 1})
			const n = 8
			postgres.SetBeforeBatch(ps, holdPhases(t, &ps, n, 2))
			cut := proxy.CutAfter([]byte(tc.marker), faultproxy.PostgresReady)
			c, err := once.New(once.Config{Store: ps})
			if err != nil {
				t.Fatal(err)
			}
			var effects [n]atomic.Int32
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					in := once.Intent{Run: t.Name(), Step: int64(i), Kind: "send_email", Target: "ada@example.com"}
					res, err := once.Do(ctx, c, in, func(context.Context, once.Attempt) (int, error) {
						effects[i].Add(1)
						return i, nil
					})
					if err != nil || res.Value != i || res.Replayed {
						t.Errorf("Do %d = %+v, %v; want its effect's value", i, res, err)
					}
				})
			}
			wg.Wait()
			select {
			case <-cut:
			default:
				t.Fatal("no batch's reply was cut: nothing was tested")
			}
			for i := range n {
				if got := effects[i].Load(); got != 1 {
					t.Errorf("effect %d ran %d times, want once", i, got)
				}
				a, err := ps.Get(ctx, groupKey(t, i))
				if err != nil || a.Status != once.StatusSucceeded {
					t.Errorf("action %d: %+v, %v; want it succeeded", i, a, err)
				}
			}
		})
	}
}

// TestGroupCommitFewerCommits: claims and outcomes that queued up behind
// a batch in flight are written by one transaction: the rows' xmin
// count the transactions.
func TestGroupCommitFewerCommits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const n = 24
	for _, c := range []struct{ unbatched, deadline bool }{{false, false}, {false, true}, {true, true}} {
		unbatched := c.unbatched
		var s *postgres.Store
		s, schema := groupStore(t, postgres.Config{BatchesInFlight: 1, Unbatched: unbatched})
		if !unbatched {
			postgres.SetBeforeBatch(s, holdFirst(t, &s, n))
		}
		// With a deadline, as Do's calls have, the first claim is sent
		// on its caller's goroutine; the rest queue behind it.
		cctx, cancel := ctx, context.CancelFunc(func() {})
		if c.deadline {
			cctx, cancel = context.WithTimeout(ctx, time.Minute)
		}
		defer cancel()
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				res, err := s.Claim(cctx, claimOf(groupKey(t, i), fmt.Sprint("tok-", i)))
				if err != nil || !res.Claimed {
					t.Errorf("claim %d: %+v, %v", i, res, err)
				}
			})
		}
		wg.Wait()
		// Batched: the first batch, and the rest together.
		got, want := commits(t, schema), 2
		if unbatched {
			want = n
		}
		if got > want || (unbatched && got != want) {
			t.Fatalf("unbatched %v, deadline %v: %d claims were written by %d transactions, want %d", unbatched, c.deadline, n, got, want)
		}
		t.Logf("unbatched %v, deadline %v: %d claims, %d commits", unbatched, c.deadline, n, got)
	}
}

// heldRow claims n keys through s, holds the held-th one's row in a
// transaction of its own (rolled back at t's end, or by the caller), and
// returns the outcomes of all n and the transaction.
func heldRow(t *testing.T, s *postgres.Store, schema string, n, held int) ([]once.Transition, pgx.Tx) {
	t.Helper()
	ctx := context.Background()
	reqs := make([]once.ClaimRequest, n)
	for i := range reqs {
		reqs[i] = claimOf(groupKey(t, i), fmt.Sprint("tok-", i))
	}
	if _, errs := s.ClaimMany(ctx, reqs); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...))
	}
	tx, err := sharedPool(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(context.Background()) })
	if _, err := tx.Exec(ctx, `SELECT 1 FROM `+pgx.Identifier{schema, "once_action"}.Sanitize()+` WHERE key = $1 FOR UPDATE`, string(reqs[held].Key)); err != nil {
		t.Fatal(err)
	}
	ts := make([]once.Transition, n)
	for i := range ts {
		ts[i] = succeed(reqs[i].Key, fmt.Sprint("done-", i), `{"id":1}`)
	}
	return ts, tx
}

// TestGroupCommitLockTimeout: a batch that waits on a row another
// transaction holds gives up after its lock timeout and sends its
// requests alone: the others are written while the row is still held,
// and the one that must wait does, then applies.
func TestGroupCommitLockTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, schema := groupStore(t, postgres.Config{})
	const n, held = 5, 2
	ts, tx := heldRow(t, s, schema, n, held)
	type answer struct {
		ok   []bool
		errs []error
	}
	done := make(chan answer, 1)
	go func() {
		ok, errs := s.TransitionMany(ctx, ts)
		done <- answer{ok, errs}
	}()
	// While the row is held, every other outcome is written.
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; i < n; {
		if i == held {
			i++
			continue
		}
		a, err := s.Get(ctx, ts[i].Key)
		if err != nil {
			t.Fatal(err)
		}
		if a.Status == once.StatusSucceeded {
			i++
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("outcome %d is not written while another batch member's row is held", i)
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case a := <-done:
		t.Fatalf("TransitionMany returned while a row it writes was held: %v %v", a.ok, a.errs)
	default:
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	a := <-done
	for i := range ts {
		if a.errs[i] != nil || !a.ok[i] {
			t.Fatalf("transition %d: %v, %v; want applied", i, a.ok[i], a.errs[i])
		}
	}
}

// TestGroupCommitStatementTimeoutSendsAlone: where the role's
// statement_timeout is shorter than a batch's lock timeout, as some
// databases set it, a batch that waits on a row another transaction
// holds is cancelled by the server (57014) before its lock timeout. Its
// requests are sent again alone, as after a lock timeout: every other
// outcome is written while the row is held, and only the one for the
// held row times out. Before, every request in the batch got the
// statement's cancellation: one held row decided the others' answers.
func TestGroupCommitStatementTimeoutSendsAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	direct, schema := groupStore(t, postgres.Config{})
	u, err := url.Parse(testdb.RequirePostgres(t))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("statement_timeout", "50")
	q.Set("pool_max_conns", "4")
	u.RawQuery = q.Encode()
	s, err := postgres.Open(ctx, u.String(), postgres.Config{Schema: schema, PollOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const n, held = 5, 2
	ts, _ := heldRow(t, direct, schema, n, held)
	ok, errs := s.TransitionMany(ctx, ts)
	for i := range ts {
		var pe *pgconn.PgError
		switch {
		case i == held && (ok[i] || !errors.As(errs[i], &pe) || pe.Code != "57014"):
			t.Errorf("transition %d, whose row is held: %v, %v; want the statement timeout", i, ok[i], errs[i])
		case i != held && (errs[i] != nil || !ok[i]):
			t.Errorf("transition %d: %v, %v; want applied while another request's row is held", i, ok[i], errs[i])
		}
	}
}

// TestGroupCommitMaxBatch: a batch carries at most Config.MaxBatch
// requests, and a negative setting is refused by name.
func TestGroupCommitMaxBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, schema := groupStore(t, postgres.Config{MaxBatch: 3})
	const n = 10
	reqs := make([]once.ClaimRequest, n)
	for i := range reqs {
		reqs[i] = claimOf(groupKey(t, i), fmt.Sprint("tok-", i))
	}
	res, errs := s.ClaimMany(ctx, reqs)
	for i := range reqs {
		if errs[i] != nil || !res[i].Claimed {
			t.Fatalf("claim %d: %+v, %v", i, res[i], errs[i])
		}
	}
	if got, least := commits(t, schema), (n+2)/3; got < least {
		t.Fatalf("%d claims in batches of at most 3 were written by %d transactions, want at least %d", n, got, least)
	}
	for _, cfg := range []postgres.Config{{MaxBatch: -1}, {BatchesInFlight: -1}} {
		_, err := postgres.New(sharedPool(t), cfg)
		if err == nil || !strings.Contains(err.Error(), "Config.") {
			t.Errorf("New(%+v) = %v, want an error naming the field", cfg, err)
		}
	}
}
