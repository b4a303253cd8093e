package chaos_test

import (
	"context"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/oncehq/once/internal/brokertest/natstest"
	"github.com/oncehq/once/internal/brokertest/rabbitmqtest"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/lab/chaos"
	"github.com/oncehq/once/lab/mailbox"
)

func TestMain(m *testing.M) {
	// The workers are this test binary, started again.
	if chaos.IsWorker() {
		os.Exit(chaos.WorkerMain(os.Stderr))
	}
	os.Exit(m.Run())
}

// intents is the size of the tests' runs: ONCE_CHAOS_INTENTS overrides
// it, for a longer run by hand.
func intents(t *testing.T, def int) int {
	if s := os.Getenv("ONCE_CHAOS_INTENTS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("ONCE_CHAOS_INTENTS=%q: %v", s, err)
		}
		return n
	}
	return def
}

// run runs the harness and logs its report.
func run(t *testing.T, opts chaos.Options) chaos.Report {
	t.Helper()
	opts.DB = testdb.RequirePostgres(t)
	if os.Getenv("ONCE_CHAOS_TRACE") != "" {
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		last := time.Now()
		opts.Progress = func(p chaos.Progress) {
			if time.Since(last) > 2*time.Second {
				last = time.Now()
				t.Logf("%s %d/%d %s", p.Phase, p.Settled, p.Total, p.Line())
			}
		}
	}
	rep, err := chaos.Run(context.Background(), opts)
	if err != nil {
		t.Fatalf("chaos run (%s, naive %v) could not be carried out: %v", opts.Queue, opts.Naive, err)
	}
	var b strings.Builder
	rep.WriteText(&b)
	t.Logf("\n%s", b.String())
	return rep
}

// testChaos runs a short chaos run through once, then the same workload
// with the naive workers, on one queue.
func testChaos(t *testing.T, queue string, crash bool) {
	n := intents(t, 240)
	rep := run(t, chaos.Options{Queue: queue, Intents: n, Workers: 3, Concurrency: 4, FaultScale: 4, CrashBroker: crash, Timeout: 150 * time.Second})
	if !rep.OK() {
		t.Errorf("once under faults: invariants failed (reproduce with seed %d): %s", rep.Seed, strings.Join(rep.Failures, "; "))
	}
	if rep.Duplicates != 0 || rep.Lost != 0 {
		t.Errorf("once under faults: %d duplicates, %d lost; want none", rep.Duplicates, rep.Lost)
	}
	f := rep.Faults
	for name, c := range map[string]int{"kill": f.Kill, "stop": f.Stop, "conn": f.Conn, "proxy": f.Proxy, "provider_timeout": f.ProviderTimeout, "broker": f.Broker} {
		if c == 0 {
			t.Errorf("no %s fault happened; the run proves nothing about it", name)
		}
	}
	total := f.Kill + f.Stop + f.Conn + f.Proxy + f.ProviderTimeout + f.Broker
	if total < 24 {
		t.Errorf("%d faults in all; want dozens", total)
	}
	if rep.Review == 0 {
		t.Error("nothing was surfaced for review: the planned kills and withheld replies of emails should have put some there")
	}

	naive := run(t, chaos.Options{Queue: queue, Intents: n / 2, Workers: 3, Concurrency: 4, FaultScale: 4, CrashBroker: crash, Naive: true, Timeout: 120 * time.Second})
	if naive.Duplicates == 0 {
		t.Errorf("the naive workers applied no intent twice under the same faults; the harness cannot see a duplicate")
	}
}

// TestChaosNATS restarts the broker by SIGKILL: JetStream's file store
// keeps every message and the consumer's state across a crash.
func TestChaosNATS(t *testing.T) {
	natstest.Require(t)
	testChaos(t, chaos.QueueNATS, true)
}

// TestChaosRabbitMQ restarts the broker cleanly (SIGTERM). A crash of a
// RabbitMQ node loses the jobs its retry queues dead-lettered in the
// moments before it (classic queues dead-letter at most once), and a
// job whose claim never reached the ledger is then lost for good:
// docs/chaos.md has the reproduction.
func TestChaosRabbitMQ(t *testing.T) {
	rabbitmqtest.Require(t)
	testChaos(t, chaos.QueueRabbitMQ, false)
}

// TestChaosOutsideSMTP sends the emails to an SMTP server the harness
// does not own (--smtp), where only the tap's count of the server's 250s
// tells what was delivered: it must agree with what the server holds.
func TestChaosOutsideSMTP(t *testing.T) {
	natstest.Require(t)
	mail, err := mailbox.Start(mailbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer mail.Close()
	rep := run(t, chaos.Options{Queue: chaos.QueueNATS, Intents: intents(t, 60), Workers: 2, FaultScale: 2, SMTP: mail.Addr(), Timeout: 90 * time.Second})
	if !rep.OK() {
		t.Errorf("invariants failed (seed %d): %s", rep.Seed, strings.Join(rep.Failures, "; "))
	}
	held := map[string]int{}
	for _, m := range mail.Messages() {
		for _, to := range m.To {
			held[to]++
		}
	}
	if got, want := len(held), rep.PerKind["send_email"].Intents; got != want {
		t.Errorf("the outside server holds mail for %d recipients; want one per email intent, %d", got, want)
	}
	for to, n := range held {
		if n != 1 {
			t.Errorf("the outside server holds %d copies for %s; the report counted %d duplicates", n, to, rep.Duplicates)
		}
	}
	if rep.PerKind["send_email"].Applied != len(mail.Messages()) {
		t.Errorf("the report counts %d emails applied, the server holds %d", rep.PerKind["send_email"].Applied, len(mail.Messages()))
	}
}
