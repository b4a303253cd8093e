package console_test

import (
	"strings"
	"testing"

	"github.com/oncehq/once/console/internal/consoletest"
	"github.com/oncehq/once/internal/testdb"
)

// TestApprovalPageShowsWholePayload: the approvals queue sends a person
// to the action's page "for the rest" of a payload, docs/console.md says
// that page "shows the whole payload", and its form says "Approve to let
// the next delivery run it (…, with the payload above) … The decision
// applies only to … this payload". The page prints at most 64 KiB of it
// (maxShown), so a payload of 100 KiB whose last field names a second
// account is approved by someone who never saw that field. A page that
// offers Approve must show all that Approve applies to.
func TestApprovalPageShowsWholePayload(t *testing.T) {
	t.Parallel()
	c, _ := testdb.SQLiteClient(t, consoletest.Gated(0))
	var runs consoletest.Runs
	in := consoletest.Transfer(0, "DE89370400440532013000", 120_000)
	// Keys are sorted in the canonical payload: the padding comes first,
	// the account that matters last.
	in.Payload = map[string]any{"a_memo": strings.Repeat("payout ", 100<<10/7), "iban": "DE89370400440532013000", "z_also_pay": "GB00ATTACKER0000000001"}
	key := consoletest.Await(t, c, in, &runs)
	b := gatedBundle(t, c, mounts[0])

	page := b.get("/actions/" + string(key)).Body.String()
	if !strings.Contains(page, `action="`+b.url("/actions/"+string(key)+"/approve")+`"`) {
		t.Fatalf("setup: the action page offers no Approve form:\n%.2000s", page)
	}
	if !strings.Contains(page, "GB00ATTACKER0000000001") {
		i := strings.Index(page, "not shown")
		t.Fatalf("the action page offers Approve for a %d-byte payload but shows only part of it (%q): the field "+
			`"z_also_pay": "GB00ATTACKER0000000001" is not on the page, yet Approve applies to it`, len(in.Payload.(map[string]any)["a_memo"].(string)), page[max(i-60, 0):min(i+60, len(page))])
	}
}
