package smtpsend_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/smtpsend"
	"github.com/oncehq/once/sqlite"
)

// The environment that makes the test binary a worker process: the
// SQLite file, then the SMTP server's address.
const (
	workerDB   = "SMTPSEND_TEST_WORKER_DB"
	workerAddr = "SMTPSEND_TEST_WORKER_ADDR"
)

func TestMain(m *testing.M) {
	if db := os.Getenv(workerDB); db != "" {
		os.Exit(worker(db, os.Getenv(workerAddr)))
	}
	os.Exit(m.Run())
}

// workerLease is the lease of the worker the test kills: short, so the
// test waits little for it to lapse.
const workerLease = time.Second

func workerConfig(store once.Store) once.Config {
	return once.Config{Store: store, Kinds: map[string]once.KindPolicy{welcome.Kind: {Lease: workerLease}}}
}

// worker sends the welcome email through once.Do, as a job would, and
// exits; the test kills it before the server answers.
func worker(db, addr string) int {
	ctx := context.Background()
	store, err := sqlite.Open(db, sqlite.Config{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer store.Close()
	c, err := once.New(workerConfig(store))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	s := &smtpsend.Sender{Addr: addr, Timeout: time.Minute}
	_, err = once.Do(ctx, c, welcome, func(ctx context.Context, a once.Attempt) (string, error) {
		return s.Send(ctx, a, message())
	})
	fmt.Fprintln(os.Stderr, "Do:", err)
	return 0
}

// A worker killed (SIGKILL) after the message was sent and before the
// server's reply leaves only a lapsed lease behind. The review item
// recovery makes of it names the Message-ID to search the server's log
// for, not only "its lease expired" and a key.
func TestKilledWorkerReviewNamesMessageID(t *testing.T) {
	srv := startServer(t)
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	read := make(chan struct{}, 1)
	srv.setFailure(failure{hang: hang, read: read})

	db := filepath.Join(t.TempDir(), "once.db")
	store, err := sqlite.Open(db, sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	ctx := context.Background()
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := once.New(workerConfig(store))
	if err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), workerDB+"="+db, workerAddr+"="+srv.addr())
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-read:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("the worker's message never reached the server:\n%s", out.String())
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()

	key, _, err := once.KeyOf(welcome)
	if err != nil {
		t.Fatal(err)
	}
	id := smtpsend.MessageID(key, "")
	// While the claim stands, the action says what it is sending.
	a, err := store.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if a.Status != once.StatusInFlight || !strings.Contains(a.Error, id) {
		t.Errorf("the killed worker's action is %s with %q, want in flight, naming Message-ID %s", a.Status, a.Error, id)
	}

	// The job is delivered again once the lease lapses: recovery puts
	// the action up for review and sends nothing.
	time.Sleep(time.Until(a.LeaseUntil))
	var re *once.ReviewError
	for deadline := time.Now().Add(60 * time.Second); ; {
		_, err = once.Do(ctx, c, welcome, func(context.Context, once.Attempt) (string, error) {
			t.Error("the email was sent again")
			return "", nil
		})
		if errors.As(err, &re) || !errors.Is(err, once.ErrInFlight) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if re == nil {
		t.Fatalf("redelivery: %v, want the action put up for review", err)
	}
	if !strings.Contains(re.Reason, "lease expired") || !strings.Contains(re.Reason, "Message-ID "+id) {
		t.Errorf("review reason %q, want it to say the lease expired and name Message-ID %s", re.Reason, id)
	}
	a, err = store.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if a.Status != once.StatusReview || !strings.Contains(a.Error, id) {
		t.Errorf("the stored review item is %s with %q, want review naming %s (once show and the console show it)", a.Status, a.Error, id)
	}
	if n := len(srv.messages()); n != 1 {
		t.Errorf("the server read %d messages, want 1", n)
	}
}
