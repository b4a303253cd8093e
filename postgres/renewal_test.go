package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncehq/once"
)

// TestFailedRenewalReleasesTheUnrunClaim: when too little of a claim's
// lease is left to start the effect on (a hook held the worker up) and
// its renewal fails because the database is slow (here, a lock on the
// row held past the renewal's deadline), nothing runs, and the claim is
// released for the next delivery, not left in flight for recovery to
// put to a person as an effect that may have happened.
func TestFailedRenewalReleasesTheUnrunClaim(t *testing.T) {
	s, schema := newStore(t)
	ctx := context.Background()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	table := pgx.Identifier{schema, "once_action"}.Sanitize()
	const lease = 1500 * time.Millisecond
	locked := make(chan error, 1)
	c, err := once.New(once.Config{Store: s,
		Kinds: map[string]once.KindPolicy{"send_email": {Lease: lease, Recovery: once.AskPerson}},
		Hooks: once.Hooks{OnExecute: func(ctx context.Context, o once.Observation) (context.Context, func(once.Observation, error)) {
			// Lock the row for longer than the renewal waits (a third
			// of the lease), then hold the worker past the point where
			// enough lease is left to start on. The next attempt is
			// left alone.
			if o.Event.Attempt != 1 {
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
			time.Sleep(lease * 8 / 15)
			return ctx, nil
		}}})
	if err != nil {
		t.Fatal(err)
	}
	in := once.Intent{Run: "renewal", Kind: "send_email", Target: "ada@example.com", Payload: "hello"}
	ran := false
	res, err := once.Do(ctx, c, in, func(context.Context, once.Attempt) (string, error) {
		ran = true
		return "sent", nil
	})
	if lerr := <-locked; lerr != nil {
		t.Fatal(lerr)
	}
	if ran {
		t.Fatal("the effect ran on a lease that could not be renewed")
	}
	if err == nil {
		t.Fatalf("Do = %+v, want an error: the lease could not be renewed", res)
	}
	a, gerr := s.Get(ctx, mustKey(t, in))
	if gerr != nil {
		t.Fatal(gerr)
	}
	if a.Status != once.StatusReleased || !errors.Is(err, once.ErrRetryLater) {
		t.Errorf("after a failed renewal the action is %s (%q) and Do said %v; want it released, and Do to say retry later", a.Status, a.Error, err)
	}
	// The next delivery runs it.
	res, err = once.Do(ctx, c, in, func(context.Context, once.Attempt) (string, error) { return "sent", nil })
	if err != nil || res.Replayed || res.Value != "sent" {
		t.Errorf("the next delivery = %+v, %v; want it to run the effect", res, err)
	}
}

func mustKey(t *testing.T, in once.Intent) once.Key {
	t.Helper()
	k, _, err := once.KeyOf(in)
	if err != nil {
		t.Fatal(err)
	}
	return k
}
