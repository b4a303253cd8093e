package protocol_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/oncehq/once"
)

// Partial failures of /v1, each against a real HTTP server over each
// store: the client that leaves, the write that fails once, the reply
// that is lost.

// TestWaitingClaimWhoseClientLeftClaimsNothing: a claim that waits for
// another attempt stops waiting when its client goes away. Were it to
// wait on, it would claim the action once the other attempt released
// it, for nobody: the claim would sit in flight until its lease lapsed,
// and recovery would then take an effect that never ran for one that
// may have.
func TestWaitingClaimWhoseClientLeftClaimsNothing(t *testing.T) {
	for name, open := range stores(t) {
		t.Run(name, func(t *testing.T) {
			s := newServer(t, open(t), once.Config{Default: once.KindPolicy{Lease: 5 * time.Second}})
			in := once.Intent{Run: "run-1", Step: 1, Kind: "send_email", Target: "ada@example.com", Payload: json.RawMessage(`{"subject":"hello"}`)}
			held, err := s.c.Claim(context.Background(), in)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := json.Marshal(map[string]any{"intent": wireIntent(1, map[string]any{"subject": "hello"}), "write": write(), "wait_ms": 20000})
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "POST", s.url+"/v1/claim", bytes.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+workerToken)
			req.Header.Set("Content-Type", "application/json")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
				t.Fatalf("the waiting claim answered %d before the other attempt moved; want it still waiting when its client left", resp.StatusCode)
			} else if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatal(err)
			}
			// The client has gone; the other attempt gives the action
			// back.
			if err := held.Release(context.Background(), errors.New("busy")); err != nil {
				t.Fatal(err)
			}
			time.Sleep(1500 * time.Millisecond) // well past a waiter's wake-up
			got, err := s.c.Get(context.Background(), held.Key)
			if err != nil {
				t.Fatal(err)
			}
			if got.Status != once.StatusReleased || got.Attempt != held.Number {
				t.Fatalf("the action is %s at attempt %d after the waiting claim's client left; want it released at %d, claimed by nobody", got.Status, got.Attempt, held.Number)
			}
		})
	}
}
