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

// unstored fails t unless key has no row in s: the write of a caller
// answered with an error, what, left nothing.
func unstored(t *testing.T, s *sqlite.Store, key, what string) {
	t.Helper()
	if _, err := s.Get(context.Background(), once.Key(key)); !errors.Is(err, once.ErrNotFound) {
		t.Errorf("%s: %v, want not stored", what, err)
	}
}

// inFlight fails t unless key stands in s as a claim in flight.
func inFlight(t *testing.T, s *sqlite.Store, key, what string) {
	t.Helper()
	if a, err := s.Get(context.Background(), once.Key(key)); err != nil || a.Status != once.StatusInFlight {
		t.Errorf("%s: %s, %v; want in flight", what, a.Status, err)
	}
}

// claimWithin claims key, new, for a caller that allows it d, and sends
// the claim's error.
func claimWithin(s *sqlite.Store, key string, d time.Duration) <-chan error {
	answered := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		_, err := s.Claim(ctx, newClaim(key))
		answered <- err
	}()
	return answered
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
		inFlight(t, s, k, k)
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
	unstored(t, s, "gone", "the gone caller's claim")
	inFlight(t, s, "kept", "the claim beside it")
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
	unstored(t, s, "gone", "the gone caller's claim")
	inFlight(t, s, "kept", "the claim beside it")
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

// heldTx begins a transaction on the store's database, as a DoTx's
// caller would, once the pool has a connection for it, and holds it
// until the returned func; started is closed once it has begun.
func heldTx(t *testing.T, s *sqlite.Store) (started <-chan struct{}, end func()) {
	t.Helper()
	begun, stop := make(chan struct{}), make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		tx, err := s.DB().BeginTx(context.Background(), nil)
		if err != nil {
			t.Error(err)
			close(begun)
			return
		}
		close(begun)
		<-stop
		tx.Rollback()
	}()
	var once sync.Once
	end = func() {
		once.Do(func() { close(stop) })
		<-ended
	}
	t.Cleanup(end)
	return begun, end
}

// TestGroupCommitRewriteKeepsItsCallersDeadline: a write refused in a
// transaction sends the others back to be written alone. They were
// written by the writer that led the transaction, with no deadline, one
// after another: with a pool of one connection, which a caller's DoTx
// transaction took when the batch rolled back, a claim whose caller
// allowed it half a second waited as long as the DoTx did, and was then
// written. Each caller writes its own again, under its own context.
func TestGroupCommitRewriteKeepsItsCallersDeadline(t *testing.T) {
	ctx := context.Background()
	s, _ := groupStore(t)
	s.DB().SetMaxOpenConns(1)
	if _, err := s.Claim(ctx, newClaim("bad")); err != nil {
		t.Fatal(err)
	}
	var first sync.Once
	var endTx func()
	sqlite.SetBeforeBatch(s, func(int) {
		first.Do(func() {
			// The transaction holds the only connection: the DoTx's
			// begin waits for it, and has it when the batch rolls back.
			waits := s.DB().Stats().WaitCount
			_, endTx = heldTx(t, s)
			for s.DB().Stats().WaitCount == waits {
				time.Sleep(time.Millisecond)
			}
		})
	})
	release := sqlite.HoldTurn(s)
	var wg sync.WaitGroup
	wg.Go(func() {
		s.Transition(ctx, once.Transition{Key: "bad", Attempt: 1, From: []once.Status{once.StatusInFlight}, To: once.StatusSucceeded,
			Result: []byte(`{not json`)})
	})
	waitQueued(t, s, 1)
	claimed := claimWithin(s, "x", 500*time.Millisecond)
	waitQueued(t, s, 2)
	release()
	select {
	case err := <-claimed:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("claim = %v, want its caller's deadline", err)
		}
	case <-time.After(5 * time.Second):
		endTx()
		t.Fatalf("a claim whose caller allowed it 500ms was answered only after the DoTx holding the connection ended: %v", <-claimed)
	}
	// The refused outcome, whose caller set no deadline, waits for the
	// connection as it would have alone.
	endTx()
	wg.Wait()
	unstored(t, s, "x", "the claim answered with its deadline")
}

// TestGroupCommitRewritesDoNotQueueBehindEachOther: when a refused
// write sent the others back to be written alone, and another process
// took the file's write lock meanwhile, each waited the busy timeout
// (10 s) in turn, under the writer that led, whatever its own caller's
// deadline: the last of three outcomes allowed a second each was
// answered after twenty. Each is answered by its own deadline.
func TestGroupCommitRewritesDoNotQueueBehindEachOther(t *testing.T) {
	ctx := context.Background()
	s, path := groupStore(t)
	keys := []string{"bad", "a", "b"}
	for _, k := range keys {
		if _, err := s.Claim(ctx, newClaim(k)); err != nil {
			t.Fatal(err)
		}
	}
	// The other process tries for the lock without waiting, again and
	// again, from the moment the batch begins, and keeps it once it has
	// it, which it has, but for a rare race, when the batch rolls back.
	other := grabber(t, path)
	var first sync.Once
	sqlite.SetBeforeBatch(s, func(int) { first.Do(other) })
	release := sqlite.HoldTurn(s)
	var wg sync.WaitGroup
	for i, k := range keys {
		result := `"sent"`
		if k == "bad" {
			result = `{not json`
		}
		wg.Go(func() {
			dctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			s.Transition(dctx, once.Transition{Key: once.Key(k), Attempt: 1, From: []once.Status{once.StatusInFlight},
				To: once.StatusSucceeded, Result: []byte(result)})
		})
		waitQueued(t, s, i+1)
	}
	release()
	answered := make(chan struct{})
	go func() {
		wg.Wait()
		close(answered)
	}()
	select {
	case <-answered:
	case <-time.After(5 * time.Second):
		t.Fatal("outcomes whose callers allowed them a second each were not answered within five")
	}
}

// grabber returns a func that starts taking the write lock of the file
// at path on a connection of its own, trying without waiting until it
// has it, and holding it until the test ends.
func grabber(t *testing.T, path string) (start func()) {
	t.Helper()
	db, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(0)")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	stop, stopped := make(chan struct{}), make(chan struct{})
	var started atomic.Bool
	t.Cleanup(func() {
		close(stop)
		if started.Load() {
			<-stopped
		}
		conn.Close()
		db.Close()
	})
	return func() {
		started.Store(true)
		go func() {
			defer close(stopped)
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := conn.ExecContext(context.Background(), `BEGIN IMMEDIATE`); err == nil {
					<-stop
					conn.ExecContext(context.Background(), `ROLLBACK`)
					return
				}
			}
		}()
	}
}

// TestGroupCommitWriteQueuedBehindALockedBeginWaitsItsOwnTurn: the
// writer leading a transaction waits for the file's write lock, held by
// another process, and gives up at the busy timeout. A write that
// queued a second before that was given the leader's "database is
// locked" after waiting that second; it now tries for the lock itself,
// and is written when the other process lets go.
func TestGroupCommitWriteQueuedBehindALockedBeginWaitsItsOwnTurn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, path := groupStore(t)
	other := holdFile(t, path)
	release := sqlite.HoldTurn(s)
	var wg sync.WaitGroup
	var leadErr error
	wg.Go(func() { _, leadErr = s.Claim(ctx, newClaim("lead")) })
	waitQueued(t, s, 1)
	release() // "lead" leads a transaction whose begin waits for the file
	time.Sleep(9 * time.Second)
	late := make(chan error, 1)
	go func() {
		_, err := s.Claim(ctx, newClaim("late"))
		late <- err
	}()
	wg.Wait() // the leader's busy timeout
	time.Sleep(300 * time.Millisecond)
	other()
	if leadErr == nil {
		t.Fatal("the leader was written while another process held the file")
	}
	if err := <-late; err != nil {
		t.Fatalf("a write that queued a second before the leader's busy timeout: %v, want it written once the file is free", err)
	}
	if a, err := s.Get(ctx, "late"); err != nil || a.Status != once.StatusInFlight {
		t.Fatalf("late: %s, %v; want in flight", a.Status, err)
	}
}

// TestGroupCommitTakesNoMoreThanALargeWriteAtOnce: a writer whose
// write was taken waits for its whole transaction. Of 128 writes that
// queued together, each of a payload of a MiB, a claim whose caller
// allowed it 50 ms was taken into one transaction with the rest and
// answered, written, after the whole of it, seconds later. A
// transaction now takes no more than about a MiB of payloads and
// results, and a write that waits behind larger ones is answered at its
// deadline, unwritten.
func TestGroupCommitTakesNoMoreThanALargeWriteAtOnce(t *testing.T) {
	ctx := context.Background()
	s, _ := groupStore(t)
	var b batches
	sqlite.SetBeforeBatch(s, b.hook)
	release := sqlite.HoldTurn(s)
	payload := make([]byte, 1<<20)
	const large = 40
	var wg sync.WaitGroup
	for i := range large {
		wg.Go(func() {
			req := newClaim(fmt.Sprintf("large%d", i))
			req.Payload = payload
			if _, err := s.Claim(ctx, req); err != nil {
				t.Error(err)
			}
		})
	}
	waitQueued(t, s, large)
	small := claimWithin(s, "small", 50*time.Millisecond)
	waitQueued(t, s, large+1)
	release()
	err := <-small
	wg.Wait()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a claim allowed 50 ms behind %d MiB of payloads: %v, want its deadline", large, err)
	}
	unstored(t, s, "small", "the claim answered with its deadline")
	for _, n := range b.get() {
		if n != 1 {
			t.Fatalf("transactions of %v writes of a MiB each, want one each", b.get())
		}
	}
}
