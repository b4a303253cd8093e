package cli_test

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestApproveFencedByPlainShow: plain `once show` prints what fences a
// decision on the wait it shows (the attempt, the fingerprint, when the
// wait began, and the command that passes them), so a person can copy
// them: another fingerprint or another beginning is refused, the ones
// shown apply.
func TestApproveFencedByPlainShow(t *testing.T) {
	db := filepath.Join(t.TempDir(), "once.db")
	mustRun(t, "migrate", "--db", db)
	a := awaitApproval(t, db, time.Hour, charge("run-fence", 0, map[string]int{"cents": 100}))
	key := string(a.Key)
	out := mustRun(t, "show", key, "--db", db)
	fp := regexp.MustCompile(`(?m)^fingerprint\s+([0-9a-f]{64})$`).FindStringSubmatch(out)
	since := regexp.MustCompile(`(?m)^since\s+(\S+) \(`).FindStringSubmatch(out)
	if fp == nil || since == nil || fp[1] != string(a.Fingerprint) {
		t.Fatalf("once show prints no fingerprint (%s) or since:\n%s", a.Fingerprint, out)
	}
	if want := "once approve " + key + " --by NAME --attempt 1 --fingerprint " + fp[1] + " --since " + since[1]; !strings.Contains(out, want) {
		t.Errorf("once show does not print the command that decides this wait, %q:\n%s", want, out)
	}
	at, err := time.Parse(time.RFC3339Nano, since[1])
	if err != nil || !at.Equal(a.CreatedAt) {
		t.Fatalf("once show's since %q is not when the wait began, %s, to the nanosecond (%v)", since[1], a.CreatedAt.Format(time.RFC3339Nano), err)
	}

	other := strings.Repeat("0", 64)
	if code, _, errOut := run(t, "approve", key, "--by", "ada", "--fingerprint", other, "--db", db); code != 1 || !strings.Contains(errOut, "another payload") {
		t.Errorf("approve --fingerprint of another payload: exit %d, %q", code, errOut)
	}
	later := at.Add(time.Microsecond).Format(time.RFC3339Nano)
	if code, _, errOut := run(t, "reject", key, "--by", "ada", "--note", "no", "--since", later, "--db", db); code != 1 || !strings.Contains(errOut, "began waiting at") {
		t.Errorf("reject --since of another wait: exit %d, %q", code, errOut)
	}
	if out := mustRun(t, "approve", key, "--by", "ada", "--attempt", "1", "--fingerprint", fp[1], "--since", since[1], "--db", db); !strings.Contains(out, "is now approved") {
		t.Errorf("approve with what once show printed: %q", out)
	}
}

// TestShowPayloadWhole: plain `once show` clips a long payload and says
// how to print it whole; `once show --payload` prints all of it, its
// last field too, with what would act on a terminal escaped.
func TestShowPayloadWhole(t *testing.T) {
	db := filepath.Join(t.TempDir(), "once.db")
	mustRun(t, "migrate", "--db", db)
	a := awaitApproval(t, db, time.Hour, charge("run-long", 0, map[string]string{"a_memo": strings.Repeat("payout ", 20_000), "z_also_pay": "GB00ATTACKER\x1b[2J"}))
	key := string(a.Key)
	if out := mustRun(t, "show", key, "--db", db); !strings.Contains(out, "once show "+key+" --payload prints it whole") {
		t.Errorf("once show clips the payload without saying how to print it whole:\n%.3000s", out)
	}
	out := mustRun(t, "show", key, "--payload", "--db", db)
	if !strings.Contains(out, `"z_also_pay": "GB00ATTACKER\u001b[2J"`) || strings.Contains(out, "\x1b") || strings.Count(out, "payout ") != 20_000 {
		t.Errorf("once show --payload does not print the whole payload, escaped (%d bytes):\n%.300s…%s", len(out), out, out[max(len(out)-300, 0):])
	}
	text := awaitApproval(t, db, time.Hour, charge("run-text", 0, []byte("pay ada\n\x1b]0;pay mallory\x07\tin full")))
	if out := mustRun(t, "show", string(text.Key), "--payload", "--db", db); out != "pay ada\n\\x1b]0;pay mallory\\a\tin full\n" {
		t.Errorf("once show --payload of text with a terminal's escape: %q", out)
	}
	if code, _, errOut := run(t, "show", key, "--payload", "--json", "--db", db); code == 0 || !strings.Contains(errOut, "give --payload or --json") {
		t.Errorf("once show --payload --json: exit %d, %q", code, errOut)
	}
}
