package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncehq/once"
	"github.com/oncehq/once/postgres"
)

func tableOf(schema, name string) string { return pgx.Identifier{schema, "once_" + name}.Sanitize() }

// countEvents counts the trail's rows as written.
func countEvents(t *testing.T, s *postgres.Store, schema string) int {
	t.Helper()
	var n int
	if err := s.Pool().QueryRow(context.Background(), `SELECT count(*) FROM `+tableOf(schema, "event")).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestHappyPathWritesOneRow: a new key whose effect succeeds writes the
// action row and nothing else, and its trail still reads as a claim and a
// success, with the claiming process, the attempt and the row's times;
// RecentEvents lists them too. A path off the happy one (a release, a
// second claim, its success) writes its events as before.
func TestHappyPathWritesOneRow(t *testing.T) {
	s, schema := newStore(t)
	ctx := context.Background()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := once.New(once.Config{Store: s, Origin: "happy-host:7"})
	if err != nil {
		t.Fatal(err)
	}
	in := once.Intent{Run: "r", Step: 1, Kind: "send_email", Target: "ada@example.com", Payload: "hi"}
	res, err := once.Do(ctx, c, in, func(context.Context, once.Attempt) (string, error) { return "sent", nil })
	if err != nil {
		t.Fatal(err)
	}
	if n := countEvents(t, s, schema); n != 0 {
		t.Fatalf("the happy path wrote %d event rows, want 0", n)
	}
	a, err := s.Get(ctx, res.Key)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := s.Events(ctx, res.Key)
	if err != nil {
		t.Fatal(err)
	}
	got := trail(evs)
	if want := "claimed(1,->in_flight,worker,happy-host:7) succeeded(1,in_flight->succeeded,worker,happy-host:7)"; got != want {
		t.Fatalf("trail %s, want %s", got, want)
	}
	if !evs[0].At.Equal(a.CreatedAt) || !evs[1].At.Equal(a.CompletedAt) {
		t.Fatalf("the trail's times %v, %v are not the row's created_at %v and completed_at %v", evs[0].At, evs[1].At, a.CreatedAt, a.CompletedAt)
	}
	recent, err := s.RecentEvents(ctx, []once.EventType{once.EventClaimed, once.EventSucceeded}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if got := trail(recent); got != "succeeded(1,in_flight->succeeded,worker,happy-host:7) claimed(1,->in_flight,worker,happy-host:7)" {
		t.Fatalf("recent events %s", got)
	}
	if recent, err := s.RecentEvents(ctx, []once.EventType{once.EventReview}, 10); err != nil || len(recent) != 0 {
		t.Fatalf("recent reviews: %v, %v; want none", recent, err)
	}

	// Off the happy path: released, then claimed again and succeeded.
	in.Step = 2
	_, err = once.Do(ctx, c, in, func(context.Context, once.Attempt) (string, error) {
		return "", once.RetryLater(errors.New("smtp 451"))
	})
	if err == nil {
		t.Fatal("a RetryLater effect reported no error")
	}
	res, err = once.Do(ctx, c, in, func(context.Context, once.Attempt) (string, error) { return "sent", nil })
	if err != nil {
		t.Fatal(err)
	}
	evs, err = s.Events(ctx, res.Key)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := trail(evs), "claimed(1,->in_flight,worker,happy-host:7) released(1,in_flight->released,worker,happy-host:7) "+
		"claimed(2,released->in_flight,worker,happy-host:7) succeeded(2,in_flight->succeeded,worker,happy-host:7)"; got != want {
		t.Fatalf("trail %s, want %s", got, want)
	}
	if n := countEvents(t, s, schema); n != 3 {
		t.Fatalf("%d event rows written, want 3 (released, the second claim, its success)", n)
	}
}

func trail(evs []once.Event) string {
	var b []string
	for _, e := range evs {
		b = append(b, fmt.Sprintf("%s(%d,%s->%s,%s,%s)", e.Type, e.Attempt, e.From, e.To, e.Actor, e.Origin))
	}
	return strings.Join(b, " ")
}

// TestHeartbeatIsHOT: a heartbeat changes no indexed column, so
// PostgreSQL updates the row in place (a HOT update) and writes no index
// entry, as pg_stat_get_xact_tuples_hot_updated counts in the
// transaction that made them.
func TestHeartbeatIsHOT(t *testing.T) {
	s, schema := newStore(t)
	ctx := context.Background()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	bound := s.BindTx(tx)
	k := once.Key(strings.Repeat("ab", 32))
	res, err := bound.Claim(ctx, once.ClaimRequest{Key: k, Fingerprint: "f", Run: "r", Kind: "k", Lease: time.Minute, Token: "t"})
	if err != nil || !res.Claimed {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	for i := range 5 {
		// A lease of its own each time: now() stands still in a
		// transaction, and the same deadline again would change nothing.
		if _, ok, err := bound.Heartbeat(ctx, k, 1, time.Minute+time.Duration(i+1)*time.Second); err != nil || !ok {
			t.Fatalf("heartbeat: %v, %v", ok, err)
		}
	}
	var updated, hot int
	if err := tx.QueryRow(ctx, `SELECT pg_stat_get_xact_tuples_updated($1::regclass), pg_stat_get_xact_tuples_hot_updated($1::regclass)`,
		tableOf(schema, "action")).Scan(&updated, &hot); err != nil {
		t.Fatal(err)
	}
	if updated != 5 || hot != 5 {
		t.Fatalf("5 heartbeats: %d updates, %d of them HOT; want all 5 HOT", updated, hot)
	}
}

// TestReplayWritesNothing: a duplicate of a finished action is a read:
// its claim statement takes no transaction id, so it writes no WAL and
// has no commit to flush.
func TestReplayWritesNothing(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	k := once.Key(strings.Repeat("cd", 32))
	req := once.ClaimRequest{Key: k, Fingerprint: "f", Run: "r", Kind: "k", Lease: time.Minute, Token: "t"}
	if res, err := s.Claim(ctx, req); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	if ok, err := s.Transition(ctx, once.Transition{Key: k, Attempt: 1, From: []once.Status{once.StatusInFlight}, To: once.StatusSucceeded,
		Result: []byte(`"ok"`), Event: once.Event{Type: once.EventSucceeded, From: once.StatusInFlight, Actor: once.ActorWorker}}); err != nil || !ok {
		t.Fatalf("transition: %v, %v", ok, err)
	}
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	res, err := s.BindTx(tx).Claim(ctx, req)
	if err != nil || res.Claimed || res.Action.Status != once.StatusSucceeded || string(res.Action.Result) != `"ok"` {
		t.Fatalf("replay: %+v, %v", res, err)
	}
	var xid *string
	if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id_if_assigned()::text`).Scan(&xid); err != nil {
		t.Fatal(err)
	}
	if xid != nil {
		t.Fatalf("the replay took transaction id %s: it wrote", *xid)
	}
}
