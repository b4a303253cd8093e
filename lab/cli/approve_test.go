package cli_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncehq/once"
)

// gatedConfig makes every charge_card wait for approval, expiring after
// expiry.
func gatedConfig(expiry time.Duration) once.Config {
	return once.Config{Kinds: map[string]once.KindPolicy{"charge_card": {Approval: once.ApprovalPolicy{Always: true, Expiry: expiry}}}}
}

// charge is a charge_card intent of run, step.
func charge(run string, step int64, payload any) once.Intent {
	return once.Intent{Run: run, Step: step, Kind: "charge_card", Target: "acct-" + run, Payload: payload}
}

// awaitApproval claims in under a gate expiring after expiry and fails
// unless the action now waits for approval; it returns the row.
func awaitApproval(t *testing.T, db string, expiry time.Duration, in once.Intent) once.Action {
	t.Helper()
	var a once.Action
	withClient(t, db, gatedConfig(expiry), func(c *once.Client, _ once.Store) {
		ctx := context.Background()
		_, err := once.Do(ctx, c, in, func(context.Context, once.Attempt) (string, error) { return "charged", nil })
		if !errors.Is(err, once.ErrAwaitingApproval) {
			t.Fatalf("Do of a gated kind = %v; want it to await approval", err)
		}
		k, _, _ := once.KeyOf(in)
		if a, err = c.Get(ctx, k); err != nil {
			t.Fatal(err)
		}
	})
	return a
}

// TestApproveReject: `once approve` and `once reject` decide actions
// awaiting approval; `once ls` lists them by their new statuses, with
// when the wait expires; a second decision is refused, naming who
// decided; and the approved action then runs, once, at its next
// delivery.
func TestApproveReject(t *testing.T) {
	for name, newDB := range databases(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := newDB(t)
			mustRun(t, "migrate", "--db", db)
			pay := charge("run-a", 0, map[string]int{"cents": 250_000})
			paid := awaitApproval(t, db, time.Hour, pay)
			denied := awaitApproval(t, db, time.Hour, charge("run-b", 0, map[string]int{"cents": 900_000}))

			out := mustRun(t, "ls", "--status", "awaiting_approval", "--db", db)
			for _, want := range []string{string(paid.Key)[:12], string(denied.Key)[:12], "awaiting_approval", "awaits approval until", "(in 59m"} {
				if !strings.Contains(out, want) {
					t.Errorf("ls --status awaiting_approval lacks %q:\n%s", want, out)
				}
			}
			if out := mustRun(t, "show", string(paid.Key), "--db", db); !strings.Contains(out, "expires") || !strings.Contains(out, "unanswered, it becomes failed") || strings.Contains(out, "lease until") {
				t.Errorf("show of an awaiting action does not say when it expires:\n%s", out)
			}

			out = mustRun(t, "approve", string(paid.Key)[:12], "--by", "ada", "--note", "limit checked with finance", "--db", db)
			if !strings.Contains(out, string(paid.Key)+" is now approved (approved by ada)") {
				t.Fatalf("approve said %q", out)
			}
			var rows []map[string]any
			if err := json.Unmarshal([]byte(mustRun(t, "ls", "--status", "approved", "--json", "--db", db)), &rows); err != nil || len(rows) != 1 || rows[0]["key"] != string(paid.Key) || rows[0]["resolved_by"] != "ada" {
				t.Fatalf("ls --status approved --json = %v, %v", rows, err)
			}
			if out := mustRun(t, "ls", "--status", "approved", "--db", db); !strings.Contains(out, "approved by ada") {
				t.Errorf("ls --status approved does not say who approved:\n%s", out)
			}
			for _, again := range [][]string{
				{"approve", string(paid.Key), "--by", "grace"},
				{"reject", string(paid.Key), "--by", "grace", "--note", "too much"},
			} {
				code, _, errOut := run(t, append(again, "--db", db)...)
				if code != 1 || !strings.Contains(errOut, "refused") || !strings.Contains(errOut, "approved by ada") {
					t.Errorf("once %s after ada approved: exit %d, %q; want a refusal naming ada", again[0], code, errOut)
				}
			}

			out = mustRun(t, "reject", string(denied.Key), "--by", "grace", "--note", "not this customer", "--db", db)
			if !strings.Contains(out, string(denied.Key)+" is now failed (rejected by grace)") {
				t.Fatalf("reject said %q", out)
			}
			if code, _, errOut := run(t, "approve", string(denied.Key), "--by", "ada", "--db", db); code != 1 || !strings.Contains(errOut, "rejected by grace") || !strings.Contains(errOut, "not this customer") {
				t.Errorf("approve after grace rejected: exit %d, %q; want a refusal naming grace and her note", code, errOut)
			}
			if out := mustRun(t, "show", string(paid.Key), "--db", db); !strings.Contains(out, "approved via cli: limit checked with finance") {
				t.Errorf("the trail does not say ada approved through the command:\n%s", out)
			}

			// An attempt the person did not look at is not decided.
			stale := awaitApproval(t, db, time.Hour, charge("run-c", 0, nil))
			if code, _, errOut := run(t, "approve", string(stale.Key), "--by", "ada", "--attempt", "2", "--db", db); code != 1 || !strings.Contains(errOut, "decided on attempt 2") {
				t.Errorf("approve --attempt 2 of attempt 1: exit %d, %q", code, errOut)
			}

			// Approved, it runs at the next delivery, and only then.
			withClient(t, db, gatedConfig(time.Hour), func(c *once.Client, _ once.Store) {
				runs := 0
				for range 2 {
					got, err := once.Do(context.Background(), c, pay, func(context.Context, once.Attempt) (string, error) { runs++; return "charged", nil })
					if err != nil || got.Value != "charged" {
						t.Fatalf("the approved action's delivery: %q, %v", got.Value, err)
					}
				}
				if runs != 1 {
					t.Fatalf("the approved action ran %d times in two deliveries", runs)
				}
			})
		})
	}
}

// TestApproveRacing: four people run `once approve` on one action at
// once: one applies, and each of the others is refused with the name of
// the one who did.
func TestApproveRacing(t *testing.T) {
	for name, newDB := range databases(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := newDB(t)
			mustRun(t, "migrate", "--db", db)
			a := awaitApproval(t, db, time.Hour, charge("run-race", 0, nil))
			people := []string{"ada", "grace", "edsger", "barbara"}
			codes, errs := make([]int, len(people)), make([]string, len(people))
			var wg sync.WaitGroup
			for i, who := range people {
				wg.Go(func() { codes[i], _, errs[i] = run(t, "approve", string(a.Key), "--by", who, "--db", db) })
			}
			wg.Wait()
			winner := ""
			for i, who := range people {
				if codes[i] == 0 {
					if winner != "" {
						t.Fatalf("both %s and %s approved the action", winner, who)
					}
					winner = who
				}
			}
			if winner == "" {
				t.Fatalf("nobody's approval applied: %q", errs)
			}
			for i, who := range people {
				if who != winner && (codes[i] != 1 || !strings.Contains(errs[i], "approved by "+winner)) {
					t.Errorf("%s, who lost to %s: exit %d, %q; want a refusal naming %s", who, winner, codes[i], errs[i], winner)
				}
			}
		})
	}
}

// TestApproveAfterExpiry: once the wait expired (by the database's
// clock), `once approve` and `once reject` are refused, saying so, and
// `once ls` says it expired.
func TestApproveAfterExpiry(t *testing.T) {
	for name, newDB := range databases(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := newDB(t)
			mustRun(t, "migrate", "--db", db)
			a := awaitApproval(t, db, time.Second, charge("run-late", 0, nil))
			// The database is on this machine: its clock passes the
			// expiry when this one does, give or take a little.
			time.Sleep(time.Until(a.LeaseUntil) + 200*time.Millisecond)
			for _, late := range [][]string{
				{"approve", string(a.Key), "--by", "ada"},
				{"reject", string(a.Key), "--by", "ada", "--note", "too late"},
			} {
				code, _, errOut := run(t, append(late, "--db", db)...)
				if code != 1 || !strings.Contains(errOut, "its wait expired") {
					t.Errorf("once %s after the expiry: exit %d, %q; want a refusal saying the wait expired", late[0], code, errOut)
				}
			}
			if out := mustRun(t, "ls", "--status", "awaiting_approval", "--db", db); !strings.Contains(out, "approval wait expired at") {
				t.Errorf("ls of an expired wait:\n%s", out)
			}
		})
	}
}

// TestApproveBadFlags: each mistake in `once approve` or `once reject`
// is one line saying what to give, before any I/O: the database named,
// which does not exist, is not created.
func TestApproveBadFlags(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.db")
	key := "abcdef0123456789"
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"approve", "--by", "ada"}, "give one key"},
		{[]string{"approve", key}, "--by is required"},
		{[]string{"approve", key, "--by", "  "}, "--by is empty; name who decides"},
		{[]string{"approve", key, "--by", strings.Repeat("x", 300)}, "--by is 300 bytes, over the limit of 255"},
		{[]string{"approve", key, "--by", "ada", "--note", strings.Repeat("n", 5000)}, "--note is 5000 bytes, over the limit of 4096"},
		{[]string{"approve", key, "--by", "ada", "--note", "a\x00b"}, "--note is not text"},
		{[]string{"approve", key, "--by", "a\xffb"}, "--by is not text"},
		{[]string{"approve", key, "--by", "ada", "--attempt", "-1"}, "--attempt -1 is not an attempt"},
		{[]string{"approve", key, "--by", "ada", "--fingerprint", "abc"}, `--fingerprint "abc" is not a fingerprint: 64 lowercase hex digits`},
		{[]string{"approve", key, "--by", "ada", "--fingerprint", strings.Repeat("AB", 32)}, "is not a fingerprint"},
		{[]string{"approve", key, "--by", "ada", "--fingerprint", strings.Repeat("a", 5000)}, "is not a fingerprint"},
		{[]string{"approve", key, "--by", "ada", "--since", "yesterday"}, `--since "yesterday" is not a time in RFC 3339`},
		{[]string{"approve", key, "--by", "ada", "--since", "2026-12-03T07:30:36"}, "is not a time in RFC 3339"},
		{[]string{"reject", key, "--by", "ada", "--note", "no", "--since", strings.Repeat("9", 100)}, "--since is 100 bytes, over the limit of 64"},
		{[]string{"approve", key, "--by", "ada", "--done"}, "flag provided but not defined"},
		{[]string{"reject", key, "--by", "ada"}, "--note is required"},
		{[]string{"reject", key, "--note", "no"}, "--by is required"},
		{[]string{"reject", key, "--by", "ada", "--note", " \t"}, "--note is empty; say why: every duplicate of the action is told it"},
	}
	for _, tc := range cases {
		code, out, errOut := run(t, append(tc.args, "--db", missing)...)
		if code == 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("once %q: exit %d, stderr %q, stdout %q; want an error containing %q", tc.args, code, errOut, out, tc.want)
		}
		if strings.Count(strings.TrimSpace(errOut), "\n") > 1 {
			t.Errorf("once %q: more than a line or two of error:\n%s", tc.args, errOut)
		}
	}
	if _, err := os.Stat(missing); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused decision created %s", missing)
	}
	// With a database, a key that is not one is refused as such.
	db := filepath.Join(t.TempDir(), "once.db")
	mustRun(t, "migrate", "--db", db)
	if code, _, errOut := run(t, "approve", "not-a-key", "--by", "ada", "--db", db); code != 1 || !strings.Contains(errOut, `"not-a-key" is not a key`) {
		t.Errorf("approve of a word: exit %d, %q", code, errOut)
	}
}
