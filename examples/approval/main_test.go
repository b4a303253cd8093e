package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/dburl"
	"github.com/oncehq/once/internal/testdb"
)

// The tests run the example as users do: built into a binary, run as a
// process on a real store (a SQLite file, and PostgreSQL when it is
// reachable), killed with SIGKILL and run again.

var (
	binDir   string
	buildMu  sync.Mutex
	built    string
	buildErr error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "approval-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// binary builds the example once per test binary and returns its path.
func binary(t *testing.T) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if built == "" && buildErr == nil {
		out := filepath.Join(binDir, "approval")
		if b, err := exec.Command("go", "build", "-o", out, ".").CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, b)
		} else {
			built = out
		}
	}
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return built
}

// eachStore runs fn against a new SQLite file and a new PostgreSQL
// schema, in parallel. fn gets the --db URL.
func eachStore(t *testing.T, fn func(t *testing.T, db string)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		fn(t, filepath.Join(t.TempDir(), "approval.db"))
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		fn(t, postgresDB(t))
	})
}

// postgresDB returns a URL whose tables go to a schema of their own,
// dropped when the test ends, with a small pool: the server is shared.
func postgresDB(t *testing.T) string {
	t.Helper()
	base := testdb.RequirePostgres(t)
	var b [6]byte
	rand.Read(b[:])
	schema := "approval_" + hex.EncodeToString(b[:])
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("once_schema", schema)
	q.Set("pool_max_conns", "3")
	u.RawQuery = q.Encode()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := testdb.RetryTooManyClients(ctx, func() (*pgx.Conn, error) { return pgx.Connect(ctx, base) })
		if err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	return u.String()
}

// runStory runs the example to its end and returns what it printed.
func runStory(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, binary(t), args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("approval %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// lines checks that out holds a line matching each pattern, in order.
func lines(t *testing.T, out string, patterns ...string) {
	t.Helper()
	rest := out
	for _, p := range patterns {
		loc := regexp.MustCompile(`(?m)^` + p + `$`).FindStringIndex(rest)
		if loc == nil {
			t.Fatalf("no line matching %q after the ones before it in:\n%s", p, out)
		}
		rest = rest[loc[1]:]
	}
}

// actions opens the store as an operator's tool does and returns the
// charge actions by payment.
func actions(t *testing.T, db string) map[string]once.Action {
	t.Helper()
	ctx := context.Background()
	store, err := dburl.Open(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	c, err := once.New(once.Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	acts, err := c.List(ctx, once.Filter{Kind: "charge"})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]once.Action{}
	for _, a := range acts {
		out[a.Run] = a
	}
	return out
}

// TestStory runs the example on a new store: the payment under the limit
// is charged at once; the one over it waits, is approved by ada (a second
// approval refused), and is charged once; the one rejected is never
// charged, and its later deliveries are told why. Run again, everything
// replays and nobody is asked.
func TestStory(t *testing.T) {
	eachStore(t, func(t *testing.T, db string) {
		out := runStory(t, "--db", db)
		lines(t, out,
			`pay-1 delivery 1: charged pay-1 \(120\.00 EUR to cus_ada\) as ch_\w+; ack`,
			`pay-1 delivery 3: replayed ch_\w+; ack`,
			`  approvers asked about pay-2, until .*`,
			`pay-2 delivery 1: awaits approval, nothing charged; retry after 1m0s`,
			`  ada approves pay-2 \(2500\.00 EUR to cus_grace\)`,
			`  grace approves it too: once: approve refused: action \w+ was approved by ada at .*`,
			`pay-2 delivery 2: charged pay-2 \(2500\.00 EUR to cus_grace\) as ch_\w+; ack`,
			`pay-2 delivery 3: replayed ch_\w+; ack`,
			`  approvers asked about pay-3, until .*`,
			`pay-3 delivery 1: awaits approval, nothing charged; retry after 1m0s`,
			`  grace rejects pay-3 .*: over the customer's credit line`,
			`pay-3 delivery 2: not charged: rejected by grace: over the customer's credit line; ack`,
			`pay-3 delivery 3: not charged: rejected by grace: over the customer's credit line; ack`,
			`charges made: 2`,
		)
		if n := strings.Count(out, "approvers asked"); n != 2 {
			t.Errorf("the approvers were asked %d times; want once for each of the two payments over the limit", n)
		}
		acts := actions(t, db)
		if a := acts["pay-2"]; a.Status != once.StatusSucceeded || a.Attempt != 2 || a.ResolvedBy != "ada" {
			t.Errorf("pay-2 is %s at attempt %d, decided by %q; want succeeded at attempt 2, approved by ada", a.Status, a.Attempt, a.ResolvedBy)
		}
		if a := acts["pay-3"]; a.Status != once.StatusFailed || a.ResolvedBy != "grace" {
			t.Errorf("pay-3 is %s, decided by %q; want failed, rejected by grace", a.Status, a.ResolvedBy)
		}
		if a := acts["pay-1"]; a.Status != once.StatusSucceeded || a.Attempt != 1 || a.ResolvedBy != "" {
			t.Errorf("pay-1 is %s at attempt %d, decided by %q; want succeeded at once, asking nobody", a.Status, a.Attempt, a.ResolvedBy)
		}

		again := runStory(t, "--db", db)
		lines(t, again, `pay-2 delivery 1: replayed ch_\w+; ack`, `pay-3 delivery 1: not charged: rejected by grace: .*; ack`, `charges made: 0`)
		if strings.Contains(again, "approvers asked") || strings.Contains(again, "approves") {
			t.Errorf("run again, someone was asked or decided:\n%s", again)
		}
	})
}

// TestKilledBeforeTheDecision kills the example with SIGKILL after the
// approvers were told about pay-2 and before anyone decided. Run again,
// pay-2 is still in the approval queue: nobody is told a second time,
// ada approves it, and it is charged once.
func TestKilledBeforeTheDecision(t *testing.T) {
	eachStore(t, func(t *testing.T, db string) {
		cmd := exec.Command(binary(t), "--db", db, "--hold-before-decide", "1m")
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		var first strings.Builder
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			first.WriteString(sc.Text() + "\n")
			if strings.HasPrefix(sc.Text(), "  holding") {
				break
			}
		}
		if !strings.Contains(first.String(), "approvers asked about pay-2") {
			t.Fatalf("the example did not reach the hold after asking about pay-2:\n%s\nstderr:\n%s", first.String(), stderr.String())
		}
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		go io.Copy(io.Discard, stdout)
		cmd.Wait()
		if a := actions(t, db)["pay-2"]; a.Status != once.StatusAwaitingApproval || a.Attempt != 1 {
			t.Fatalf("after the kill pay-2 is %s at attempt %d; want awaiting approval at attempt 1", a.Status, a.Attempt)
		}

		again := runStory(t, "--db", db)
		lines(t, again,
			`pay-1 delivery 1: replayed ch_\w+; ack`,
			`pay-2 delivery 1: awaits approval, nothing charged; retry after 1m0s`,
			`  ada approves pay-2 .*`,
			`pay-2 delivery 2: charged pay-2 .* as ch_\w+; ack`,
			`charges made: 1`,
		)
		if strings.Contains(again, "approvers asked about pay-2") {
			t.Errorf("the approvers were told about pay-2 a second time:\n%s", again)
		}
		if a := actions(t, db)["pay-2"]; a.Status != once.StatusSucceeded || a.Attempt != 2 {
			t.Errorf("pay-2 is %s at attempt %d; want succeeded at attempt 2", a.Status, a.Attempt)
		}
	})
}

// TestFlags: a bad flag is a usage error, exit 2, saying what is wrong.
func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"--limit", "-1"}, "--limit -1"},
		{[]string{"--hold-before-decide", "-1s"}, "must not be negative"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"--nope"}, "flag provided but not defined"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), tc.args, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), tc.says) {
			t.Errorf("approval %v: exit %d, %q; want 2, saying %q", tc.args, code, stderr.String(), tc.says)
		}
	}
}
