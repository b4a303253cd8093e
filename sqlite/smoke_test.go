package sqlite_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/sqlite"
)

func open(t *testing.T, path string) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(path, sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestSmoke(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "once.db"))
	for range 2 {
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
	}
	c, err := once.New(once.Config{Store: s})
	if err != nil {
		t.Fatal(err)
	}
	in := once.Intent{Run: "run-1", Step: 0, Kind: "send_email", Target: "a@example.com", Payload: map[string]string{"body": "hi"}}
	var runs int
	send := func(ctx context.Context, a once.Attempt) (string, error) {
		runs++
		return "msg-" + strconv.Itoa(a.Number), nil
	}

	first, err := once.Do(ctx, c, in, send)
	if err != nil {
		t.Fatal(err)
	}
	second, err := once.Do(ctx, c, in, send)
	if err != nil {
		t.Fatal(err)
	}
	if runs != 1 {
		t.Errorf("effect ran %d times, want 1", runs)
	}
	if first.Replayed || !second.Replayed {
		t.Errorf("Replayed = %v, %v; want false, true", first.Replayed, second.Replayed)
	}
	if second.Value != "msg-1" || second.Key != first.Key {
		t.Errorf("replayed %q for %s, want %q for %s", second.Value, second.Key, "msg-1", first.Key)
	}
	a, err := s.Get(ctx, first.Key)
	if err != nil {
		t.Fatal(err)
	}
	if a.Status != once.StatusSucceeded || a.Attempt != 1 || string(a.Result) != `"msg-1"` || a.CompletedAt.IsZero() || !a.LeaseUntil.IsZero() {
		t.Errorf("stored action = %+v", a)
	}
	if _, err := s.Get(ctx, "nope"); !errors.Is(err, once.ErrNotFound) {
		t.Errorf("Get of a missing key: %v, want ErrNotFound", err)
	}
}

func TestOpenNamesThePath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "once.db")
	_, err := sqlite.Open(path, sqlite.Config{})
	if err == nil || !strings.Contains(err.Error(), "sqlite store at "+path) || !strings.Contains(err.Error(), "writable") {
		t.Fatalf("Open in a missing directory: %v", err)
	}
}

// raceEnv, when set, makes the test binary a worker of TestProcessesRace:
// it opens the database at its value and claims the shared keys.
const raceEnv = "ONCE_SQLITE_RACE_DB"

const raceKeys, raceGoroutines = 24, 4

// TestProcessesRace starts several processes on one new file: they open
// it, switch it to WAL and migrate it together, then race Do for the same
// keys. Each key's effect must run exactly once across them all, and no
// call may fail other than by meeting a claim in flight: no "database is
// locked". Workers print a RAN line per effect they run.
func TestProcessesRace(t *testing.T) {
	if path := os.Getenv(raceEnv); path != "" {
		raceWorker(t, path)
		return
	}
	if testing.Short() {
		t.Skip("starts processes")
	}
	path := filepath.Join(t.TempDir(), "once.db")
	const procs = 4
	var wg sync.WaitGroup
	outs := make([]string, procs)
	errs := make([]error, procs)
	for i := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(os.Args[0], "-test.run=^TestProcessesRace$", "-test.v")
			cmd.Env = append(os.Environ(), raceEnv+"="+path)
			out, err := cmd.CombinedOutput()
			outs[i], errs[i] = string(out), err
		}()
	}
	wg.Wait()
	ran := map[string]int{}
	for i := range procs {
		if errs[i] != nil {
			t.Fatalf("worker %d: %v\n%s", i, errs[i], outs[i])
		}
		sc := bufio.NewScanner(strings.NewReader(outs[i]))
		for sc.Scan() {
			if k, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "RAN "); ok {
				ran[k]++
			}
		}
	}
	s := open(t, path)
	acts, err := s.List(context.Background(), once.Filter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if len(acts) != raceKeys {
		t.Errorf("%d actions stored, want %d", len(acts), raceKeys)
	}
	for _, a := range acts {
		if a.Status != once.StatusSucceeded || a.Attempt != 1 {
			t.Errorf("action %s: status %s attempt %d", a.Key, a.Status, a.Attempt)
		}
		if ran[string(a.Key)] != 1 {
			t.Errorf("action %s ran %d times", a.Key, ran[string(a.Key)])
		}
	}
}

func raceWorker(t *testing.T, path string) {
	ctx := context.Background()
	s := open(t, path)
	// Every worker migrates at once, as several processes starting
	// together would.
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := once.New(once.Config{Store: s})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := range raceGoroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range raceKeys {
				// Each goroutine walks the keys from a different place so
				// that claims collide throughout.
				k := (i + g*raceKeys/raceGoroutines) % raceKeys
				in := once.Intent{Run: "race", Step: int64(k), Kind: "effect"}
				for {
					start := time.Now()
					_, err := once.Do(ctx, c, in, func(ctx context.Context, a once.Attempt) (int, error) {
						mu.Lock()
						fmt.Printf("RAN %s\n", a.Key)
						mu.Unlock()
						return k, nil
					})
					if errors.Is(err, once.ErrInFlight) {
						// Another process is running it: come back, as a
						// job returned to its queue would.
						time.Sleep(time.Millisecond)
						continue
					}
					if err != nil {
						t.Errorf("step %d after %v: %v", k, time.Since(start), err)
					}
					break
				}
			}
		}()
	}
	wg.Wait()
}
