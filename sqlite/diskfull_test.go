package sqlite_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/sqlite"
)

// The disk-full tests put the database on a small tmpfs of their own and
// fill it for real: a filler file takes what the database does not, and
// is removed to free space. They need root to mount, and skip without.

// closedOnFullDisk is the path of a migrated database that no process
// has open, closed cleanly (no -wal or -shm file), on a small tmpfs
// then filled to the last byte, and the tmpfs's directory; the database
// holds one succeeded action, whose key it returns.
func closedOnFullDisk(t *testing.T) (dir, path string, key once.Key) {
	t.Helper()
	dir = testdb.SmallDisk(t, "1M")
	path = filepath.Join(dir, "once.db")
	s, err := sqlite.Open(path, sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	c, err := once.New(once.Config{Store: s})
	if err != nil {
		t.Fatal(err)
	}
	res, err := once.Do(context.Background(), c, once.Intent{Run: "df", Kind: "send_email", Target: "ada@example.com"},
		func(context.Context, once.Attempt) (string, error) { return "msg-1", nil })
	if err != nil {
		t.Fatal(err)
	}
	key = res.Key
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{path + "-wal", path + "-shm"} {
		if _, err := os.Stat(f); err == nil {
			t.Fatalf("%s stays after Close", f)
		}
	}
	testdb.FillDisk(t, filepath.Join(dir, "filler"))
	if n := testdb.FreeBytes(t, dir); n != 0 {
		t.Fatalf("%d bytes free: the disk is not full", n)
	}
	return dir, path, key
}

// fullStore is a migrated store on a small tmpfs, with a file "reserve"
// of 1 MiB beside it and a file "filler" that takes the rest of the
// space.
func fullStore(t *testing.T, cfg sqlite.Config) (s *sqlite.Store, dir, path string) {
	t.Helper()
	dir = testdb.SmallDisk(t, "4M")
	path = filepath.Join(dir, "once.db")
	s, err := sqlite.Open(path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Closed before the disk is unmounted, also when the test fails
	// while the store is open.
	t.Cleanup(func() { s.Close() })
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "reserve"), make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	testdb.FillDisk(t, filepath.Join(dir, "filler"))
	return s, dir, path
}

func isFull(err error) bool {
	return err != nil && strings.Contains(err.Error(), "database or disk is full")
}

// reopened opens the file at path again, closed at t's end, and checks
// that SQLite finds it whole.
func reopened(t *testing.T, path string) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(path, sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	var ic string
	if err := s.DB().QueryRow("PRAGMA integrity_check").Scan(&ic); err != nil || ic != "ok" {
		t.Errorf("PRAGMA integrity_check: %q, %v", ic, err)
	}
	return s
}

// ranOnceEach checks that no key's effect ran more than once.
func ranOnceEach[K comparable](t *testing.T, ran map[K]int) {
	t.Helper()
	for k, n := range ran {
		if n > 1 {
			t.Errorf("%v: the effect ran %d times", k, n)
		}
	}
}

// callID carries, in the context given to Do, the number of the call, so
// that the effect says which call ran it.
type callID struct{}

// diskFullCall is one Do: its key, what it answered, and how many times
// its effect ran in it.
type diskFullCall struct {
	key      once.Key
	err      error
	replayed bool
	ran      int
}

// TestDiskFullDoKeepsItsWord drives Do from 32 goroutines, two calls per
// key for half of them, on a store whose disk fills up (the filler
// shrinks a little at a time, so the database meets the end of the disk
// again and again), with group commit on and off. Space is then freed:
// the same store must write again, at once, and the file, reopened, must
// pass integrity_check and hold what every call answered:
//   - no effect ran twice for one key;
//   - a call that answered success ran its effect or replayed, and its
//     row is succeeded;
//   - a call whose claim failed (the error says claiming, and that the
//     disk is full) ran nothing;
//   - a call whose effect ran and was not recorded answered
//     once.ErrNotRecorded, saying the disk is full, or, when every try
//     of its outcome waited its time out behind the others' writes
//     (under load: 32 writers on one file), that it ran out of time;
//     and its row is the only kind left in flight.
func TestDiskFullDoKeepsItsWord(t *testing.T) {
	for _, unbatched := range []bool{false, true} {
		t.Run(fmt.Sprint("unbatched=", unbatched), func(t *testing.T) {
			s, dir, path := fullStore(t, sqlite.Config{Unbatched: unbatched})
			filler := filepath.Join(dir, "filler")
			c, err := once.New(once.Config{Store: s, RecordTimeout: 2 * time.Second, ClaimTimeout: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var calls []*diskFullCall
			ran := map[once.Key]int{}
			effect := func(ctx context.Context, a once.Attempt) (string, error) {
				mu.Lock()
				defer mu.Unlock()
				ran[a.Key]++
				ctx.Value(callID{}).(*diskFullCall).ran++
				return "sent", nil
			}
			pay := strings.Repeat("p", 1000)
			intent := func(run string, step int64) once.Intent {
				return once.Intent{Run: run, Step: step, Kind: "send_email", Payload: map[string]any{"p": pay}}
			}
			var full atomic.Int64
			do := func(in once.Intent) *diskFullCall {
				call := &diskFullCall{}
				call.key, _, _ = once.KeyOf(in)
				res, err := once.Do(context.WithValue(context.Background(), callID{}, call), c, in, effect)
				mu.Lock()
				defer mu.Unlock()
				call.err, call.replayed = err, res.Replayed
				calls = append(calls, call)
				if isFull(err) {
					full.Add(1)
				}
				return call
			}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					case <-time.After(20 * time.Millisecond):
					}
					if fi, err := os.Stat(filler); err == nil && fi.Size() >= 8192 {
						os.Truncate(filler, fi.Size()-8192)
					}
				}
			})
			var next atomic.Int64
			for g := range 32 {
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						i := next.Add(1)
						if g%2 == 1 {
							i /= 2 // the odd goroutines share keys
						}
						do(intent("full", i))
					}
				})
			}
			// At least four seconds, and until 100 calls have met the full
			// disk: a machine busy with other tests makes fewer calls in
			// four seconds than the check needs.
			start := time.Now()
			for time.Since(start) < 4*time.Second || full.Load() < 100 && time.Since(start) < time.Minute {
				time.Sleep(50 * time.Millisecond)
			}
			close(stop)
			wg.Wait()
			if full.Load() < 100 {
				t.Fatalf("in %v, %d calls, only %d met a full disk: the disk did not fill", time.Since(start).Round(time.Second), len(calls), full.Load())
			}
			os.Remove(filler)
			os.Remove(filepath.Join(dir, "reserve"))
			t.Logf("%d calls, %d met the full disk; %d bytes free after freeing", len(calls), full.Load(), testdb.FreeBytes(t, dir))
			// The same store writes again once space is freed.
			for i := range 50 {
				if call := do(intent("after", int64(i))); call.err != nil || call.ran != 1 {
					t.Errorf("after freeing space, Do %d on the same store: ran %d, %v", i, call.ran, call.err)
				}
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = reopened(t, path)
			ctx := context.Background()
			rows := map[once.Key]once.Action{}
			acts, err := s.List(ctx, once.Filter{Limit: 1 << 20})
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range acts {
				rows[a.Key] = a
			}
			ranOnceEach(t, ran)
			unrecorded := map[once.Key]bool{}
			var answered [4]int
			for _, call := range calls {
				row, found := rows[call.key]
				var held *once.InFlightError
				switch {
				case call.err == nil:
					answered[0]++
					if call.ran != 1 && !call.replayed {
						t.Errorf("%s: Do succeeded, ran its effect %d times, not replayed", call.key, call.ran)
					}
					if !found || row.Status != once.StatusSucceeded {
						t.Errorf("%s: Do succeeded; the row is %q (found %v)", call.key, row.Status, found)
					}
				case errors.Is(call.err, once.ErrNotRecorded):
					answered[1]++
					unrecorded[call.key] = true
					if call.ran != 1 || !isFull(call.err) && !errors.Is(call.err, context.DeadlineExceeded) {
						t.Errorf("%s: ran %d, answered %v", call.key, call.ran, call.err)
					}
				case errors.As(call.err, &held):
					answered[2]++
					if call.ran != 0 {
						t.Errorf("%s: ran %d, answered %v", call.key, call.ran, call.err)
					}
				default:
					answered[3]++
					if call.ran != 0 || !isFull(call.err) || !strings.Contains(call.err.Error(), "claiming action") {
						t.Errorf("%s: ran %d, answered %v", call.key, call.ran, call.err)
					}
				}
			}
			for _, a := range acts {
				switch {
				case a.Status == once.StatusInFlight && !unrecorded[a.Key]:
					t.Errorf("%s is in flight, and no call was told its outcome was not recorded (effect ran %d times)", a.Key, ran[a.Key])
				case a.Status != once.StatusInFlight && a.Status != once.StatusSucceeded:
					t.Errorf("%s is %s", a.Key, a.Status)
				case a.Status == once.StatusSucceeded && ran[a.Key] != 1:
					t.Errorf("%s succeeded, its effect ran %d times", a.Key, ran[a.Key])
				}
			}
			if answered[0] <= 50 || answered[3] == 0 {
				t.Errorf("answers: %d succeeded, %d not recorded, %d in flight, %d claims failed: the test did not exercise both", answered[0], answered[1], answered[2], answered[3])
			}
			t.Logf("answers: %d succeeded, %d not recorded, %d in flight elsewhere, %d claims failed; %d rows", answered[0], answered[1], answered[2], answered[3], len(acts))
		})
	}
}

// envDiskFullChild names the file a disk-full worker process writes to.
const envDiskFullChild = "ONCE_SQLITE_DISKFULL_CHILD"

// maybeDiskFullChild plays the worker of TestDiskFullKilledWorker when the
// test binary is started as one: Do on new keys from 16 goroutines until
// killed, saying "effect KEY" as an effect runs, "ok KEY" when Do returns
// nil and "err KEY TEXT" when it fails.
func maybeDiskFullChild() {
	path := os.Getenv(envDiskFullChild)
	if path == "" {
		return
	}
	unbatched := os.Getenv(envDiskFullChild+"_UNBATCHED") != ""
	s, err := sqlite.Open(path, sqlite.Config{Unbatched: unbatched})
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
	c, err := once.New(once.Config{Store: s, RecordTimeout: time.Second, ClaimTimeout: time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
	var out sync.Mutex
	say := func(format string, args ...any) {
		out.Lock()
		defer out.Unlock()
		fmt.Printf(format+"\n", args...)
	}
	var next atomic.Int64
	pay := strings.Repeat("p", 1000)
	for range 16 {
		go func() {
			for {
				in := once.Intent{Run: "child", Step: next.Add(1), Kind: "send_email", Payload: map[string]any{"p": pay}}
				k, _, _ := once.KeyOf(in)
				_, err := once.Do(context.Background(), c, in, func(ctx context.Context, a once.Attempt) (string, error) {
					say("effect %s", a.Key)
					return "sent", nil
				})
				if err != nil {
					say("err %s %s", k, strings.ReplaceAll(err.Error(), "\n", " "))
				} else {
					say("ok %s", k)
				}
			}
		}()
	}
	select {}
}

// TestDiskFullKilledWorker: a worker process runs Do until the disk is
// full and keeps on meeting it; it is killed (SIGKILL) then. The file
// opens while the disk is still full, and, once space is freed, passes
// integrity_check, holds every outcome the worker answered as done, has
// no effect run twice, and takes new work.
func TestDiskFullKilledWorker(t *testing.T) {
	for _, unbatched := range []bool{false, true} {
		t.Run(fmt.Sprint("unbatched=", unbatched), func(t *testing.T) {
			s, dir, path := fullStore(t, sqlite.Config{})
			s.Close()
			filler := filepath.Join(dir, "filler")
			// About 2.5 MiB for the worker to fill.
			if err := os.Truncate(filler, 0); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), envDiskFullChild+"="+path)
			if unbatched {
				cmd.Env = append(cmd.Env, envDiskFullChild+"_UNBATCHED=1")
			}
			var stderr strings.Builder
			cmd.Stderr = &stderr
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			deadline := time.AfterFunc(60*time.Second, func() { cmd.Process.Kill() })
			defer deadline.Stop()
			ran, ok, errs := map[string]int{}, map[string]bool{}, map[string]string{}
			full := 0
			read := func(line string) {
				word, rest, _ := strings.Cut(line, " ")
				k, msg, _ := strings.Cut(rest, " ")
				switch word {
				case "effect":
					ran[k]++
				case "ok":
					ok[k] = true
				case "err":
					errs[k] = msg
					if strings.Contains(msg, "database or disk is full") {
						full++
					}
				}
			}
			lines := bufio.NewScanner(stdout)
			lines.Buffer(nil, 1<<20)
			for lines.Scan() {
				read(lines.Text())
				if full == 1000 {
					cmd.Process.Signal(syscall.SIGKILL)
					break
				}
			}
			for lines.Scan() {
				read(lines.Text())
			}
			cmd.Wait()
			if full < 1000 || len(ok) == 0 {
				t.Fatalf("the worker stopped after %d outcomes and %d disk-full errors: %s", len(ok), full, stderr.String())
			}
			for k, m := range errs {
				if !strings.Contains(m, "database or disk is full") || ran[k] != 0 && !strings.Contains(m, "could not be recorded") {
					t.Errorf("%s: ran %d, answered %s", k, ran[k], m)
				}
			}
			// Opened while the disk is still full.
			s, err = sqlite.Open(path, sqlite.Config{})
			if err != nil {
				t.Errorf("reopening after the kill, the disk still full: %v", err)
			} else {
				s.Close()
			}
			os.Remove(filler)
			os.Remove(filepath.Join(dir, "reserve"))
			s = reopened(t, path)
			ctx := context.Background()
			ranOnceEach(t, ran)
			for k := range ok {
				if a, err := s.Get(ctx, once.Key(k)); err != nil || a.Status != once.StatusSucceeded {
					t.Errorf("%s was answered done; the row is %q, %v", k, a.Status, err)
				}
			}
			acts, err := s.List(ctx, once.Filter{Limit: 1 << 20})
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range acts {
				if ran[string(a.Key)] != 1 || a.Status != once.StatusInFlight && a.Status != once.StatusSucceeded {
					t.Errorf("%s is %s; its effect ran %d times", a.Key, a.Status, ran[string(a.Key)])
				}
			}
			c, err := once.New(once.Config{Store: s})
			if err != nil {
				t.Fatal(err)
			}
			for i := range 20 {
				if _, err := once.Do(ctx, c, once.Intent{Run: "after", Step: int64(i), Kind: "send_email"},
					func(context.Context, once.Attempt) (string, error) { return "sent", nil }); err != nil {
					t.Errorf("after freeing space: %v", err)
				}
			}
			t.Logf("worker: %d effects, %d answered done, %d disk-full errors; %d rows in the file", len(ran), len(ok), full, len(acts))
		})
	}
}

// TestDiskFullOpenSaysTheDiskIsFull: a process that opens an existing
// database, which no process has open, on a full disk is refused: SQLite
// cannot size the -shm file (SQLITE_IOERR_SHMSIZE, "disk I/O error
// (4874)"). The error says the disk is full, and does not send a worker
// restarted there to look at the directory, as Open's hint for every
// SQLITE_IOERR did ("does the directory exist and is it writable?").
func TestDiskFullOpenSaysTheDiskIsFull(t *testing.T) {
	_, path, _ := closedOnFullDisk(t)
	s, err := sqlite.Open(path, sqlite.Config{})
	if err == nil {
		s.Close()
		t.Fatal("Open succeeded on the full disk: nothing to check")
	}
	t.Logf("Open on the full disk: %v", err)
	if strings.Contains(err.Error(), "does the directory exist") {
		t.Errorf("Open on a full disk asks whether the directory exists and is writable, which it does and is: %v", err)
	}
	if msg := strings.ReplaceAll(err.Error(), path, "PATH"); !strings.Contains(msg, "full") && !strings.Contains(msg, "space") {
		t.Errorf("Open on a full disk does not say the disk is full: %v", err)
	}
}

// TestDiskFullFailedOpenBlindsReaders: on a full disk, a read-only store
// (the console, `once list`) reads a database no process has open, as
// immutable, needing no -shm file; and it still does after a writer's
// Open failed there (see TestDiskFullOpenSaysTheDiskIsFull). That Open
// leaves an empty -wal file behind, and a -shm of 3 bytes; a read-only
// store that saw the -wal read through the -shm, which cannot be sized
// on the full disk, and failed too: what a reader could read before, it
// could not after.
func TestDiskFullFailedOpenBlindsReaders(t *testing.T) {
	_, path, key := closedOnFullDisk(t)
	ro, err := sqlite.Open(path, sqlite.Config{ReadOnly: true})
	if err != nil {
		t.Fatalf("read-only Open on the full disk, before a writer tried: %v", err)
	}
	ro.Close()
	if s, err := sqlite.Open(path, sqlite.Config{}); err == nil {
		s.Close()
		t.Fatal("Open succeeded on the full disk: nothing to check")
	}
	if _, err := os.Stat(path + "-wal"); err == nil {
		t.Logf("the failed Open left %s-wal behind", path)
	}
	ro, err = sqlite.Open(path, sqlite.Config{ReadOnly: true})
	if err != nil {
		t.Fatalf("read-only Open on the full disk, after a writer's Open failed there: %v", err)
	}
	defer ro.Close()
	if a, err := ro.Get(context.Background(), key); err != nil || a.Status != once.StatusSucceeded || string(a.Result) != `"msg-1"` {
		t.Fatalf("read-only Get of the stored action: %s, result %s, %v; want succeeded with its result", a.Status, a.Result, err)
	}
}

// lockOnRetry is a log handler that, at the client's first "retrying" of
// an outcome, takes the database's write lock from a connection of its
// own and keeps it: every later try of that outcome waits behind it
// until its time runs out.
type lockOnRetry struct {
	path string
	mu   sync.Mutex
	db   *sql.DB
	held *sql.Tx
	err  error
}

func (h *lockOnRetry) Enabled(context.Context, slog.Level) bool { return true }
func (h *lockOnRetry) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *lockOnRetry) WithGroup(string) slog.Handler            { return h }

func (h *lockOnRetry) Handle(_ context.Context, r slog.Record) error {
	if !strings.Contains(r.Message, "recording outcome failed; retrying") {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.held != nil || h.err != nil {
		return nil
	}
	h.db, h.err = sql.Open("sqlite", h.path+"?_txlock=immediate&_pragma=busy_timeout(5000)")
	if h.err == nil {
		h.held, h.err = h.db.Begin()
	}
	return nil
}

// release lets the lock go and closes the connection.
func (h *lockOnRetry) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.held != nil {
		h.held.Rollback()
	}
	if h.db != nil {
		h.db.Close()
	}
}

// TestDiskFullUnrecordedOutcomeSaysWhy: an outcome whose first try meets
// a full disk, and whose later tries wait behind another connection's
// write lock until RecordTimeout, is reported not recorded with the
// reason it was not: the full disk, and not only the last try's
// "context deadline exceeded", which said nothing of why.
func TestDiskFullUnrecordedOutcomeSaysWhy(t *testing.T) {
	dir := testdb.SmallDisk(t, "4M")
	path := filepath.Join(dir, "once.db")
	s, err := sqlite.Open(path, sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	// An empty -wal: the outcome's write needs room the disk does not
	// have, not room the -wal held from before.
	if _, err := s.DB().Exec(`PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		t.Fatal(err)
	}
	h := &lockOnRetry{path: path}
	defer h.release()
	c, err := once.New(once.Config{Store: s, RecordTimeout: time.Second, Logger: slog.New(h)})
	if err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(dir, "filler")
	_, err = once.Do(context.Background(), c, once.Intent{Run: "why", Kind: "send_email", Target: "ada@example.com"},
		func(context.Context, once.Attempt) (string, error) {
			testdb.FillDisk(t, filler)
			return "sent", nil
		})
	h.mu.Lock()
	held, herr := h.held != nil, h.err
	h.mu.Unlock()
	if !held {
		t.Fatalf("the outcome's first try was not retried, or the lock not taken (%v); Do: %v", herr, err)
	}
	if !errors.Is(err, once.ErrNotRecorded) {
		t.Fatalf("Do = %v, want ErrNotRecorded", err)
	}
	t.Logf("Do: %v", err)
	if !isFull(err) {
		t.Errorf("the outcome was not recorded because the disk was full, and the error does not say so: %v", err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("the last try waited out its time, and the error does not say so: %v", err)
	}
}
