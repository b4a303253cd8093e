package postgres_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/postgres"
)

// TestGroupCommitRedriveMarkIsFenced: a re-drive mark (Transition.Waiting)
// sent in a batch applies only to an action still waiting for a delivery:
// of two marks of one waiting action, the first applies and the second is
// refused, and a mark of an action released a moment ago is refused.
func TestGroupCommitRedriveMarkIsFenced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, schema := groupStore(t, postgres.Config{})
	// The re-drive delay is long, and the waiting action is made due by
	// moving its last change back in the database rather than by
	// sleeping, so no wait of the test's own (two marks of one key go in
	// two transactions) can make a mark due that should not be: with a
	// delay of 200 ms, a loaded machine applied all three marks.
	const after = time.Hour
	release := func(n int) once.Key {
		k := groupKey(t, n)
		req := claimOf(k, "c")
		req.RedriveAfter = after
		if cr, err := s.Claim(ctx, req); err != nil || !cr.Claimed {
			t.Fatalf("claim = %+v, %v", cr, err)
		}
		if ok, err := s.Transition(ctx, once.Transition{Key: k, Attempt: 1, From: []once.Status{once.StatusInFlight}, To: once.StatusReleased,
			Event: once.Event{Type: once.EventReleased, From: once.StatusInFlight, Actor: once.ActorWorker}}); err != nil || !ok {
			t.Fatalf("release = %v, %v", ok, err)
		}
		return k
	}
	mark := func(k once.Key, token string) once.Transition {
		return once.Transition{Key: k, Attempt: 1, From: []once.Status{once.StatusReleased}, To: once.StatusReleased, Waiting: true, Token: token,
			Event: once.Event{Type: once.EventRedriven, From: once.StatusReleased, Actor: once.ActorReaper}}
	}
	waited := release(0)
	if _, err := s.Pool().Exec(ctx, `UPDATE `+tableOf(schema, "action")+` SET updated_at = updated_at - interval '2 hours' WHERE key = $1`,
		string(waited)); err != nil {
		t.Fatal(err)
	}
	fresh := release(1)
	ok, errs := s.TransitionMany(ctx, []once.Transition{mark(waited, "a"), mark(fresh, "b"), mark(waited, "c")})
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if want := []bool{true, false, false}; !slices.Equal(ok, want) {
		t.Fatalf("marks applied %v, want %v: the waiting action once, the fresh one not", ok, want)
	}
}
