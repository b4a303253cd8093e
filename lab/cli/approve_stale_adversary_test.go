package cli_test

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestApproveStaleShowIsFenced: the console's form, its API and the
// webhook's receiver all fence a decision by the attempt, the payload's
// fingerprint and when the wait began, so that a decision taken on what
// a person saw does not apply to a wait they never saw (the key's
// action rejected, purged, and its intent back with another payload: the
// same key, at attempt 1 again). `once approve` takes only --attempt,
// which cannot tell the two waits apart: ada looks with `once show`
// (a charge of 100 cents), the wait is replaced by one of 9,900,000
// cents, and `once approve --attempt 1` approves that.
//
// The test gives `once approve` what `once show --json` printed (its
// fingerprint and created_at) as --fingerprint and --since, the names
// the API's fields have; on main those flags do not exist.
func TestApproveStaleShowIsFenced(t *testing.T) {
	db := filepath.Join(t.TempDir(), "once.db")
	mustRun(t, "migrate", "--db", db)
	first := awaitApproval(t, db, time.Hour, charge("run-stale", 0, map[string]int{"cents": 100}))
	key := string(first.Key)

	// What ada looked at.
	var shown struct {
		Attempt     int       `json:"attempt"`
		Fingerprint string    `json:"fingerprint"`
		CreatedAt   time.Time `json:"created_at"`
		Payload     any       `json:"payload"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "show", key, "--json", "--db", db)), &shown); err != nil || shown.Fingerprint == "" {
		t.Fatalf("once show --json: %+v, %v", shown, err)
	}

	// Meanwhile: grace rejects it, it is purged, and the application's
	// intent comes back with another payload, under the same key.
	mustRun(t, "reject", key, "--by", "grace", "--note", "a duplicate", "--db", db)
	time.Sleep(20 * time.Millisecond)
	mustRun(t, "purge", "--older-than", "1ms", "--db", db)
	second := awaitApproval(t, db, time.Hour, charge("run-stale", 0, map[string]int{"cents": 9_900_000}))
	if second.Key != first.Key || second.Attempt != 1 || second.Fingerprint == first.Fingerprint {
		t.Fatalf("setup: the second wait is %s at attempt %d (fingerprint %s); want the same key at attempt 1, another payload", second.Key, second.Attempt, second.Fingerprint)
	}

	code, out, errOut := run(t, "approve", key, "--by", "ada", "--attempt", "1",
		"--fingerprint", shown.Fingerprint, "--since", shown.CreatedAt.Format(time.RFC3339Nano), "--db", db)
	if code != 1 || !strings.Contains(errOut, "another payload") {
		// What the only fence `once approve` has does, on main.
		_, plain, _ := run(t, "approve", key, "--by", "ada", "--attempt", "1", "--db", db)
		t.Fatalf("once approve of a wait other than the one `once show` showed (100 cents, now 9,900,000): exit %d, %q %q; "+
			"want exit 1, refused for another payload. With --attempt 1 alone, as docs/webhook.md says to fence: %q",
			code, out, errOut, strings.TrimSpace(plain))
	}
}
