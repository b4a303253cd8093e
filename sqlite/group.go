package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"runtime"
	"slices"
	"sync"
)

// Group commit.
//
// With synchronous=FULL every commit waits for the disk, and SQLite
// commits one writer at a time: workers that each claim and record on
// their own get, together, what one commit a time allows. A store
// (unless Config.Unbatched) therefore lets the one-statement writes of a
// Do (a new key's claim, a worker's outcome, a heartbeat) that queue up
// behind a write in progress go together: the next writer takes them
// all, runs them one after another in one transaction, in the order
// they came, and commits once. A write that finds none in progress and
// none waiting runs at once, alone, as its own transaction, exactly as
// with Config.Unbatched: one worker waits for nothing more.
//
// Each write's answer is what it would have had alone: its statement is
// the same, it reads what the writes before it in the transaction wrote
// as it would have read them committed, and it commits with them or not
// at all. What one write does cannot decide another's answer: a
// statement that fails (a result SQLite refuses, say) rolls the whole
// transaction back, and each caller then writes its own again, alone,
// under its own context, as without group commit, so that only the one
// at fault is refused. A transaction that cannot have the file's write
// lock (another process holds it past the busy timeout) answers only
// the writer that began it; the others wait on, and try for the lock
// themselves. A commit that fails fails every write in it, which is
// what each would have met committing alone.
//
// A writer whose context ends while it waits for its turn, or for the
// write lock, leaves the queue and has written nothing. A transaction
// takes its writes only once it holds the write lock, and no more than
// about what one large write alone writes (maxGroupBytes): a writer
// whose write was taken waits for the transaction's end and has its
// answer, so that no write of this store is left in doubt.

// maxGroup caps the writes one transaction carries, and maxGroupBytes
// the bytes of payload and result they write together: a writer whose
// write was taken waits for the whole transaction, its commit included,
// so a transaction writes no more than about what one large write
// alone would. A write larger than that has a transaction of its own.
// The rest wait for the next transaction.
const (
	maxGroup      = 128
	maxGroupBytes = 1 << 20
)

// groupWrite is one write waiting for its turn, or riding in another's
// transaction.
type groupWrite struct {
	// fn runs the write's statement on w, the store or the transaction.
	fn func(ctx context.Context, w *Store) error
	// size is the bytes of payload or result it writes.
	size int
	// taken is set, under group.mu, when a transaction took the write.
	taken bool
	// err is the write's answer, set before done is closed; alone, set
	// instead, says its transaction rolled back for another write's
	// sake, and it is to be written again alone.
	err   error
	alone bool
	done  chan struct{}
}

// group holds a store's writes waiting for their turn. The stores
// BindTx makes share it but never use it: in a caller's transaction
// every statement runs in that transaction.
type group struct {
	mu    sync.Mutex
	queue []*groupWrite

	// beforeBatch, when set (by tests), runs with the number of writes
	// a transaction took, after it began and before it runs them.
	beforeBatch func(n int)
}

// grouped runs fn, a write of one statement whose error sql.ErrNoRows
// means it changed nothing and which writes size bytes of payload or
// result, in this process's turn to write: alone when nothing else of
// this store writes or waits to, otherwise with the writes waiting, in
// one transaction (see group commit above).
func (s *Store) grouped(ctx context.Context, size int, fn func(ctx context.Context, w *Store) error) error {
	if s.inTx || s.group == nil {
		return s.write(ctx, func() error { return fn(ctx, s) })
	}
	// Prepared before a transaction holds a connection: see statements.
	s.stmts.get(ctx, stNow, true)
	g := s.group
	g.mu.Lock()
	if len(g.queue) == 0 {
		select {
		case s.writer <- struct{}{}:
			g.mu.Unlock()
			defer s.release()
			return fn(ctx, s)
		default:
		}
	}
	w := &groupWrite{fn: fn, size: size, done: make(chan struct{})}
	g.queue = append(g.queue, w)
	g.mu.Unlock()
	for {
		s.waiting.Add(1)
		select {
		case <-w.done:
			s.waiting.Add(-1)
			return s.answer(ctx, w)
		case s.writer <- struct{}{}:
			s.waiting.Add(-1)
			if isDone(w) {
				// Written by the transaction before: the turn is for
				// the writes still waiting.
				s.release()
				return s.answer(ctx, w)
			}
			if err := s.lead(ctx, w); err != nil {
				return err
			}
		case <-ctx.Done():
			s.waiting.Add(-1)
			g.mu.Lock()
			if !w.taken {
				g.queue = slices.DeleteFunc(g.queue, func(q *groupWrite) bool { return q == w })
				g.mu.Unlock()
				return ctx.Err()
			}
			g.mu.Unlock()
			<-w.done
			return s.answer(ctx, w)
		}
	}
}

// answer is w's answer from its transaction; a write whose transaction
// rolled back because of another's is written now, alone, on its
// caller's context, as it would have been without group commit.
func (s *Store) answer(ctx context.Context, w *groupWrite) error {
	if w.alone {
		return s.write(ctx, func() error { return w.fn(ctx, s) })
	}
	return w.err
}

func isDone(w *groupWrite) bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

// release hands this process's turn to write to the next writer. The
// writer done yields its processor when another waits: the next writer,
// woken by the release, runs on it at once, rather than when the one
// done next blocks (it goes on to run its effect, or reads its next
// key), and the write lock, which every writer of the process waits
// for, is not left idle for that time.
func (s *Store) release() {
	<-s.writer
	if s.waiting.Load() > 0 {
		runtime.Gosched()
	}
}

// lead runs, in the turn to write its caller holds, one transaction of
// the writes waiting, from the first: the caller's own, w, among them
// unless those before it fill the transaction (maxGroup,
// maxGroupBytes). The transaction takes the writes once it holds
// SQLite's write lock: if it cannot have the lock (another process
// holds it past the busy timeout, or the caller's context ends while it
// waits), lead answers its caller with the error and leaves the others
// waiting, to try for the lock themselves. A transaction without w runs
// on, on a goroutine of its own, and lead returns at once: its caller
// waits on for its own turn, and can leave at its deadline.
func (s *Store) lead(ctx context.Context, w *groupWrite) error {
	g := s.group
	// The transaction must outlive its leader's context, whose end
	// would roll it back under the other writes in it; only the wait
	// for the lock ends with it.
	txCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, cancel)
	tx, err := s.sqlDB.BeginTx(txCtx, nil)
	if !stop() {
		if err == nil {
			tx.Rollback()
		}
		err = ctx.Err()
	}
	if err != nil {
		cancel()
		g.mu.Lock()
		g.queue = slices.DeleteFunc(g.queue, func(q *groupWrite) bool { return q == w })
		g.mu.Unlock()
		s.release()
		return err
	}
	g.mu.Lock()
	n, bytes := 1, g.queue[0].size
	for n < min(len(g.queue), maxGroup) && bytes+g.queue[n].size <= maxGroupBytes {
		bytes += g.queue[n].size
		n++
	}
	batch := g.queue[:n]
	g.queue = slices.Clone(g.queue[n:])
	for _, q := range batch {
		q.taken = true
	}
	g.mu.Unlock()
	if !slices.Contains(batch, w) {
		go s.commit(txCtx, cancel, tx, batch)
		return nil
	}
	s.commit(txCtx, cancel, tx, batch)
	return nil
}

// commit runs batch's writes in tx, answers each, and hands the turn
// to write on.
func (s *Store) commit(ctx context.Context, cancel context.CancelFunc, tx *sql.Tx, batch []*groupWrite) {
	defer s.release()
	defer cancel()
	if b := s.group.beforeBatch; b != nil {
		b(len(batch))
	}
	c := *s
	c.db, c.inTx, c.ownTx = tx, true, tx
	errs := make([]error, len(batch))
	for i, q := range batch {
		errs[i] = q.fn(ctx, &c)
		if errs[i] != nil && !errors.Is(errs[i], sql.ErrNoRows) {
			// One write's failure must not be the others' answer: none
			// is committed, and each caller writes its own again, alone
			// (answer).
			tx.Rollback()
			for _, q := range batch {
				q.alone = true
				close(q.done)
			}
			return
		}
	}
	if err := tx.Commit(); err != nil {
		answerAll(batch, err)
		return
	}
	for i, q := range batch {
		q.err = errs[i]
		close(q.done)
	}
}

// answerAll gives every write of batch err.
func answerAll(batch []*groupWrite, err error) {
	for _, q := range batch {
		q.err = err
		close(q.done)
	}
}
