package storekit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/oncehq/once"
)

// LiveRows is how many finished actions a log may hold and still be
// counted whole at every call: a count of this many takes tens of
// milliseconds.
const LiveRows = 100_000

// CountEvery is how old a large log's count of its finished actions may
// grow before a call starts another: a minute, or fifty times as long as
// the last count took, so that counting takes at most a fiftieth of the
// time.
func CountEvery(took time.Duration) time.Duration { return max(time.Minute, 50*took) }

// countTimeout bounds a count made in the background.
const countTimeout = 10 * time.Minute

// StatQueries are a store's statements for Stats, each returning cells as
// once.StatusCount.
type StatQueries struct {
	// All counts every action, ordered by kind, status and recovery,
	// compared as bytes.
	All func(ctx context.Context) ([]once.StatusCount, error)
	// Open counts the open statuses through their indexes; Finished the
	// finished ones, reading the log.
	Open, Finished func(ctx context.Context) ([]once.StatusCount, error)
	// Estimate guesses the log's rows without reading it, for the first
	// call; an error is taken for a small log.
	Estimate func(ctx context.Context) (float64, error)
}

// Counts is a store's last count of its finished actions, with which
// its Stats answers on a log of any size (Counts.Stats).
//
// Stats is asked often: by the console at each page, by a metrics
// scrape every fifteen seconds. Counting every finished action reads the
// whole log, which at ten million actions takes seconds per call (of a
// server core for PostgreSQL, of the application's own for SQLite), and
// a scrape with a deadline then fails. So the open statuses (in flight,
// unknown, review, released), which a person acts on and which are few,
// are counted at every call, through their partial indexes. The finished
// ones (succeeded, failed) are counted at every call too while there are
// fewer than LiveRows of them; past that, a count made in the background
// stands in for them, made again when a call finds it older than
// CountEvery allows, and marked with when it was made
// (once.StatusCount.AsOf). No call waits for a count of the whole log
// but the first.
type Counts struct {
	q   StatQueries
	log *slog.Logger
	// Every is how old a count may grow (CountEvery), and Live how many
	// finished actions a log counted whole at every call may hold
	// (LiveRows), unless a test sets others before the first call.
	Every func(took time.Duration) time.Duration
	Live  int64
	// ctx ends with Close: a count in the background stops, and no
	// other starts.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu sync.Mutex
	// large says the last count found LiveRows finished actions or
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

// NewCounts returns the counts of a store whose statements are q; log gets a
// line when a count in the background fails (nil: slog.Default() at
// that moment).
func NewCounts(q StatQueries, log *slog.Logger) *Counts {
	ctx, cancel := context.WithCancel(context.Background())
	return &Counts{q: q, log: log, Every: CountEvery, Live: LiveRows, ctx: ctx, cancel: cancel}
}

// Stats counts every action while the log holds fewer than LiveRows
// finished ones; past that, it counts the open ones at each call and
// takes the finished ones from a count made now and then, whose cells
// say when (AsOf). Cells are ordered by kind, status and recovery,
// compared as bytes, at any size.
func (c *Counts) Stats(ctx context.Context) ([]once.StatusCount, error) {
	if !c.inBackground(ctx) {
		start := time.Now()
		all, err := c.q.All(ctx)
		switch {
		case err == nil:
			c.record(all, start, time.Since(start))
		case ctx.Err() != nil:
			// The caller could not wait for a count of the whole log
			// (one that grew since it was last counted, or that the
			// estimate does not describe yet): the next call counts it
			// in the background, and no call need wait for it again.
			c.countLater()
		}
		return all, err
	}
	// The finished actions first: a count due starts before the open
	// statuses' query, whatever becomes of that.
	finished, err := c.finished(ctx)
	if err != nil {
		return nil, err
	}
	open, err := c.q.Open(ctx)
	if err != nil {
		return nil, err
	}
	all := append(open, finished...)
	slices.SortFunc(all, func(x, y once.StatusCount) int {
		return cmp.Or(cmp.Compare(x.Kind, y.Kind), cmp.Compare(x.Status, y.Status),
			cmp.Compare(RecoveryText(x.Recovery), RecoveryText(y.Recovery)))
	})
	return all, nil
}

// inBackground reports whether the finished actions are counted in the
// background: the last count found the log large, or, before the first,
// the store's estimate of the log's rows says it is. A first count of a
// log too large to count within a caller's deadline then goes on after
// the caller gives up, and a later call has it.
func (c *Counts) inBackground(ctx context.Context) bool {
	c.mu.Lock()
	large, counted := c.large, !c.at.IsZero()
	c.mu.Unlock()
	if large || counted {
		return large
	}
	rows, err := c.q.Estimate(ctx)
	return err == nil && rows >= float64(c.Live)
}

// record keeps the finished cells of cells, a count that started at
// start and took took, unless a count that started later is kept.
func (c *Counts) record(cells []once.StatusCount, start time.Time, took time.Duration) {
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
	c.large, c.at, c.took = n >= c.Live, start, took
	if start.After(c.tried) {
		c.tried = start
	}
}

// finished returns the last count's cells, and starts another count in
// the background when it is due and none is running. Before the first
// count is made, it waits for it as long as ctx allows; the count goes
// on when ctx ends.
func (c *Counts) finished(ctx context.Context) ([]once.StatusCount, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.counting && c.ctx.Err() == nil && (c.at.IsZero() || time.Since(c.tried) >= c.Every(c.took)) {
		c.counting, c.tried, c.done = true, time.Now(), make(chan struct{})
		c.wg.Add(1)
		go c.count(c.tried, c.done)
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
func (c *Counts) count(start time.Time, done chan struct{}) {
	defer c.wg.Done()
	defer close(done)
	ctx, cancel := context.WithTimeout(c.ctx, countTimeout)
	defer cancel()
	cells, err := c.q.Finished(ctx)
	took := time.Since(start)
	if err == nil {
		c.record(cells, start, took)
	} else if c.ctx.Err() == nil {
		log := c.log
		if log == nil {
			log = slog.Default()
		}
		if at := c.asOf(); at.IsZero() {
			log.Warn("once: counting the finished actions failed; Stats has no count of them yet, and tries again at its next call", "err", err)
		} else {
			log.Warn("once: counting the finished actions failed; Stats keeps the count from before", "as_of", at, "err", err)
		}
	}
	c.mu.Lock()
	c.counting = false
	c.mu.Unlock()
}

// Counting reports whether a count runs in the background.
func (c *Counts) Counting() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counting
}

func (c *Counts) asOf() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.at
}

// countLater makes the next call count the finished actions in the
// background, at once.
func (c *Counts) countLater() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.large, c.tried = true, time.Time{}
}

// Close stops a count in the background and waits for it. No count
// starts after it returns: one starts only under mu, before ctx ends.
func (c *Counts) Close() {
	c.mu.Lock()
	c.cancel()
	c.mu.Unlock()
	c.wg.Wait()
}
