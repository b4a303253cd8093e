package postgres_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncehq/once"
)

// TestFailedRenewalOfATakeoverAsksTheVerifierAgain: attempt 1's
// worker died with its effect's outcome unknown. A delivery recovers it
// under VerifyThenDecide: the verifier (slow: the provider is eventually
// consistent) finds no trace yet, and the action is taken over as
// attempt 2. The verifier used up the lease counted from before recovery,
// so the takeover is renewed before the effect, and the renewal fails (the
// row locked past Lease/3). Attempt 2 must not be released: attempt 1's
// outcome is still unknown, and a released action's next delivery would
// run the effect without asking the verifier again, though attempt 1's
// effect has landed by then. It stays in flight, its lease lapses, and
// recovery asks the verifier again, which finds the effect landed.
func TestFailedRenewalOfATakeoverAsksTheVerifierAgain(t *testing.T) {
	s, schema := newStore(t)
	ctx := context.Background()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	table := pgx.Identifier{schema, "once_action"}.Sanitize()
	const lease = 1500 * time.Millisecond
	var verifies atomic.Int32
	landed := atomic.Bool{} // attempt 1's effect, landed late at the provider
	locked := make(chan error, 1)
	c, err := once.New(once.Config{Store: s,
		Kinds: map[string]once.KindPolicy{"send_email": {Lease: lease, Recovery: once.VerifyThenDecide,
			Verifier: func(ctx context.Context, a once.Action) (bool, json.RawMessage, error) {
				verifies.Add(1)
				if landed.Load() {
					return true, json.RawMessage(`"sent"`), nil
				}
				time.Sleep(lease * 8 / 15)
				return false, nil, nil
			}}},
		Hooks: once.Hooks{OnExecute: func(ctx context.Context, o once.Observation) (context.Context, func(once.Observation, error)) {
			if o.Event.Attempt != 2 {
				return ctx, nil
			}
			tx, err := s.Pool().Begin(ctx)
			if err != nil {
				locked <- err
				return ctx, nil
			}
			if _, err := tx.Exec(ctx, `SELECT 1 FROM `+table+` WHERE key = $1 FOR UPDATE`, string(o.Event.Key)); err != nil {
				tx.Rollback(ctx)
				locked <- err
				return ctx, nil
			}
			time.AfterFunc(lease, func() { locked <- tx.Rollback(context.Background()) })
			return ctx, nil
		}}})
	if err != nil {
		t.Fatal(err)
	}
	in := once.Intent{Run: "verify", Kind: "send_email", Target: "ada@example.com", Payload: "hello"}
	k, fp, err := once.KeyOf(in)
	if err != nil {
		t.Fatal(err)
	}
	// Attempt 1: claimed by a worker that died; its effect is in the
	// provider's pipeline, not yet visible.
	if cr, err := s.Claim(ctx, once.ClaimRequest{Key: k, Fingerprint: fp, Run: in.Run, Step: in.Step, Kind: in.Kind, Target: in.Target,
		Payload: []byte(`"hello"`), Lease: time.Millisecond, Recovery: once.VerifyThenDecide}); err != nil || !cr.Claimed {
		t.Fatalf("claim: %+v, %v", cr, err)
	}
	time.Sleep(50 * time.Millisecond)

	var runs atomic.Int32
	effect := func(context.Context, once.Attempt) (string, error) {
		runs.Add(1)
		return "sent", nil
	}
	_, err = once.Do(ctx, c, in, effect)
	if lerr := <-locked; lerr != nil {
		t.Fatal(lerr)
	}
	a, _ := s.Get(ctx, k)
	t.Logf("delivery 2: %v; row %s attempt %d %q", err, a.Status, a.Attempt, a.Error)

	// Attempt 1's effect lands at the provider now.
	landed.Store(true)
	// The old path: the lease of attempt 2 lapses before the next delivery.
	time.Sleep(lease + 500*time.Millisecond)
	res, err := once.Do(ctx, c, in, effect)
	a, _ = s.Get(ctx, k)
	t.Logf("delivery 3: %+v, %v; row %s attempt %d; verifier asked %d times; effect ran %d times here (+1 by attempt 1)", res, err, a.Status, a.Attempt, verifies.Load(), runs.Load())
	if runs.Load() != 0 {
		t.Errorf("the effect ran again (%d) without the verifier being asked after attempt 1's outcome was left unknown; it had landed, so it happened twice", runs.Load())
	}
}
