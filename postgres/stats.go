package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/sqlrows"
)

// Counting a large log.
//
// Stats is asked often: by the console at each page, by a metrics
// scrape every fifteen seconds. Counting every finished action reads the
// whole log, which at ten million actions takes seconds of a server core
// per call, and a scrape with a deadline then fails. So the open
// statuses (in flight, unknown, review, released), which a person acts
// on and which are few, are counted at every call, through their partial
// indexes. The finished ones (succeeded, failed) are counted at every
// call too while there are fewer than statsLiveRows of them; past that,
// a count made in the background stands in for them, made again when a
// call finds it older than statsEvery allows, and marked with when it
// was made (StatusCount.AsOf). No call waits for a count of the whole
// log but the first.

// statsLiveRows is how many finished actions a log may hold and still be
// counted whole at every call: a count of this many takes tens of
// milliseconds.
const statsLiveRows = 100_000

// statsEvery is how old a large log's count of its finished actions may
// grow before a call starts another: a minute, or fifty times as long as
// the last count took, so that counting takes at most a fiftieth of one
// connection's time.
func statsEvery(took time.Duration) time.Duration { return max(time.Minute, 50*took) }

// statsTimeout bounds a count made in the background.
const statsTimeout = 10 * time.Minute

// finishedCounts is a store's last count of its finished actions. The
// stores BindTx makes share it, but count within their transaction.
type finishedCounts struct {
	every func(took time.Duration) time.Duration
	// ctx ends when the store is closed: a count in the background stops,
	// and no other starts.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu sync.Mutex
	// large says the last count found statsLiveRows finished actions or
	// more: calls count the open ones only, and take these cells.
	large bool
	cells []once.StatusCount
	// at is when the count in cells started, and took how long it took;
	// tried is when the last count, done or failed, started.
	at, tried time.Time
	took      time.Duration
	// counting says a count runs in the background; done is closed when
	// it ends.
	counting bool
	done     chan struct{}
}

func newFinishedCounts() *finishedCounts {
	ctx, cancel := context.WithCancel(context.Background())
	return &finishedCounts{every: statsEvery, ctx: ctx, cancel: cancel}
}

// Stats implements once.Store. It counts every action while the log
// holds fewer than statsLiveRows finished ones; past that, it counts the
// open ones at each call and takes the finished ones from a count made
// now and then (see finishedCounts), whose cells say when (AsOf).
func (s *Store) Stats(ctx context.Context) ([]once.StatusCount, error) {
	if s.inTx || !s.counts.inBackground(ctx, s) {
		start := time.Now()
		all, err := query(ctx, s, sqlrows.StatusCount, s.q.stats)
		switch {
		case s.inTx:
		case err == nil:
			s.counts.record(all, start, time.Since(start))
		case ctx.Err() != nil:
			// The caller could not wait for a count of the whole log
			// (one that grew since it was last counted, or that the
			// statistics do not describe yet): the next call counts it
			// in the background, and no call need wait for it again.
			s.counts.countLater()
		}
		return all, err
	}
	// The finished actions first: a count due starts before the open
	// statuses' query, whatever becomes of that.
	finished, err := s.counts.finished(ctx, s)
	if err != nil {
		return nil, s.wrap(err)
	}
	open, err := query(ctx, s, sqlrows.StatusCount, s.q.openStats)
	if err != nil {
		return nil, err
	}
	all := append(open, finished...)
	slices.SortFunc(all, func(x, y once.StatusCount) int {
		return cmp.Or(cmp.Compare(x.Kind, y.Kind), cmp.Compare(x.Status, y.Status),
			cmp.Compare(sqlrows.RecoveryText(x.Recovery), sqlrows.RecoveryText(y.Recovery)))
	})
	return all, nil
}

// inBackground reports whether the finished actions are counted in the
// background: the last count found the log large, or, before the first,
// PostgreSQL's estimate of the log's rows says it is. A first count of a
// log too large to count within a caller's deadline then goes on after
// the caller gives up, and a later call has it.
func (c *finishedCounts) inBackground(ctx context.Context, s *Store) bool {
	c.mu.Lock()
	large, counted := c.large, !c.at.IsZero()
	c.mu.Unlock()
	if large || counted {
		return large
	}
	var rows float64
	if err := s.db.QueryRow(ctx, s.q.estimate).Scan(&rows); err != nil {
		return false
	}
	return rows >= statsLiveRows
}

// record keeps the finished cells of cells, a count that started at
// start and took took, unless a count that started later is kept.
func (c *finishedCounts) record(cells []once.StatusCount, start time.Time, took time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if start.Before(c.at) {
		return
	}
	var n int64
	c.cells = c.cells[:0]
	for _, cell := range cells {
		if cell.Status == once.StatusSucceeded || cell.Status == once.StatusFailed {
			cell.AsOf = start
			c.cells = append(c.cells, cell)
			n += cell.Count
		}
	}
	c.large, c.at, c.took = n >= statsLiveRows, start, took
	if start.After(c.tried) {
		c.tried = start
	}
}

// finished returns the last count's cells, and starts another count in
// the background when it is due and none is running. Before the first
// count is made, it waits for it as long as ctx allows; the count goes
// on when ctx ends.
func (c *finishedCounts) finished(ctx context.Context, s *Store) ([]once.StatusCount, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.counting && c.ctx.Err() == nil && (c.at.IsZero() || time.Since(c.tried) >= c.every(c.took)) {
		c.counting, c.tried, c.done = true, time.Now(), make(chan struct{})
		c.wg.Add(1)
		go c.count(s, c.tried, c.done)
	}
	if c.at.IsZero() {
		if !c.counting {
			// None could start: the store is closed.
			return nil, errors.New("the store is closed, and its log, large, was never counted")
		}
		done := c.done
		c.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			c.mu.Lock()
			return nil, fmt.Errorf("the log is large, and its first count of finished actions, still running, goes on without this call (%w); ask again", ctx.Err())
		}
		c.mu.Lock()
		if c.at.IsZero() {
			return nil, errors.New("the log is large, and its first count of finished actions failed (see the log); ask again")
		}
	}
	return slices.Clone(c.cells), nil
}

// count counts the finished actions, for record, and closes done. A
// count that fails leaves the last one standing, and the next is tried
// when it is due.
func (c *finishedCounts) count(s *Store, start time.Time, done chan struct{}) {
	defer c.wg.Done()
	defer close(done)
	ctx, cancel := context.WithTimeout(c.ctx, statsTimeout)
	defer cancel()
	cells, err := query(ctx, s, sqlrows.StatusCount, s.q.finishedStats)
	took := time.Since(start)
	if err == nil {
		c.record(cells, start, took)
	} else if c.ctx.Err() == nil {
		if at := c.asOf(); at.IsZero() {
			s.log.Warn("once: counting the finished actions failed; Stats has no count of them yet, and tries again at its next call", "err", err)
		} else {
			s.log.Warn("once: counting the finished actions failed; Stats keeps the count from before", "as_of", at, "err", err)
		}
	}
	c.mu.Lock()
	c.counting = false
	c.mu.Unlock()
}

func (c *finishedCounts) asOf() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.at
}

// countLater makes the next call count the finished actions in the
// background, at once.
func (c *finishedCounts) countLater() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.large, c.tried = true, time.Time{}
}

// close stops a count in the background and waits for it. No count
// starts after it returns: one starts only under mu, before ctx ends.
func (c *finishedCounts) close() {
	c.mu.Lock()
	c.cancel()
	c.mu.Unlock()
	c.wg.Wait()
}
