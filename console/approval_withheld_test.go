package console_test

import (
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/oncehq/once"
	"github.com/oncehq/once/console/internal/consoletest"
	"github.com/oncehq/once/internal/testdb"
)

// TestApprovalWithheldBeyondWhatThePageShows: a client configured for
// payloads over 1 MiB stores one the action page does not print whole.
// The page then offers Reject only (which runs nothing), says why there
// is no Approve and how to read the payload whole and decide on it.
func TestApprovalWithheldBeyondWhatThePageShows(t *testing.T) {
	t.Parallel()
	cfg := consoletest.Gated(0)
	cfg.MaxPayloadBytes = 2 << 20
	c, _ := testdb.SQLiteClient(t, cfg)
	var runs consoletest.Runs
	in := consoletest.Transfer(0, "DE89370400440532013000", 120_000)
	in.Payload = map[string]any{"a_memo": strings.Repeat("x", 1<<20+1000), "z_also_pay": "GB00ATTACKER0000000001"}
	// consoletest.Await keys the intent as KeyOf does, within the
	// default limit; the queue has the key.
	if _, err := once.Do(t.Context(), c, in, runs.Effect); !errors.Is(err, once.ErrAwaitingApproval) {
		t.Fatalf("Do of a gated kind = %v; want it to await approval", err)
	}
	acts, err := c.List(t.Context(), once.Filter{Status: once.StatusAwaitingApproval, Brief: true})
	if err != nil || len(acts) != 1 {
		t.Fatalf("the queue: %v, %v", acts, err)
	}
	key := acts[0].Key
	b := gatedBundle(t, c, mounts[0])

	page := b.get("/actions/" + string(key)).Body.String()
	if strings.Contains(page, `/approve"`) || strings.Contains(page, ">Approve</button>") {
		t.Errorf("the action page offers Approve beside a payload it cuts")
	}
	for _, s := range []string{`action="` + b.url("/actions/"+string(key)+"/reject") + `"`, ">Reject</button>",
		"offers no Approve", "once show " + string(key) + " --payload", "--fingerprint ", "--since "} {
		if !strings.Contains(page, s) {
			t.Errorf("the action page lacks %q", s)
		}
	}
	// Reject still works from it.
	cookie, token := b.form(t, "/actions/"+string(key))
	w := b.serve(b.postForm("/actions/"+string(key)+"/reject", url.Values{"csrf": {token}, "note": {"too large to read here"}, "by": {"ada"}}, cookie))
	if w.Code != http.StatusSeeOther {
		t.Fatalf("reject: %d\n%.2000s", w.Code, w.Body)
	}
	if a, _ := c.Get(t.Context(), key); a.Status != once.StatusFailed {
		t.Errorf("after Reject: %s", a.Status)
	}
}
