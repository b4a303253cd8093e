package protocol_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/oncehq/once"
)

// TestReleasedForAVerifierIsNotAnInternalError: a Go worker with the
// kind's verifier released an action (VerifyThenDecide); a protocol
// server without that verifier (once serve knows no kinds) is asked
// for it. The engine answers ErrRetryLater ("a process that configures
// the kind claims it"), which problemOf does not know: 500 internal, a
// server bug to the worker and its operator, and no retry_after.
func TestReleasedForAVerifierIsNotAnInternalError(t *testing.T) {
	store := stores(t)["sqlite"](t)
	s := newServer(t, store, once.Config{})
	verified, err := once.New(once.Config{Store: store, Kinds: map[string]once.KindPolicy{"send_email": {
		Recovery: once.VerifyThenDecide,
		Verifier: func(context.Context, once.Action) (bool, json.RawMessage, error) { return false, nil, nil },
	}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	att, err := verified.Claim(ctx, once.Intent{Run: "run-1", Step: 1, Kind: "send_email", Target: "ada@example.com", Payload: json.RawMessage("null")})
	if err != nil {
		t.Fatal(err)
	}
	if err := att.Release(ctx, errors.New("429")); err != nil {
		t.Fatal(err)
	}
	code, v := s.post("/v1/claim", claimBody(wireIntent(1, nil)))
	if code >= 500 && code != 503 || v["code"] == "internal" {
		t.Fatalf("a claim of an action released for a verifier this server lacks = %d %v; want a code the protocol documents", code, v)
	}
}
