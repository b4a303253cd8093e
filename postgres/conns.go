package postgres

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// poolDB runs each statement on a connection of its own from the pool,
// as pgxpool's own methods do, and hands back a connection that pgx
// closed under the statement without holding its place in the pool.
//
// A statement given up on a connection that hangs (its context ended,
// its reply black-holed) makes pgx close the connection in the
// background: it asks the server to cancel, then drains the socket for
// up to 15 s, and pgxpool counts the connection against MaxConns until
// then. A few hangs would so take every slot, and the read-back that
// tells a caller its committed claim is its own would find none
// (TestHungConnectionsFreeTheirPoolSlots). Such a connection is taken
// out of the pool at once instead (Hijack) and its socket closed, so
// the server ends its session; the pool may open another. At most
// MaxConns are so taken out in any two seconds (capFor), so hangs in a
// row do not open connection after connection; past that the pool
// keeps counting them, as it did.
type poolDB struct {
	pool    *pgxpool.Pool
	closing *closing
}

// closing counts the connections taken out of the pool whose clean-up
// has not ended (all), and those of them taken in the last capFor
// (n), which max caps.
type closing struct {
	mu   sync.Mutex
	cond *sync.Cond
	n    int
	all  int
	max  int
}

// capFor is how long a connection taken out of the pool counts against
// the cap. pgx's clean-up of one whose server cannot be reached (a
// partition, which drops its cancel request too) takes its 15 s; were
// it counted that long, the hangs of a second short outage would find
// the cap reached and hold the pool's slots for those 15 s after the
// network came back.
const capFor = 2 * time.Second

func newClosing(max int) *closing {
	c := &closing{max: max}
	c.cond = sync.NewCond(&c.mu)
	return c
}

// take counts one more, unless max are counted already.
func (c *closing) take() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n >= c.max {
		return false
	}
	c.n++
	c.all++
	return true
}

// follow counts pc until its clean-up ends, and against the cap for at
// most capFor.
func (c *closing) follow(pc *pgx.Conn) {
	cleaned := pc.PgConn().CleanupDone()
	t := time.NewTimer(capFor)
	select {
	case <-cleaned:
	case <-t.C:
	}
	t.Stop()
	c.mu.Lock()
	c.n--
	c.mu.Unlock()
	<-cleaned
	c.mu.Lock()
	c.all--
	c.mu.Unlock()
	c.cond.Broadcast()
}

// wait returns once every clean-up has ended.
func (c *closing) wait() {
	c.mu.Lock()
	for c.all > 0 {
		c.cond.Wait()
	}
	c.mu.Unlock()
}

func (p poolDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c, err := p.pool.Acquire(ctx)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	defer p.release(c)
	return c.Exec(ctx, sql, args...)
}

func (p poolDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c, err := p.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := c.Query(ctx, sql, args...)
	if err != nil {
		p.release(c)
		return nil, err
	}
	return &connRows{Rows: rows, c: c, p: p}, nil
}

func (p poolDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c, err := p.pool.Acquire(ctx)
	if err != nil {
		return errRow{err}
	}
	return &connRow{row: c.QueryRow(ctx, sql, args...), c: c, p: p}
}

// release returns c to the pool, or, when pgx has closed it, takes it
// out of the pool's count at once.
func (p poolDB) release(c *pgxpool.Conn) {
	if c.Conn().IsClosed() {
		// pgx closes it already (asyncClose). Closing the socket ends
		// its drain at once, and the server's session with it; Hijack
		// makes the pool forget it, within the cap.
		c.Conn().PgConn().Conn().Close()
		if p.closing.take() {
			go p.closing.follow(c.Hijack())
			return
		}
	}
	c.Release()
}

// connRow is a row whose connection goes back when it is scanned.
type connRow struct {
	row pgx.Row
	c   *pgxpool.Conn
	p   poolDB
}

func (r *connRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	r.p.release(r.c)
	return err
}

// errRow is a row that could not be asked for.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// connRows are rows whose connection goes back when they are read to
// the end or closed.
type connRows struct {
	pgx.Rows
	c    *pgxpool.Conn
	p    poolDB
	done sync.Once
}

func (r *connRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.release()
	return false
}

func (r *connRows) Close() {
	r.Rows.Close()
	r.release()
}

func (r *connRows) release() {
	r.done.Do(func() {
		r.Rows.Close()
		r.p.release(r.c)
	})
}
