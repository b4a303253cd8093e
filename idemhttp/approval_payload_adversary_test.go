package idemhttp_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/oncehq/once"
)

// TestApprovalPayloadShowsTheRequest: with the default Fingerprint the
// action's payload is the method, the path and a SHA-256 of the body.
// On a gated route that payload is all a person deciding sees (the
// console's action page, /api/approvals, the webhook): they are asked to
// approve a hash. The body of the request they approve must be readable
// where they decide.
func TestApprovalPayloadShowsTheRequest(t *testing.T) {
	h := &orders{}
	srv, c := serveGated(t, h, once.KindPolicy{Approval: once.ApprovalPolicy{Always: true, Expiry: time.Hour}})
	awaitingReply(t, post(t, srv.URL, "k-show", "acme", `{"iban":"DE89370400440532013000","cents":250000}`))
	a, err := c.Get(context.Background(), orderKey(t, c, "k-show"))
	if err != nil {
		t.Fatal(err)
	}
	if a.Status != once.StatusAwaitingApproval {
		t.Fatalf("setup: the action is %s", a.Status)
	}
	if p := string(a.Payload); !strings.Contains(p, "DE89370400440532013000") || !strings.Contains(p, "250000") {
		t.Fatalf("the action a person is asked to approve holds the payload %s: nothing of the request's body "+
			`{"iban":"DE89370400440532013000","cents":250000}; the approver cannot see what they approve`, p)
	}
}
