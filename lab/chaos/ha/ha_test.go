package ha_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/lab/chaos/ha"
)

func TestMain(m *testing.M) {
	flag.Parse()
	// An Example cannot skip: without pg_autoctl (and outside CI, where
	// its absence fails every test) the example is left out, as the
	// tests skip.
	if err := ha.Check(ha.Config{}); err != nil && os.Getenv("CI") != "true" {
		skip := "^Example"
		if s := flag.Lookup("test.skip").Value.String(); s != "" {
			skip = s + "|" + skip
		}
		flag.Set("test.skip", skip)
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines leaked:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// requirePgAutoctl skips (or, under CI, fails) the test when this machine
// cannot run the cluster: pg_autoctl (Debian's postgresql-15-auto-failover),
// PostgreSQL's initdb and pg_ctl, and, as root, the postgres user to run
// them as. It lives here, not in testdb, so the core never imports the lab.
func requirePgAutoctl(t testing.TB) {
	t.Helper()
	if err := ha.Check(ha.Config{}); err != nil {
		testdb.Unavailable(t, err.Error()+"; scripts/ha-setup.sh installs what is missing")
	}
}

// writers insert rows with increasing ids through the cluster's URL, on
// connections of their own, and record which inserts were acknowledged
// and which failed (an insert whose commit reply was lost may still have
// been written: its outcome is unknown).
type writers struct {
	url string

	mu      sync.Mutex
	next    int64
	acked   []int64
	ackedAt []time.Time
	unknown []int64

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func startWriters(url string, n int) *writers {
	w := &writers{url: url}
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	for range n {
		w.wg.Go(func() { w.run(ctx) })
	}
	return w
}

func (w *writers) run(ctx context.Context) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	for ctx.Err() == nil {
		if conn == nil {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			c, err := pgx.Connect(cctx, w.url)
			cancel()
			if err != nil {
				select {
				case <-ctx.Done():
				case <-time.After(20 * time.Millisecond):
				}
				continue
			}
			conn = c
		}
		w.mu.Lock()
		w.next++
		id := w.next
		w.mu.Unlock()
		ictx, cancel := context.WithTimeout(ctx, 3*time.Second)
		_, err := conn.Exec(ictx, "INSERT INTO ha_rows (id) VALUES ($1)", id)
		cancel()
		w.mu.Lock()
		if err == nil {
			w.acked = append(w.acked, id)
			w.ackedAt = append(w.ackedAt, time.Now())
		} else {
			w.unknown = append(w.unknown, id)
		}
		w.mu.Unlock()
		if err != nil {
			conn.Close(context.Background())
			conn = nil
		}
	}
}

func (w *writers) acks() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.acked)
}

// waitAcks waits until n more inserts than now are acknowledged.
func (w *writers) waitAcks(t *testing.T, n int, within time.Duration) {
	t.Helper()
	target := w.acks() + n
	deadline := time.Now().Add(within)
	for w.acks() < target {
		if time.Now().After(deadline) {
			t.Fatalf("%d acknowledged writes after %v, waiting for %d", w.acks(), within, target)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (w *writers) stop() {
	w.cancel()
	w.wg.Wait()
}

// longestGap is the longest time between two acknowledgements: the
// outage the writers saw.
func (w *writers) longestGap() time.Duration {
	at := slices.Clone(w.ackedAt)
	slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
	var gap time.Duration
	for i := 1; i < len(at); i++ {
		gap = max(gap, at[i].Sub(at[i-1]))
	}
	return gap
}

// outcome is what a run through failovers did to the acknowledged rows.
type outcome struct {
	acked, lost, unknown, unknownLanded int
	lostIDs                             []int64
}

// check reads every row back through url.
func (w *writers) check(t *testing.T, url string) outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	rows, _ := conn.Query(ctx, "SELECT id FROM ha_rows")
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	have := make(map[int64]bool, len(ids))
	for _, id := range ids {
		have[id] = true
	}
	o := outcome{acked: len(w.acked), unknown: len(w.unknown)}
	for _, id := range w.acked {
		if !have[id] {
			o.lost++
			o.lostIDs = append(o.lostIDs, id)
		}
	}
	for _, id := range w.unknown {
		if have[id] {
			o.unknownLanded++
		}
	}
	return o
}

// failoverRun starts a cluster, writes through it with four writers,
// kills the primary rounds times (bringing the killed node back between
// rounds), and reads every row back.
func failoverRun(t *testing.T, sync bool, rounds int) outcome {
	requirePgAutoctl(t)
	ctx := context.Background()
	began := time.Now()
	c, err := ha.Start(ctx, ha.Config{Sync: sync})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
		if _, err := os.Stat(c.Dir()); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("Close left %s behind (%v)", c.Dir(), err)
		}
	})
	t.Logf("sync=%v: monitor and two nodes up in %v", sync, time.Since(began).Round(time.Millisecond))

	p, err := c.Primary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "node1" {
		t.Fatalf("first primary is %s, want node1", p.Name)
	}
	if err := exec(c.URL(), "CREATE TABLE ha_rows (id bigint PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}

	w := startWriters(c.URL(), 4)
	defer w.stop()
	for round := 1; round <= rounds; round++ {
		w.waitAcks(t, 200, 30*time.Second)
		f, err := c.KillPrimary(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("sync=%v round %d: killed %s, %s promoted, writes through URL resumed after %v",
			sync, round, f.Killed.Name, f.Promoted.Name, f.WritesResumed.Round(time.Millisecond))
		if f.Killed == f.Promoted || f.Killed.Name != p.Name {
			t.Fatalf("KillPrimary killed %s and promoted %s; the primary was %s", f.Killed.Name, f.Promoted.Name, p.Name)
		}
		w.waitAcks(t, 200, 30*time.Second)
		if round == 1 {
			// With one node down there is nothing to fail over to.
			if _, err := c.KillPrimary(ctx); err == nil || !strings.Contains(err.Error(), "no primary with a secondary") {
				t.Errorf("KillPrimary with the standby down: %v, want an error that says there is no secondary", err)
			}
			if _, err := c.RestartNode(ctx, f.Promoted.Name); err == nil || !strings.Contains(err.Error(), "is running") {
				t.Errorf("RestartNode(%s), running: %v, want an error that says it is running", f.Promoted.Name, err)
			}
			if _, err := c.RestartNode(ctx, "node3"); err == nil || !strings.Contains(err.Error(), "no node \"node3\"") {
				t.Errorf("RestartNode(node3): %v, want an error that names the nodes", err)
			}
		}
		if round < rounds {
			d, err := c.RestartNode(ctx, f.Killed.Name)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("sync=%v round %d: %s back as the standby in %v", sync, round, f.Killed.Name, d.Round(time.Millisecond))
			p = f.Promoted
		}
	}
	w.stop()
	o := w.check(t, c.URL())
	t.Logf("sync=%v: %d inserts acknowledged, %d lost; %d failed (outcome unknown), of which %d were written anyway; longest pause between acknowledgements %v",
		sync, o.acked, o.lost, o.unknown, o.unknownLanded, w.longestGap().Round(time.Millisecond))
	return o
}

// With a synchronous standby no acknowledged write is lost across two
// failovers (the second after the killed node rejoined as the standby).
func TestFailoverSyncLosesNoAcknowledgedWrite(t *testing.T) {
	t.Parallel()
	o := failoverRun(t, true, 2)
	if o.lost > 0 {
		t.Errorf("a synchronous standby lost %d acknowledged writes: ids %v", o.lost, o.lostIDs[:min(len(o.lostIDs), 20)])
	}
}

// With an asynchronous standby writes resume after a failover too; what
// it lost is reported, not asserted: a short run on loopback may lose
// nothing, and nothing promises it will.
func TestFailoverAsyncReportsLoss(t *testing.T) {
	t.Parallel()
	o := failoverRun(t, false, 1)
	if o.lost > 0 {
		t.Logf("ASYNC: the promoted standby lacks %d acknowledged writes (ids %v): each would be a lost claim, and a duplicate effect",
			o.lost, o.lostIDs[:min(len(o.lostIDs), 20)])
	} else {
		t.Logf("ASYNC: no acknowledged write lost in this run: the standby had caught up when the primary was killed")
	}
}

// Bad configuration is refused before anything starts, with an error
// that names the field.
func TestStartRefusesBadDir(t *testing.T) {
	requirePgAutoctl(t)
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	long := filepath.Join(os.TempDir(), strings.Repeat("d", 100))
	if err := os.MkdirAll(long, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(long) })
	for _, tc := range []struct {
		dir, want string
	}{
		{filepath.Join(t.TempDir(), "missing"), "Config.Dir"},
		{file, "is not a directory"},
		{long, "too long"},
	} {
		c, err := ha.Start(context.Background(), ha.Config{Dir: tc.dir})
		if err == nil {
			c.Close()
			t.Errorf("Start with Dir %q: no error", tc.dir)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Start with Dir %q: %v, want it to say %q", tc.dir, err, tc.want)
		}
	}
	entries, _ := os.ReadDir(long)
	if len(entries) != 0 {
		t.Errorf("a refused Start left %v in %s", entries, long)
	}
}

// Root runs the cluster as postgres, who must be able to reach Dir.
func TestStartRefusesDirRunAsCannotEnter(t *testing.T) {
	requirePgAutoctl(t)
	if os.Geteuid() != 0 {
		t.Skip("only root runs the cluster as another user")
	}
	dir := t.TempDir() // mode 0700, root's
	_, err := ha.Start(context.Background(), ha.Config{Dir: dir})
	if err == nil || !strings.Contains(err.Error(), "cannot enter") || !strings.Contains(err.Error(), "leave Dir empty") {
		t.Fatalf("Start with Dir %s: %v, want an error that says postgres cannot enter it", dir, err)
	}
}

func TestCheckMissingPgAutoctl(t *testing.T) {
	err := ha.Check(ha.Config{PgAutoctl: filepath.Join(t.TempDir(), "pg_autoctl")})
	if err == nil || !strings.Contains(err.Error(), "postgresql-15-auto-failover") {
		t.Fatalf("Check with no pg_autoctl: %v, want an error that names the package to install", err)
	}
	_, err = ha.Start(context.Background(), ha.Config{BinDir: t.TempDir(), PgAutoctl: "/bin/true"})
	if err == nil || !strings.Contains(err.Error(), "initdb not found") {
		t.Fatalf("Start with an empty BinDir: %v, want an error that says initdb is missing", err)
	}
}

func exec(url, sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}
