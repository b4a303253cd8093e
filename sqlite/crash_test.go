package sqlite_test

import (
	"bufio"
	"context"
	"fmt"
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
	"github.com/oncehq/once/sqlite"
)

// envGroupChild names the file a group commit worker process writes to.
const envGroupChild = "ONCE_SQLITE_GROUP_CHILD"

// maybeGroupChild plays the worker of TestGroupCommitKilledProcessKeepsWhatItAnswered
// when the test binary is started as one.
func maybeGroupChild() {
	path := os.Getenv(envGroupChild)
	if path == "" {
		return
	}
	if err := groupChild(path); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// groupChild claims and records new keys from 16 goroutines until it is
// killed, saying on its standard output what each write was answered:
// "claimed KEY" and "succeeded KEY", and "batch N" for each of group
// commit's transactions of more than one write.
func groupChild(path string) error {
	s, err := sqlite.Open(path, sqlite.Config{})
	if err != nil {
		return err
	}
	var out sync.Mutex
	say := func(format string, args ...any) {
		out.Lock()
		defer out.Unlock()
		fmt.Printf(format+"\n", args...)
	}
	sqlite.SetBeforeBatch(s, func(n int) {
		if n > 1 {
			say("batch %d", n)
		}
	})
	ctx := context.Background()
	var next atomic.Int64
	errs := make(chan error, 16)
	for range 16 {
		go func() {
			for {
				k := fmt.Sprintf("k%06d", next.Add(1))
				req := newClaim(k)
				res, err := s.Claim(ctx, req)
				if err != nil {
					errs <- err
					return
				}
				if !res.Claimed {
					errs <- fmt.Errorf("%s: a new key was not claimed", k)
					return
				}
				say("claimed %s", k)
				ok, err := s.Transition(ctx, once.Transition{Key: req.Key, Attempt: 1, From: []once.Status{once.StatusInFlight},
					To: once.StatusSucceeded, Result: []byte(`"sent"`)})
				if err != nil || !ok {
					errs <- fmt.Errorf("%s: outcome %v, %v", k, ok, err)
					return
				}
				say("succeeded %s", k)
			}
		}()
	}
	return <-errs
}

// TestGroupCommitKilledProcessKeepsWhatItAnswered: a worker process
// whose claims and outcomes go through group commit is killed (SIGKILL)
// while it writes. Every write it was answered as done is in the file:
// a transaction's writes are answered only once it committed, and a
// transaction cut short leaves none of its writes.
func TestGroupCommitKilledProcessKeepsWhatItAnswered(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "once.db")
	s, err := sqlite.Open(path, sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envGroupChild+"="+path)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	claimed, succeeded := map[string]bool{}, map[string]bool{}
	batches := 0
	lines := bufio.NewScanner(stdout)
	deadline := time.AfterFunc(60*time.Second, func() { cmd.Process.Kill() })
	defer deadline.Stop()
	read := func(line string) {
		word, arg, _ := strings.Cut(line, " ")
		switch word {
		case "claimed":
			claimed[arg] = true
		case "succeeded":
			succeeded[arg] = true
		case "batch":
			batches++
		}
	}
	for lines.Scan() {
		read(lines.Text())
		if len(succeeded) == 400 {
			// Killed in the middle of its writes: sixteen goroutines
			// have claims and outcomes queued or in a transaction.
			cmd.Process.Signal(syscall.SIGKILL)
			break
		}
	}
	for lines.Scan() {
		// Answers given before the kill, still in the pipe.
		read(lines.Text())
	}
	cmd.Wait()
	if len(succeeded) < 400 {
		t.Fatalf("the worker stopped after %d outcomes: %s", len(succeeded), stderr.String())
	}
	if batches == 0 {
		t.Fatal("no transaction carried more than one write: group commit was not exercised")
	}
	for k := range claimed {
		a, err := s.Get(ctx, once.Key(k))
		if err != nil {
			t.Fatalf("%s was answered claimed and is not in the file: %v", k, err)
		}
		if succeeded[k] && a.Status != once.StatusSucceeded {
			t.Fatalf("%s was answered succeeded and is %s in the file", k, a.Status)
		}
	}
	acts, err := s.List(ctx, once.Filter{Limit: 100000})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range acts {
		if a.Status != once.StatusInFlight && a.Status != once.StatusSucceeded {
			t.Fatalf("%s is %s after the kill", a.Key, a.Status)
		}
		if a.Status == once.StatusSucceeded && (len(a.Result) == 0 || a.Attempt != 1) {
			t.Fatalf("%s succeeded with result %q at attempt %d", a.Key, a.Result, a.Attempt)
		}
	}
	t.Logf("%d claims and %d outcomes answered before the kill, %d in the file, %d transactions of more than one write", len(claimed), len(succeeded), len(acts), batches)
}
