package postgres

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/testdb"
)

// The disk-full tests run a throwaway PostgreSQL cluster of their own on
// a small tmpfs and fill that file system for real: a filler file beside
// the data directory takes what the server does not, and is removed to
// free space. They need root (to mount, and to run the server as the
// postgres user) and PostgreSQL's binaries, and skip without.

const pgBin = "/usr/lib/postgresql/15/bin"

// fullCluster is a throwaway cluster whose tables live on a small tmpfs.
type fullCluster struct {
	t       *testing.T
	mnt     string // the tmpfs
	data    string // the data directory, on the tmpfs
	roomy   string // a directory on the roomy disk: the log, and the WAL when apart
	port    int
	uid     int
	gid     int
	filler  string
	stopped bool
}

// startFullCluster mounts a tmpfs of size, makes a cluster on it (with
// its WAL on the roomy disk when walApart), starts it, and stops and
// unmounts everything at t's end.
func startFullCluster(t *testing.T, size string, walApart bool, extraConf ...string) *fullCluster {
	t.Helper()
	uid, gid := clusterUser(t, "the disk-full tests")
	mnt := testdb.SmallDisk(t, size)
	roomy, err := os.MkdirTemp("", "pgfull-roomy-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(roomy) })
	for _, d := range []string{mnt, roomy} {
		if err := os.Chown(d, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	c := &fullCluster{t: t, mnt: mnt, data: filepath.Join(mnt, "data"), roomy: roomy, uid: uid, gid: gid, filler: filepath.Join(mnt, "filler")}
	args := []string{"-D", c.data, "-U", "postgres", "--auth=trust", "--no-sync", "--encoding=UTF8", "--locale=C", "--wal-segsize=1"}
	if walApart {
		args = append(args, "--waldir="+filepath.Join(roomy, "wal"))
	}
	if out, err := c.asPostgres(filepath.Join(pgBin, "initdb"), args...).CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v: %s", err, out)
	}
	// With the WAL apart, no checkpoint runs during a test: a checkpoint
	// writes files of its own into the data directory, and PANICs when
	// it cannot.
	maxWAL := "4MB"
	if walApart {
		maxWAL = "1GB"
	}
	conf := fmt.Sprintf(`
listen_addresses = '127.0.0.1'
unix_socket_directories = '%s'
shared_buffers = 1MB
max_wal_size = %s
min_wal_size = 2MB
checkpoint_timeout = 1h
max_connections = 60
dynamic_shared_memory_type = mmap
autovacuum = off
restart_after_crash = on
logging_collector = off
`, mnt, maxWAL) + strings.Join(extraConf, "\n") + "\n"
	c.configure(conf)
	c.startOnFreePort(portIn(25432, 68))
	return c
}

func (c *fullCluster) asPostgres(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(c.uid), Gid: uint32(c.gid)}}
	cmd.Dir = c.roomy
	return cmd
}

func (c *fullCluster) logPath() string { return filepath.Join(c.roomy, "server.log") }

// start starts the server again, on its port.
func (c *fullCluster) start() {
	c.t.Helper()
	if err := c.tryStart(); err != nil {
		c.t.Fatalf("pg_ctl start: %v\n%s", err, c.log())
	}
}

func (c *fullCluster) tryStart() error {
	out, err := c.asPostgres(filepath.Join(pgBin, "pg_ctl"), "start", "-w", "-t", "20", "-D", c.data, "-l", c.logPath(),
		"-o", "-p "+strconv.Itoa(c.port)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	c.stopped = false
	return nil
}

// stop stops the server, at once, and makes sure no process of it is
// left holding the tmpfs.
func (c *fullCluster) stop() {
	if c.stopped {
		return
	}
	c.stopped = true
	pid := c.postmasterPID()
	c.asPostgres(filepath.Join(pgBin, "pg_ctl"), "stop", "-m", "immediate", "-w", "-t", "10", "-D", c.data).Run()
	// Killed only if that process still is this cluster's postmaster.
	if cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); pid > 0 && err == nil && strings.Contains(string(cmd), c.data) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

func (c *fullCluster) postmasterPID() int {
	b, err := os.ReadFile(filepath.Join(c.data, "postmaster.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	return pid
}

// alive reports whether the server answers.
func (c *fullCluster) alive() bool {
	return c.asPostgres(filepath.Join(pgBin, "pg_isready"), "-h", "127.0.0.1", "-p", strconv.Itoa(c.port), "-t", "2").Run() == nil
}

func (c *fullCluster) log() string {
	b, _ := os.ReadFile(c.logPath())
	return string(b)
}

func (c *fullCluster) url() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// fill appends to the filler until the tmpfs is full, to the last byte.
func (c *fullCluster) fill() { testdb.FillDisk(c.t, c.filler) }

// free removes the filler.
func (c *fullCluster) free() { os.Remove(c.filler) }

// trickle frees n bytes of the filler.
func (c *fullCluster) trickle(n int64) {
	if fi, err := os.Stat(c.filler); err == nil && fi.Size() >= n {
		os.Truncate(c.filler, fi.Size()-n)
	}
}

// isDiskFull reports whether err says the disk is full.
func isDiskFull(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "53100") || strings.Contains(err.Error(), "No space left on device"))
}

// dfCall is one Do of a disk-full test, as it ended.
type dfCall struct {
	key      once.Key
	ran      int
	err      error
	replayed bool
	took     time.Duration
}

type dfCallKey struct{}

// dfRun drives Do on a client from many goroutines, half of them sharing
// keys, counting effect calls per key and per call.
type dfRun struct {
	c     *once.Client
	mu    sync.Mutex
	calls []*dfCall
	ran   map[once.Key]int
}

func newDFRun(c *once.Client) *dfRun { return &dfRun{c: c, ran: map[once.Key]int{}} }

func (r *dfRun) effect(ctx context.Context, a once.Attempt) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ran[a.Key]++
	ctx.Value(dfCallKey{}).(*dfCall).ran++
	return "sent", nil
}

func dfIntent(run string, step int64) once.Intent {
	return once.Intent{Run: run, Step: step, Kind: "send_email", Payload: map[string]any{"p": strings.Repeat("p", 600)}}
}

func (r *dfRun) do(in once.Intent) *dfCall {
	call := &dfCall{}
	call.key, _, _ = once.KeyOf(in)
	start := time.Now()
	res, err := once.Do(context.WithValue(context.Background(), dfCallKey{}, call), r.c, in, r.effect)
	r.mu.Lock()
	defer r.mu.Unlock()
	call.err, call.replayed, call.took = err, res.Replayed, time.Since(start)
	r.calls = append(r.calls, call)
	return call
}

// ended counts the calls that succeeded and those whose claim failed
// so far, as check sorts them.
func (r *dfRun) ended() (ok, claimFailed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, call := range r.calls {
		var held *once.InFlightError
		switch {
		case call.err == nil:
			ok++
		case errors.Is(call.err, once.ErrNotRecorded), errors.As(call.err, &held):
		default:
			claimFailed++
		}
	}
	return ok, claimFailed
}

// load runs Do from g goroutines until stop is closed; odd goroutines
// share keys.
func (r *dfRun) load(run string, g int, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	var next atomic.Int64
	for i := range g {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				n := next.Add(1)
				if i%2 == 1 {
					n /= 2
				}
				r.do(dfIntent(run, n))
			}
		})
	}
	return &wg
}

// rows reads every action of the store.
func dfRows(t *testing.T, s *Store) map[once.Key]once.Action {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	acts, err := s.List(ctx, once.Filter{Limit: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	rows := map[once.Key]once.Action{}
	for _, a := range acts {
		rows[a.Key] = a
	}
	return rows
}

// check holds the calls to Do's word: an effect ran at most once a key,
// a success is a succeeded row, an in-flight row is one whose call was
// told its outcome was not recorded, and an error that says nothing ran
// comes from a call whose effect did not run.
func (r *dfRun) check(t *testing.T, rows map[once.Key]once.Action, limit time.Duration) (answered map[string]int) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	answered = map[string]int{}
	bad := 0
	report := func(format string, args ...any) {
		bad++
		if bad <= 20 {
			t.Errorf(format, args...)
		}
	}
	for k, n := range r.ran {
		if n > 1 {
			report("%s: the effect ran %d times", k, n)
		}
	}
	unrecorded := map[once.Key]bool{}
	for _, call := range r.calls {
		row, found := rows[call.key]
		var held *once.InFlightError
		if call.took > limit {
			report("%s: Do took %v, past %v", call.key, call.took, limit)
		}
		switch {
		case call.err == nil:
			answered["ok"]++
			if call.ran != 1 && !call.replayed {
				report("%s: Do succeeded, ran its effect %d times, not replayed", call.key, call.ran)
			}
			if !found || row.Status != once.StatusSucceeded {
				report("%s: Do succeeded (ran %d); the row is %q (found %v)", call.key, call.ran, row.Status, found)
			}
		case errors.Is(call.err, once.ErrNotRecorded):
			answered["not recorded"]++
			unrecorded[call.key] = true
			if call.ran != 1 {
				report("%s: ran %d, answered %v", call.key, call.ran, call.err)
			}
		case errors.As(call.err, &held):
			answered["in flight"]++
			if call.ran != 0 {
				report("%s: ran %d, answered %v", call.key, call.ran, call.err)
			}
		default:
			answered["claim failed"]++
			if call.ran != 0 || !strings.Contains(call.err.Error(), "claiming action") {
				report("%s: ran %d, answered %v", call.key, call.ran, call.err)
			}
			if !isDiskFull(call.err) {
				answered["claim failed, not saying the disk is full"]++
			}
		}
	}
	for _, a := range rows {
		switch {
		case a.Status == once.StatusInFlight && !unrecorded[a.Key]:
			report("%s is in flight (attempt %d), and no call was told its outcome was not recorded (effect ran %d times)", a.Key, a.Attempt, r.ran[a.Key])
		case a.Status == once.StatusSucceeded && r.ran[a.Key] != 1:
			report("%s succeeded, its effect ran %d times", a.Key, r.ran[a.Key])
		}
	}
	if bad > 20 {
		t.Errorf("... and %d more", bad-20)
	}
	return answered
}

func openFullStore(t *testing.T, c *fullCluster, unbatched bool) *Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := Open(ctx, c.url(), Config{Unbatched: unbatched})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

// dfNorm blanks out keys, times and numbers, so that errors that differ
// only in them count together.
var dfNorm = regexp.MustCompile(`[0-9a-f]{64}|[0-9T:.+-]{19,}Z?|[0-9]+`)

// exhaust fills the tmpfs and then claims new keys until claims of new
// keys fail for want of space 20 times running: the pages the tables
// had room on are taken too.
func (c *fullCluster) exhaust(cl *once.Client) {
	c.t.Helper()
	c.fill()
	noop := func(context.Context, once.Attempt) (string, error) { return "sent", nil }
	failed := 0
	for i := range 20000 {
		_, err := once.Do(context.Background(), cl, dfIntent("zz-exhaust", int64(i)), noop)
		switch {
		case isDiskFull(err):
			failed++
			if failed == 20 {
				return
			}
		case err != nil:
			c.t.Fatalf("filling the tables: %v", err)
		default:
			failed = 0
		}
	}
	c.t.Fatal("claims of new keys still fit after 20000 tries: the disk did not fill")
}

// flood claims new keys from g goroutines until the returned func is
// called; on the full disk every one of them fails for want of space.
func flood(cl *once.Client, g int) (stop func() (calls, full int64)) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	var next, n, full atomic.Int64
	noop := func(context.Context, once.Attempt) (string, error) { return "sent", nil }
	for range g {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				_, err := once.Do(context.Background(), cl, dfIntent("zz-flood", next.Add(1)), noop)
				n.Add(1)
				if isDiskFull(err) {
					full.Add(1)
				}
			}
		})
	}
	return func() (int64, int64) {
		close(done)
		wg.Wait()
		return n.Load(), full.Load()
	}
}

// blocked starts Do on in with an effect that waits for release, and
// returns once the effect runs; the Do's answer comes on the channel.
func blocked(t *testing.T, cl *once.Client, in once.Intent) (release func(), answer <-chan error) {
	t.Helper()
	started, rel, ans := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		_, err := once.Do(context.Background(), cl, in, func(context.Context, once.Attempt) (string, error) {
			close(started)
			<-rel
			return "sent", nil
		})
		ans <- err
	}()
	select {
	case <-started:
	case err := <-ans:
		t.Fatalf("Do on %v returned before its effect ran: %v", in, err)
	}
	return func() { close(rel) }, ans
}

func rowOf(t *testing.T, s *Store, in once.Intent) once.Action {
	t.Helper()
	k, _, _ := once.KeyOf(in)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a, err := s.Get(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestDiskFullBatchedOutcomeFitsWhereClaimsDoNot: on a disk so full that
// no new key can be claimed but an outcome still fits (a lone transition
// records it: the control, key B), the outcome of an effect that ran
// (key A) is recorded, with group commit as without. With it, the
// transition rides in batches beside claims of new keys that cannot
// extend the table, and such a batch rolls back with SQLSTATE 53100.
// sendAlone (batch.go) did not send its requests again alone, so every
// request in it got the claims' disk-full error: Do retried the outcome
// in batches that failed the same way and gave up (ErrNotRecorded, the
// row left in flight, to be put to a person when its lease ran out,
// about an effect that succeeded and whose outcome fit on the disk).
func TestDiskFullBatchedOutcomeFitsWhereClaimsDoNot(t *testing.T) {
	for _, unbatched := range []bool{true, false} {
		t.Run(fmt.Sprint("unbatched=", unbatched), func(t *testing.T) {
			c := startFullCluster(t, "64M", true)
			s := openFullStore(t, c, unbatched)
			// A and B's rows sort before every other row in each
			// index their outcome adds to (by run, and by retention
			// deadline: a kind kept an hour), where the leaves that
			// splits left behind have room: their outcomes need no new
			// page where claims of new keys do.
			cl, err := once.New(once.Config{Store: s, ClaimTimeout: 2 * time.Second, RecordTimeout: 3 * time.Second,
				Kinds: map[string]once.KindPolicy{"brief": {Retention: time.Hour}}})
			if err != nil {
				t.Fatal(err)
			}
			a, b := dfIntent("aaa", 1), dfIntent("aaa", 2)
			a.Kind, b.Kind = "brief", "brief"
			a.Payload, b.Payload = map[string]any{"p": "a"}, map[string]any{"p": "b"}
			warm(t, cl, 2000)
			releaseA, answerA := blocked(t, cl, a)
			releaseB, answerB := blocked(t, cl, b)
			c.exhaust(cl)
			if s.batch != nil {
				// Each batch stays in flight a little longer, so that
				// the claims of the flood always queue behind one (as
				// under heavy load, also with the race detector on):
				// a request that found nothing in flight would be sent
				// alone.
				s.batch.beforeBatch = func(int) { time.Sleep(5 * time.Millisecond) }
			}
			stop := flood(cl, 32)
			time.Sleep(200 * time.Millisecond)
			releaseA()
			errA := <-answerA
			calls, full := stop()
			releaseB()
			errB := <-answerB
			t.Logf("flood: %d claims, %d found the disk full", calls, full)
			if errB != nil {
				t.Fatalf("the control: B's outcome, recorded alone on the full disk, failed: %v", errB)
			}
			if st := rowOf(t, s, b).Status; st != once.StatusSucceeded {
				t.Fatalf("the control: B is %s", st)
			}
			if errA != nil {
				t.Errorf("A's effect ran and its outcome fits on the disk (B's did, alone), but Do answered: %v", errA)
			}
			if st := rowOf(t, s, a).Status; st != once.StatusSucceeded {
				t.Errorf("A is %s, not succeeded", st)
			}
		})
	}
}

// TestDiskFullBatchedReplayAnswersBesideFailingClaims: a duplicate of a
// key that succeeded before the disk filled needs nothing written (the
// claim statement reads the standing row, and the insert has nothing to
// insert), and it is replayed on the full disk, with group commit as
// without. With it, the duplicate's claim rides in a batch beside claims
// of new keys that cannot extend the table, and the batch rolls back
// with SQLSTATE 53100; before sendAlone sent such a batch's requests
// again alone, the duplicate got the disk-full error ("claiming action
// ...: could not extend file") instead of its stored result, and its
// caller retried a job that was done, for as long as the disk stayed
// full.
func TestDiskFullBatchedReplayAnswersBesideFailingClaims(t *testing.T) {
	for _, unbatched := range []bool{true, false} {
		t.Run(fmt.Sprint("unbatched=", unbatched), func(t *testing.T) {
			c := startFullCluster(t, "64M", true)
			s := openFullStore(t, c, unbatched)
			cl, err := once.New(once.Config{Store: s, ClaimTimeout: 2 * time.Second, RecordTimeout: 3 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			d := dfIntent("replay", 1)
			var ran atomic.Int64
			effect := func(context.Context, once.Attempt) (string, error) { ran.Add(1); return "sent", nil }
			if _, err := once.Do(context.Background(), cl, d, effect); err != nil || ran.Load() != 1 {
				t.Fatalf("before the disk filled: ran %d, %v", ran.Load(), err)
			}
			c.exhaust(cl)
			if s.batch != nil {
				s.batch.beforeBatch = func(int) { time.Sleep(5 * time.Millisecond) }
			}
			stop := flood(cl, 32)
			time.Sleep(200 * time.Millisecond)
			var wg sync.WaitGroup
			var mu sync.Mutex
			answers := map[string]int{}
			for range 4 {
				wg.Go(func() {
					for range 25 {
						res, err := once.Do(context.Background(), cl, d, effect)
						mu.Lock()
						switch {
						case err != nil:
							answers[dfNorm.ReplaceAllString(err.Error(), "#")]++
						case !res.Replayed || res.Value != "sent":
							answers[fmt.Sprintf("not a replay: %+v", res)]++
						default:
							answers["replayed"]++
						}
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			calls, full := stop()
			t.Logf("flood: %d claims, %d found the disk full", calls, full)
			if n := ran.Load(); n != 1 {
				t.Errorf("the effect ran %d times", n)
			}
			if answers["replayed"] != 100 {
				t.Errorf("of 100 duplicates of a key that succeeded before the disk filled, %d were replayed; the others were answered:", answers["replayed"])
				for m, n := range answers {
					if m != "replayed" {
						t.Errorf("%4d× %s", n, m)
					}
				}
			}
		})
	}
}

// warm records n actions that succeed, before the disk fills, so that
// the tables and their indexes have pages beyond their first.
func warm(t *testing.T, cl *once.Client, n int) {
	t.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	noop := func(context.Context, once.Attempt) (string, error) { return "sent", nil }
	for range 8 {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				if _, err := once.Do(context.Background(), cl, dfIntent("warm", i), noop); err != nil {
					t.Errorf("before the disk filled: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
}

// dfLoad drives Do from 32 goroutines (half of them sharing keys) on a
// cluster whose disk fills under the load, and is freed a little at a
// time (8 KiB every 20ms) for 3 seconds, so that some writes fit and
// others do not; then it frees the disk, starts the server again if it
// died, and carries on with the same client. It checks Do's word over
// every call (dfRun.check) and returns the run and how the calls ended.
func dfLoad(t *testing.T, walApart, unbatched bool) (*dfRun, map[string]int, *fullCluster) {
	c := startFullCluster(t, "64M", walApart)
	s := openFullStore(t, c, unbatched)
	cl, err := once.New(once.Config{Store: s, ClaimTimeout: 2 * time.Second, RecordTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r := newDFRun(cl)
	stop := make(chan struct{})
	wg := r.load("full", 32, stop)
	time.Sleep(300 * time.Millisecond)
	c.fill()
	// At least three seconds, and until 100 calls have succeeded and 100
	// claims have failed: a machine busy with other tests makes fewer
	// calls in three seconds than the check below needs.
	start := time.Now()
	for since := time.Duration(0); since < 3*time.Second || !enough(r) && since < 30*time.Second; since = time.Since(start) {
		time.Sleep(20 * time.Millisecond)
		c.trickle(8192)
	}
	close(stop)
	wg.Wait()
	alive := c.alive()
	c.free()
	if !alive {
		t.Log("the server is down; starting it again")
		c.stop()
		c.start()
	}
	panics := strings.Count(c.log(), "PANIC:")
	for i := range 30 {
		if call := r.do(dfIntent("after", int64(i))); call.err != nil || call.ran != 1 {
			t.Errorf("after freeing space, Do %d with the same client: ran %d, %v", i, call.ran, call.err)
		}
	}
	// The longest a call may take: a claim (ClaimTimeout) and its read
	// back (ClaimTimeout), and an outcome retried for RecordTimeout and
	// read back, with a second of slack.
	ans := r.check(t, dfRows(t, s), 2*2*time.Second+2*3*time.Second+time.Second)
	errs := map[string]int{}
	for _, call := range r.calls {
		if call.err != nil {
			errs[dfNorm.ReplaceAllString(call.err.Error(), "#")]++
		}
	}
	t.Logf("%d calls: %v; %d PANICs in the server's log", len(r.calls), ans, panics)
	for m, n := range errs {
		t.Logf("%6d× %s", n, m)
	}
	if ans["claim failed"] < 100 || ans["ok"] < 100 {
		t.Errorf("only %d claims failed and %d calls succeeded: the test did not exercise a full disk", ans["claim failed"], ans["ok"])
	}
	return r, ans, c
}

// enough says whether r has the calls dfLoad's check needs.
func enough(r *dfRun) bool {
	ok, failed := r.ended()
	return ok >= 100 && failed >= 100
}

// TestDiskFullDoKeepsItsWord: with the WAL on a roomy disk and the
// tables on one that fills under load (variant b), the server stays up
// and refuses what does not fit with SQLSTATE 53100. With group commit
// and without, no effect runs twice for a key; every Do that succeeded
// has a succeeded row; every row left in flight is one whose call got
// ErrNotRecorded; every claim that failed says the disk is full and ran
// nothing; no call outlives its timeouts; and once space is freed the
// same client carries on.
func TestDiskFullDoKeepsItsWord(t *testing.T) {
	for _, unbatched := range []bool{false, true} {
		t.Run(fmt.Sprint("unbatched=", unbatched), func(t *testing.T) {
			_, ans, c := dfLoad(t, true, unbatched)
			if ans["claim failed, not saying the disk is full"] > 0 {
				t.Errorf("%d claims failed without saying the disk is full", ans["claim failed, not saying the disk is full"])
			}
			if n := strings.Count(c.log(), "PANIC:"); n > 0 {
				t.Errorf("the server PANICked %d times with its WAL on a roomy disk", n)
			}
		})
	}
}

// TestDiskFullWALOnFullDisk: with the whole data directory, WAL
// included, on the disk that fills (variant a), the server PANICs when
// it cannot write a WAL segment or a checkpoint's file, and restarts
// when the trickle gives it room. Do keeps its word as in
// TestDiskFullDoKeepsItsWord, except that a claim cut off by the crash
// says the connection was lost, not that the disk is full: the client
// is not told why the server went away.
func TestDiskFullWALOnFullDisk(t *testing.T) {
	for _, unbatched := range []bool{false, true} {
		t.Run(fmt.Sprint("unbatched=", unbatched), func(t *testing.T) {
			dfLoad(t, false, unbatched)
		})
	}
}

// TestDiskFullServerDownUntilSpaceFreed: the whole data directory on
// the disk that fills, and a server that does not restart after a crash
// (restart_after_crash = off), as when it cannot: a checkpoint on the
// full disk PANICs and the server goes down. While it is down, an
// effect that was running has its outcome answered ErrNotRecorded
// within RecordTimeout and left in flight; a claim fails within its
// timeouts and runs nothing. Once space is freed and the server started
// again, the same client claims, replays, and recovers the action left
// in flight when its lease runs out (AskPerson: put to a person, the
// effect not run again). Checked with group commit and without.
func TestDiskFullServerDownUntilSpaceFreed(t *testing.T) {
	for _, unbatched := range []bool{false, true} {
		t.Run(fmt.Sprint("unbatched=", unbatched), func(t *testing.T) {
			c := startFullCluster(t, "64M", false, "restart_after_crash = off")
			s := openFullStore(t, c, unbatched)
			const lease = 3 * time.Second
			cl, err := once.New(once.Config{Store: s, ClaimTimeout: 2 * time.Second, RecordTimeout: 3 * time.Second,
				Default: once.KindPolicy{Lease: lease}})
			if err != nil {
				t.Fatal(err)
			}
			r := newDFRun(cl)
			done := dfIntent("down", 0)
			if call := r.do(done); call.err != nil || call.ran != 1 {
				t.Fatalf("before the disk filled: ran %d, %v", call.ran, call.err)
			}
			a := dfIntent("down", 1)
			release, answer := blocked(t, cl, a)
			c.fill()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			conn, err := pgx.Connect(ctx, c.url())
			if err != nil {
				cancel()
				t.Fatal(err)
			}
			_, err = conn.Exec(ctx, "CHECKPOINT")
			conn.Close(ctx)
			cancel()
			t.Logf("CHECKPOINT on the full disk: %v", err)
			for i := 0; c.alive(); i++ {
				if i == 50 {
					t.Fatalf("the server is still up after a CHECKPOINT on the full disk; its log:\n%s", c.log())
				}
				time.Sleep(100 * time.Millisecond)
			}
			if !strings.Contains(c.log(), "PANIC:") {
				t.Errorf("the server went down without a PANIC in its log:\n%s", c.log())
			}
			start := time.Now()
			release()
			errA := <-answer
			took := time.Since(start)
			if !errors.Is(errA, once.ErrNotRecorded) || took > 3*time.Second+2*time.Second {
				t.Errorf("the outcome of an effect that ran while the server went down: after %v, %v", took, errA)
			}
			for _, in := range []once.Intent{dfIntent("down", 2), done} {
				call := r.do(in)
				if call.err == nil || call.ran != 0 || !strings.Contains(call.err.Error(), "claiming action") || call.took > 2*2*time.Second+time.Second {
					t.Errorf("Do while the server is down: ran %d after %v, %v", call.ran, call.took, call.err)
				}
			}
			c.free()
			c.start()
			if call := r.do(done); call.err != nil || !call.replayed || call.ran != 0 {
				t.Errorf("after the restart, a duplicate of an action that succeeded: ran %d, replayed %v, %v", call.ran, call.replayed, call.err)
			}
			for i := range 10 {
				if call := r.do(dfIntent("after", int64(i))); call.err != nil || call.ran != 1 {
					t.Errorf("after the restart, Do %d with the same client: ran %d, %v", i, call.ran, call.err)
				}
			}
			if row := rowOf(t, s, a); row.Status != once.StatusInFlight {
				t.Errorf("the action whose outcome was not recorded is %s", row.Status)
			}
			time.Sleep(time.Until(start.Add(lease + lease/5 + 500*time.Millisecond)))
			var rev *once.ReviewError
			if call := r.do(a); !errors.As(call.err, &rev) || call.ran != 0 {
				t.Errorf("a duplicate of the action left in flight, after its lease: ran %d, %v", call.ran, call.err)
			}
			if row := rowOf(t, s, a); row.Status != once.StatusReview {
				t.Errorf("the action whose outcome was not recorded is %s after recovery, not review", row.Status)
			}
		})
	}
}
