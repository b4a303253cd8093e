package protocol_test

import (
	"strings"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/protocol"
)

// TestParseKinds: a kinds file becomes the policies it says, and a
// once.Client takes them; every mistake is refused naming the kind and
// the field.
func TestParseKinds(t *testing.T) {
	v := protocol.NewVerifiers()
	def, kinds, err := protocol.ParseKinds(strings.NewReader(`{
  "default": {"lease": "1m", "recovery": "ask_person"},
  "kinds": {
    "charge_card": {"recovery": "retry_with_provider_key", "max_execution": "2m"},
    "send_email":  {"recovery": "verify_then_decide", "verifier": "client", "max_verify_failures": 3},
    "wire_money":  {"approval": {"always": true, "expiry": "24h", "on_expiry": "review"}}
  }
}`), v)
	if err != nil {
		t.Fatal(err)
	}
	if def.Lease != time.Minute || def.Recovery != once.AskPerson {
		t.Fatalf("default %+v", def)
	}
	if p := kinds["charge_card"]; p.Recovery != once.RetryWithProviderKey || p.MaxExecution != 2*time.Minute {
		t.Fatalf("charge_card %+v", p)
	}
	if p := kinds["send_email"]; p.Recovery != once.VerifyThenDecide || p.Verifier == nil || p.MaxVerifyFailures != 3 {
		t.Fatalf("send_email %+v", p)
	}
	if p := kinds["wire_money"]; !p.Approval.Always || p.Approval.Expiry != 24*time.Hour || p.Approval.OnExpiry != once.StatusReview {
		t.Fatalf("wire_money %+v", p.Approval)
	}
	c, err := once.New(once.Config{Store: stores(t)["sqlite"](t), Default: def, Kinds: kinds})
	if err != nil {
		t.Fatalf("once.New with the file's policies: %v", err)
	}
	if got := c.Policy("charge_card"); got.Recovery != once.RetryWithProviderKey {
		t.Fatalf("the client's charge_card policy %+v", got)
	}

	for _, c := range []struct{ file, says string }{
		{`{"kinds": {"a": {"lease": "soon"}}}`, `kind "a": lease is "soon"`},
		{`{"kinds": {"a": {"lease": "-1s"}}}`, `kind "a": lease is "-1s"`},
		{`{"kinds": {"a": {"recovery": "pray"}}}`, `kind "a": recovery is "pray"`},
		{`{"kinds": {"a": {"recovery": "verify_then_decide"}}}`, `verify_then_decide needs a verifier`},
		{`{"kinds": {"a": {"verifier": "client"}}}`, `set "recovery": "verify_then_decide"`},
		{`{"kinds": {"a": {"recovery": "verify_then_decide", "verifier": "https://x"}}}`, `the only verifier a kinds file names is "client"`},
		{`{"kinds": {"a": {"approval": {"expiry": "1h"}}}}`, `approval: set "always": true`},
		{`{"kinds": {"a": {"approval": {"always": true, "on_expiry": "later"}}}}`, `approval.on_expiry is "later"`},
		{`{"kinds": {"a": {"max_verify_failures": -1}}}`, `max_verify_failures is -1`},
		{`{"kinds": {"": {}}}`, `a kind's name is 1 to 128 printable bytes`},
		{`{"default": {"recovery": "verify_then_decide", "verifier": "client"}}`, `default: "verifier" is for a named kind`},
		{"{\n\"kinds\": {\"a\": {\"leese\": \"1m\"}}}", `(line 2)`},
		{`{"kinds": {}} {}`, `text after its JSON object`},
		{`[1]`, `not the JSON it takes`},
		{strings.Repeat(" ", protocol.MaxKindsFile+1), `over 1048576 bytes`},
	} {
		_, _, err := protocol.ParseKinds(strings.NewReader(c.file), v)
		if err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("ParseKinds(%.60q) = %v; want it to say %q", c.file, err, c.says)
		}
	}
	if _, _, err := protocol.ParseKinds(strings.NewReader(`{"kinds": {"a": {"recovery": "verify_then_decide", "verifier": "client"}}}`), nil); err == nil || !strings.Contains(err.Error(), "needs the server to serve client verifiers") {
		t.Errorf("a client verifier without the bridge = %v", err)
	}
}

// TestParseKindsRefusesWhatItWouldSilentlyDrop: encoding/json keeps the
// last of a name given twice, matches a field's name in any case, and
// takes null as nothing; a kinds file read so would drop a policy its
// author wrote, so each is refused naming the line. So is
// redrive_after, which once serve cannot honour (a Redrive is Go's).
func TestParseKindsRefusesWhatItWouldSilentlyDrop(t *testing.T) {
	v := protocol.NewVerifiers()
	for _, c := range []struct{ file, says string }{
		{"{\"kinds\": {\n\"a\": {\"lease\": \"1m\"},\n\"a\": {\"lease\": \"2m\"}}}", `line 3: kinds: "a" is given twice`},
		{"{\"kinds\": {\"a\": {\"lease\": \"1m\",\n\"lease\": \"2m\"}}}", `line 2: kinds.a: "lease" is given twice`},
		{"{\"default\": {},\n\"default\": {\"lease\": \"1m\"}}", `line 2: "default" is given twice`},
		{"{\"kinds\": {\"a\": {\n\"Lease\": \"1m\"}}}", `line 2: kinds.a: "Lease" is not a field; names are exact: write "lease"`},
		{"{\"Kinds\": {}}", `"Kinds" is not a field; names are exact: write "kinds"`},
		{"{\"kinds\": {\"a\": {\"approval\": {\"Always\": true}}}}", `write "always"`},
		{"{\"kinds\": {\"a\": {\"lease\": \"1m\", \"LEASE\": \"2m\"}}}", `write "lease"`},
		{"null", `line 1: the kinds file is null`},
		{"{\n\"default\": null}", `line 2: default is null`},
		{"{\"kinds\": null}", `kinds is null`},
		{"{\"kinds\": {\"a\": null}}", `kinds.a is null`},
		{"{\"kinds\": {\"a\": {\"lease\": null}}}", `kinds.a.lease is null`},
		{"{\"kinds\": {\"a\": {\n\"redrive_after\": \"1h\"}}}", `line 2: kinds.a: redrive_after`},
		{"{\"default\": {\"redrive_after\": \"1h\"}}", `once serve cannot honour it`},
	} {
		_, _, err := protocol.ParseKinds(strings.NewReader(c.file), v)
		if err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("ParseKinds(%.60q) = %v; want it to say %q", c.file, err, c.says)
		}
	}
}
