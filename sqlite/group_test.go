package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/sqlite"
)

// groupStore is a new, migrated store with group commit on, and its
// file's path.
func groupStore(t *testing.T) (*sqlite.Store, string) {
	t.Helper()
	s, path := testdb.NewSQLite(t)
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s, path
}

func newClaim(key string) once.ClaimRequest {
	return once.ClaimRequest{Key: once.Key(key), Fingerprint: once.Fingerprint("fp-" + key), Kind: "send_email",
		Target: "ada@example.com", Lease: time.Minute, Token: "token-" + key}
}

// batches records the sizes of group commit's transactions.
type batches struct {
	mu    sync.Mutex
	sizes []int
}

func (b *batches) hook(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sizes = append(b.sizes, n)
}

func (b *batches) get() []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]int(nil), b.sizes...)
}

// waitQueued waits until n writes wait for the store's next transaction.
func waitQueued(t *testing.T, s *sqlite.Store, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for sqlite.QueuedWrites(s) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d writes queued, want %d", sqlite.QueuedWrites(s), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestGroupCommitWritesWhatQueuedInOneTransaction: claims that queue
// behind a write in progress are committed together, in one
// transaction, and each is answered as it would have been alone: new
// keys claimed, a duplicate given the standing row.
func TestGroupCommitWritesWhatQueuedInOneTransaction(t *testing.T) {
	ctx := context.Background()
	s, _ := groupStore(t)
	if _, err := s.Claim(ctx, newClaim("standing")); err != nil {
		t.Fatal(err)
	}
	var b batches
	sqlite.SetBeforeBatch(s, b.hook)
	release := sqlite.HoldTurn(s)
	keys := []string{"k0", "k1", "k2", "k3", "k4", "k5", "k6"}
	results := make([]once.ClaimResult, len(keys))
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Go(func() { results[i], errs[i] = s.Claim(ctx, newClaim(k)) })
	}
	waitQueued(t, s, len(keys))
	// A duplicate of a standing key is answered by its read, without a
	// turn to write: it does not queue.
	dup, err := s.Claim(ctx, newClaim("standing"))
	if err != nil || dup.Claimed || dup.Action.Status != once.StatusInFlight {
		t.Fatalf("duplicate: claimed %v, status %s, err %v; want the standing row", dup.Claimed, dup.Action.Status, err)
	}
	release()
	wg.Wait()
	for i, k := range keys {
		if errs[i] != nil || !results[i].Claimed || results[i].Action.Attempt != 1 || results[i].Action.Token != "token-"+k {
			t.Errorf("%s: claimed %v, attempt %d, token %q, err %v; want a first claim with its token", k, results[i].Claimed,
				results[i].Action.Attempt, results[i].Action.Token, errs[i])
		}
		a, err := s.Get(ctx, once.Key(k))
		if err != nil || a.Status != once.StatusInFlight {
			t.Errorf("%s: stored %s, err %v; want in flight", k, a.Status, err)
		}
	}
	if got := b.get(); len(got) != 1 || got[0] != len(keys) {
		t.Fatalf("transactions of %v writes, want one of %d", got, len(keys))
	}
}

// TestGroupCommitLoneWriteRunsAlone: a write that finds nothing in
// progress runs at once, as its own transaction: one worker's claims
// and outcomes never wait to be grouped.
func TestGroupCommitLoneWriteRunsAlone(t *testing.T) {
	ctx := context.Background()
	s, _ := groupStore(t)
	var b batches
	sqlite.SetBeforeBatch(s, b.hook)
	for i := range 20 {
		k := fmt.Sprintf("k%d", i)
		if res, err := s.Claim(ctx, newClaim(k)); err != nil || !res.Claimed {
			t.Fatalf("claim %s: %v, %v", k, res.Claimed, err)
		}
		ok, err := s.Transition(ctx, once.Transition{Key: once.Key(k), Attempt: 1, From: []once.Status{once.StatusInFlight},
			To: once.StatusSucceeded, Result: []byte(`"sent"`)})
		if err != nil || !ok {
			t.Fatalf("outcome %s: %v, %v", k, ok, err)
		}
	}
	if got := b.get(); len(got) != 0 {
		t.Fatalf("one writer's writes went in transactions of %v; want each alone", got)
	}
}

// TestGroupCommitRefusedWriteIsRefusedAlone: a write SQLite refuses (a
// result that is not JSON to it) does not decide the others' answers in
// its transaction: they are written, it alone is refused, and its row is
// as it was.
func TestGroupCommitRefusedWriteIsRefusedAlone(t *testing.T) {
	ctx := context.Background()
	s, _ := groupStore(t)
	for _, k := range []string{"bad", "good"} {
		if _, err := s.Claim(ctx, newClaim(k)); err != nil {
			t.Fatal(err)
		}
	}
	var b batches
	sqlite.SetBeforeBatch(s, b.hook)
	release := sqlite.HoldTurn(s)
	outcome := func(k, result string) once.Transition {
		return once.Transition{Key: once.Key(k), Attempt: 1, From: []once.Status{once.StatusInFlight}, To: once.StatusSucceeded,
			Result: []byte(result)}
	}
	var wg sync.WaitGroup
	var claimErr, badErr, goodErr error
	var goodOK, badOK bool
	wg.Go(func() { _, claimErr = s.Claim(ctx, newClaim("new")) })
	waitQueued(t, s, 1)
	wg.Go(func() { badOK, badErr = s.Transition(ctx, outcome("bad", `{not json`)) })
	waitQueued(t, s, 2)
	wg.Go(func() { goodOK, goodErr = s.Transition(ctx, outcome("good", `"sent"`)) })
	waitQueued(t, s, 3)
	release()
	wg.Wait()
	if !errors.Is(badErr, once.ErrRejected) || badOK {
		t.Errorf("refused outcome: applied %v, err %v; want ErrRejected", badOK, badErr)
	}
	if goodErr != nil || !goodOK {
		t.Errorf("outcome beside it: applied %v, err %v; want applied", goodOK, goodErr)
	}
	if claimErr != nil {
		t.Errorf("claim beside it: %v", claimErr)
	}
	for k, want := range map[string]once.Status{"bad": once.StatusInFlight, "good": once.StatusSucceeded, "new": once.StatusInFlight} {
		if a, err := s.Get(ctx, once.Key(k)); err != nil || a.Status != want {
			t.Errorf("%s: %s, %v; want %s", k, a.Status, err, want)
		}
	}
	if got := b.get(); len(got) != 1 || got[0] != 3 {
		t.Errorf("transactions of %v writes, want one of 3", got)
	}
}

// TestGroupCommitCallerGoneWhileQueuedWritesNothing: a caller whose
// context ends while its write waits for its turn is answered at once
// with its context's error, and nothing of its write is stored; the
// writes queued with it are written.
func TestGroupCommitCallerGoneWhileQueuedWritesNothing(t *testing.T) {
	ctx := context.Background()
	s, _ := groupStore(t)
	release := sqlite.HoldTurn(s)
	var wg sync.WaitGroup
	var keptErr error
	wg.Go(func() { _, keptErr = s.Claim(ctx, newClaim("kept")) })
	waitQueued(t, s, 1)
	gone, cancel := context.WithCancel(ctx)
	goneErr := make(chan error, 1)
	go func() {
		_, err := s.Claim(gone, newClaim("gone"))
		goneErr <- err
	}()
	waitQueued(t, s, 2)
	cancel()
	select {
	case err := <-goneErr:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("gone caller: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a caller whose context ended still waits for its turn")
	}
	waitQueued(t, s, 1)
	release()
	wg.Wait()
	if keptErr != nil {
		t.Fatal(keptErr)
	}
	if _, err := s.Get(ctx, "gone"); !errors.Is(err, once.ErrNotFound) {
		t.Errorf("the gone caller's claim: %v, want not stored", err)
	}
	if a, err := s.Get(ctx, "kept"); err != nil || a.Status != once.StatusInFlight {
		t.Errorf("the claim beside it: %s, %v; want in flight", a.Status, err)
	}
}

// TestGroupCommitLeaderGoneWhileAnotherProcessHoldsTheFile: the writer
// that leads a transaction waits for the file's write lock, held by
// another connection (another process, say). Its caller's context ends
// meanwhile: it is answered with its context's error and its write is
// not stored; the write queued with it is written once the lock is free,
// by the next writer.
func TestGroupCommitLeaderGoneWhileAnotherProcessHoldsTheFile(t *testing.T) {
	ctx := context.Background()
	s, path := groupStore(t)
	var b batches
	sqlite.SetBeforeBatch(s, b.hook)
	release := sqlite.HoldTurn(s)
	gone, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var goneErr, keptErr error
	wg.Go(func() { _, goneErr = s.Claim(gone, newClaim("gone")) })
	waitQueued(t, s, 1)
	wg.Go(func() { _, keptErr = s.Claim(ctx, newClaim("kept")) })
	waitQueued(t, s, 2)
	other := holdFile(t, path)
	release()
	// Whichever of the two leads now waits for the file; neither write
	// is taken before it is free.
	time.Sleep(50 * time.Millisecond)
	if n := sqlite.QueuedWrites(s); n != 2 {
		t.Fatalf("%d writes queued while the file is held, want 2", n)
	}
	cancel()
	waitQueued(t, s, 1)
	other()
	wg.Wait()
	if !errors.Is(goneErr, context.Canceled) {
		t.Errorf("gone caller: %v, want context.Canceled", goneErr)
	}
	if keptErr != nil {
		t.Errorf("the claim beside it: %v", keptErr)
	}
	if _, err := s.Get(ctx, "gone"); !errors.Is(err, once.ErrNotFound) {
		t.Errorf("the gone caller's claim: %v, want not stored", err)
	}
	if a, err := s.Get(ctx, "kept"); err != nil || a.Status != once.StatusInFlight {
		t.Errorf("the claim beside it: %s, %v; want in flight", a.Status, err)
	}
	if got := b.get(); len(got) != 1 || got[0] != 1 {
		t.Errorf("transactions of %v writes, want one of 1", got)
	}
}

// holdFile takes the write lock of the file at path on a connection of
// its own, as another process writing would, until the returned func.
func holdFile(t *testing.T, path string) (release func()) {
	t.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(context.Background(), `BEGIN IMMEDIATE`); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			conn.ExecContext(context.Background(), `ROLLBACK`)
			conn.Close()
			db.Close()
		})
	}
	t.Cleanup(release)
	return release
}

// TestGroupCommitManyWorkersOneOutcomeEach: workers claiming and
// recording at once, most of it grouped, leave every key succeeded at
// attempt 1, each effect run once, and no transaction carried more than
// the writes that waited.
func TestGroupCommitManyWorkersOneOutcomeEach(t *testing.T) {
	ctx := context.Background()
	c, s := testdb.SQLiteClient(t, once.Config{})
	var b batches
	sqlite.SetBeforeBatch(s, b.hook)
	const workers, perWorker = 16, 25
	var runs atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				// Every key is asked for by two workers.
				in := once.Intent{Run: "run", Step: int64((w/2)*perWorker + i), Kind: "send_email", Target: "ada@example.com", Payload: "hi"}
				_, err := once.Do(ctx, c, in, func(context.Context, once.Attempt) (string, error) {
					runs.Add(1)
					return "sent", nil
				})
				if err != nil && !errors.Is(err, once.ErrInFlight) {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	keys := workers / 2 * perWorker
	if n := runs.Load(); n != int64(keys) {
		t.Errorf("%d effects ran for %d keys", n, keys)
	}
	acts, err := s.List(ctx, once.Filter{Status: once.StatusSucceeded, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if len(acts) != keys {
		t.Errorf("%d actions succeeded, want %d", len(acts), keys)
	}
	grouped := 0
	for _, n := range b.get() {
		if n < 1 || n > workers {
			t.Errorf("a transaction of %d writes with %d workers", n, workers)
		}
		grouped += n
	}
	if grouped == 0 {
		t.Error("no write was grouped with 16 workers writing at once")
	}
}
