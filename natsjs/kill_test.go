package natsjs_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/brokertest/natstest"
	"github.com/oncehq/once/natsjs"
	"github.com/oncehq/once/sqlite"
)

// The worker process TestWorkerKilled starts is this test binary, run
// again with these variables set.
const (
	envChild    = "ONCE_NATSJS_CHILD" // the effects file
	envDB       = "ONCE_NATSJS_DB"
	envNATS     = "ONCE_NATSJS_URL"
	envStream   = "ONCE_NATSJS_STREAM"
	envRecovery = "ONCE_NATSJS_RECOVERY"
	envPoison   = "ONCE_NATSJS_POISON" // run poisonChild instead
)

// childLease is the claim's lease in the worker process and the test
// alike: short, so the killed worker's claim lapses within the test.
const childLease = time.Second

// maybeChild runs the worker process and exits, when this process was
// started as one.
func maybeChild() {
	file := os.Getenv(envChild)
	if file == "" {
		return
	}
	run := child
	if os.Getenv(envPoison) != "" {
		run = poisonChild
	}
	if err := run(file); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// child consumes the test's stream with an effect that writes a line to
// file and then hangs until the process is killed.
func child(file string) error {
	ctx := context.Background()
	store, err := sqlite.Open(os.Getenv(envDB), sqlite.Config{})
	if err != nil {
		return err
	}
	defer store.Close()
	client, err := once.New(once.Config{Store: store, Kinds: kinds(once.ParseRecovery(os.Getenv(envRecovery)))})
	if err != nil {
		return err
	}
	nc, err := nats.Connect(os.Getenv(envNATS))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cons, err := js.Consumer(ctx, os.Getenv(envStream), "worker")
	if err != nil {
		return err
	}
	w, err := natsjs.New(js, natsjs.Config{})
	if err != nil {
		return err
	}
	return w.Consume(ctx, cons, func(ctx context.Context, msg jetstream.Msg) error {
		var j job
		if err := json.Unmarshal(msg.Data(), &j); err != nil {
			return once.Permanent(err)
		}
		_, err := once.Do(ctx, client, j.intent(), func(ctx context.Context, a once.Attempt) (string, error) {
			if err := appendLine(file, fmt.Sprintf("%d %s", a.Number, a.ProviderKey)); err != nil {
				return "", once.RetryLater(err)
			}
			select {} // the call is out; the process dies before the reply
		})
		return err
	})
}

func kinds(r once.Recovery) map[string]once.KindPolicy {
	return map[string]once.KindPolicy{"charge": {Lease: childLease, Recovery: r}}
}

func appendLine(file, line string) error {
	f, err := os.OpenFile(file, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintln(f, line); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// effectLines reads what the worker process's effect wrote.
func effectLines(t *testing.T, file string) []string {
	t.Helper()
	f, err := os.Open(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return lines
}

// TestWorkerKilled kills a worker process (SIGKILL) while its effect
// runs: its InProgress signals stop, the message comes back after
// AckWait to a worker in this process, whose Do meets the dead claim,
// waits out its lease (a retry after it) and applies the kind's
// recovery.
func TestWorkerKilled(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		recovery once.Recovery
		// settled is how the job ends in the surviving worker.
		settled once.JobAction
		status  once.Status
		effects int
	}{
		// Re-executed with the same provider key, and acked.
		{once.RetryWithProviderKey, once.JobAck, once.StatusSucceeded, 2},
		// Never re-executed: a person decides, the message is
		// terminated.
		{once.AskPerson, once.JobDrop, once.StatusReview, 1},
	} {
		t.Run(tc.recovery.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, jetstream.ConsumerConfig{AckWait: time.Second}, once.Config{Kinds: kinds(tc.recovery)})
			dir := t.TempDir()
			file := filepath.Join(dir, "effects")
			db := filepath.Join(dir, "worker.db")
			// The worker process and this test share the SQLite file.
			other, err := sqlite.Open(db, sqlite.Config{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { other.Close() })
			if err := other.Migrate(context.Background()); err != nil {
				t.Fatal(err)
			}
			client, err := once.New(once.Config{Store: other, Kinds: kinds(tc.recovery)})
			if err != nil {
				t.Fatal(err)
			}

			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), envChild+"="+file, envDB+"="+db, envNATS+"="+natstest.URL(),
				envStream+"="+b.stream, envRecovery+"="+tc.recovery.String())
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan struct{})
			go func() { cmd.Wait(); close(exited) }()
			t.Cleanup(func() {
				cmd.Process.Kill()
				<-exited
			})

			j := job{ID: "order-k", Customer: "cus_k", Amount: 1}
			b.publish(t, j)
			waitFor(t, 20*time.Second, func() bool {
				select {
				case <-exited:
					t.Fatalf("the worker process exited early: %s", stderr.String())
				default:
				}
				return len(effectLines(t, file)) == 1
			}, "the worker process to start the effect")
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			<-exited

			// This process's worker takes over.
			consume(t, b.worker(t, natsjs.Config{}), b.cons, charge(client, b.log, func(_ context.Context, a once.Attempt) (string, error) {
				if err := appendLine(file, fmt.Sprintf("%d %s", a.Number, a.ProviderKey)); err != nil {
					return "", once.RetryLater(err)
				}
				return "ch_1", nil
			}))
			last := b.log.waitSettle(t, "the job settled", func(s settle) bool { return s.d.Action != once.JobRetry })
			i := b.settledAll(t, 1)
			if last.d.Action != tc.settled || errors.Is(last.err, natsjs.ErrNotSettled) {
				t.Fatalf("settled %v (%v); want %v", last.d.Action, last.err, tc.settled)
			}
			if i.Delivered.Consumer < 2 {
				t.Fatalf("%d deliveries; want the killed worker's and a redelivery", i.Delivered.Consumer)
			}
			lines := effectLines(t, file)
			if len(lines) != tc.effects {
				t.Fatalf("effects %q; want %d", lines, tc.effects)
			}
			for i, l := range lines {
				n, key, _ := strings.Cut(l, " ")
				first := strings.SplitN(lines[0], " ", 2)[1]
				if n != strconv.Itoa(i+1) || key != first {
					t.Fatalf("effects %q; want attempts 1, 2… with one provider key", lines)
				}
			}
			key, _, _ := once.KeyOf(j.intent())
			a, err := client.Get(context.Background(), key)
			if err != nil {
				t.Fatal(err)
			}
			if a.Status != tc.status {
				t.Fatalf("action %s; want %s", a.Status, tc.status)
			}
		})
	}
}
