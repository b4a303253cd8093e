package postgres_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncehq/once"
)

// TestFailedRenewalAndReleaseSayNothingRan: the renewal before the
// effect fails (the row is locked past its deadline) and so does the
// release of the unrun claim (locked past RecordTimeout). Nothing ran,
// and Do's error says so, and why: the renewal failed, and the release
// was not recorded (it may yet commit; the claim may stay in flight).
func TestFailedRenewalAndReleaseSayNothingRan(t *testing.T) {
	s, schema := newStore(t)
	ctx := context.Background()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	table := pgx.Identifier{schema, "once_action"}.Sanitize()
	const lease = 1500 * time.Millisecond
	locked := make(chan error, 1)
	c, err := once.New(once.Config{Store: s, RecordTimeout: time.Second,
		Kinds: map[string]once.KindPolicy{"send_email": {Lease: lease, Recovery: once.AskPerson}},
		Hooks: once.Hooks{OnExecute: func(ctx context.Context, o once.Observation) (context.Context, func(once.Observation, error)) {
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
			// Held past the renewal (Lease/3) and the release's
			// RecordTimeout.
			time.AfterFunc(4*time.Second, func() { locked <- tx.Rollback(context.Background()) })
			time.Sleep(lease * 8 / 15)
			return ctx, nil
		}}})
	if err != nil {
		t.Fatal(err)
	}
	in := once.Intent{Run: "renewal-2", Kind: "send_email", Target: "ada@example.com", Payload: "hello"}
	ran := false
	_, err = once.Do(ctx, c, in, func(context.Context, once.Attempt) (string, error) {
		ran = true
		return "sent", nil
	})
	if lerr := <-locked; lerr != nil {
		t.Fatal(lerr)
	}
	if ran {
		t.Fatal("the effect ran")
	}
	t.Logf("Do: %v", err)
	if err == nil {
		t.Fatal("Do = nil, want an error")
	}
	if !strings.Contains(err.Error(), "could not be renewed") || !strings.Contains(err.Error(), "nothing ran") {
		t.Errorf("Do's error does not say the renewal failed and nothing ran: %v", err)
	}
	a, gerr := s.Get(ctx, mustKey(t, in))
	if gerr != nil {
		t.Fatal(gerr)
	}
	t.Logf("row: %s attempt %d %q", a.Status, a.Attempt, a.Error)
}
