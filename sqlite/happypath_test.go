package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/sqlite"
)

// countEvents counts the trail's rows as written.
func countEvents(t *testing.T, s *sqlite.Store) int {
	t.Helper()
	var n int
	if err := s.DB().QueryRow(`SELECT count(*) FROM once_event`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func trail(evs []once.Event) string {
	var b []string
	for _, e := range evs {
		b = append(b, fmt.Sprintf("%s(%d,%s->%s,%s,%s)", e.Type, e.Attempt, e.From, e.To, e.Actor, e.Origin))
	}
	return strings.Join(b, " ")
}

func events(t *testing.T, s *sqlite.Store, key once.Key) []once.Event {
	t.Helper()
	evs, err := s.Events(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// TestHappyPathWritesOneRow: a new key whose effect succeeds writes the
// action row and nothing else, and its trail still reads as a claim and a
// success, with the claiming process, the attempt and the row's times;
// RecentEvents lists them too. A path off the happy one (a release, a
// second claim, its success) writes its events as before.
func TestHappyPathWritesOneRow(t *testing.T) {
	ctx := context.Background()
	c, s := testdb.SQLiteClient(t, once.Config{Origin: "happy-host:7"})
	in := once.Intent{Run: "r", Step: 1, Kind: "send_email", Target: "ada@example.com", Payload: "hi"}
	res, err := once.Do(ctx, c, in, func(context.Context, once.Attempt) (string, error) { return "sent", nil })
	if err != nil {
		t.Fatal(err)
	}
	if n := countEvents(t, s); n != 0 {
		t.Fatalf("the happy path wrote %d event rows, want 0", n)
	}
	a, err := s.Get(ctx, res.Key)
	if err != nil {
		t.Fatal(err)
	}
	evs := events(t, s, res.Key)
	if got, want := trail(evs), "claimed(1,->in_flight,worker,happy-host:7) succeeded(1,in_flight->succeeded,worker,happy-host:7)"; got != want {
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
	if !recent[0].At.Equal(a.CompletedAt) || !recent[1].At.Equal(a.CreatedAt) {
		t.Fatalf("recent events' times %v, %v are not the row's completed_at %v and created_at %v", recent[0].At, recent[1].At, a.CompletedAt, a.CreatedAt)
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
	if got, want := trail(events(t, s, res.Key)), "claimed(1,->in_flight,worker,happy-host:7) released(1,in_flight->released,worker,happy-host:7) "+
		"claimed(2,released->in_flight,worker,happy-host:7) succeeded(2,in_flight->succeeded,worker,happy-host:7)"; got != want {
		t.Fatalf("trail %s, want %s", got, want)
	}
	if n := countEvents(t, s); n != 3 {
		t.Fatalf("%d event rows written, want 3 (released, the second claim, its success)", n)
	}
	recent, err = s.RecentEvents(ctx, nil, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(recent) != 6 {
		t.Fatalf("%d recent events, want 6 (2 of the first key, 4 of the second): %s", len(recent), trail(recent))
	}
}

// TestOffHappyPathWritesEvents: a takeover, a move to review, a person's
// resolution and a refused late outcome are written to the trail, each
// once, beside the happy path's claim, which the row tells.
func TestOffHappyPathWritesEvents(t *testing.T) {
	ctx := context.Background()
	c, s := testdb.SQLiteClient(t, once.Config{Origin: "w:1"})
	k := once.Key(strings.Repeat("ab", 32))
	claim := once.ClaimRequest{Key: k, Fingerprint: "f", Run: "r", Kind: "k", Lease: time.Minute, Token: "t1", Origin: "w:1"}
	if res, err := s.Claim(ctx, claim); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	steps := []once.Transition{
		{Key: k, Attempt: 1, From: []once.Status{once.StatusInFlight}, To: once.StatusInFlight, NewAttempt: true, Lease: time.Minute,
			Event: once.Event{Type: once.EventTakenOver, From: once.StatusInFlight, Actor: once.ActorReaper, Origin: "reaper:2"}},
		{Key: k, Attempt: 2, From: []once.Status{once.StatusInFlight}, To: once.StatusReview, Error: "lease ran out",
			Event: once.Event{Type: once.EventReview, From: once.StatusInFlight, Actor: once.ActorReaper, Origin: "reaper:2"}},
	}
	for _, st := range steps {
		st.Event.Key, st.Event.To = k, st.To
		if ok, err := s.Transition(ctx, st); err != nil || !ok {
			t.Fatalf("%s: %v, %v", st.Event.Type, ok, err)
		}
	}
	// The worker of attempt 1 comes back with a success: fenced, refused.
	if ok, err := s.Transition(ctx, once.Transition{Key: k, Attempt: 1, From: []once.Status{once.StatusInFlight}, To: once.StatusSucceeded,
		Result: []byte(`"late"`), Event: once.Event{Type: once.EventSucceeded, From: once.StatusInFlight, Actor: once.ActorWorker}}); err != nil || ok {
		t.Fatalf("a fenced outcome: %v, %v; want not applied", ok, err)
	}
	if _, err := c.Resolve(ctx, k, once.Resolution{Decision: once.DecisionDone, By: "ada", Note: "it went out"}); err != nil {
		t.Fatal(err)
	}
	want := "claimed(1,->in_flight,worker,w:1) taken_over(2,in_flight->in_flight,reaper,reaper:2) review(2,in_flight->review,reaper,reaper:2) " +
		"resolved(2,review->succeeded,ada,w:1)"
	if got := trail(events(t, s, k)); got != want {
		t.Fatalf("trail %s, want %s", got, want)
	}
	if n := countEvents(t, s); n != 3 {
		t.Fatalf("%d event rows written, want 3", n)
	}
}

// TestResolveFailedKeepsItsOutcome: a failure of attempt 1 is not
// written, the row tells it; a person who then resolves the action takes
// the row out of it, so the failure is written first, with its time,
// and the resolution after it. Resolving again does not write it twice.
func TestResolveFailedKeepsItsOutcome(t *testing.T) {
	ctx := context.Background()
	c, s := testdb.SQLiteClient(t, once.Config{Origin: "w:1"})
	in := once.Intent{Run: "r", Step: 1, Kind: "send_email", Target: "ada@example.com", Payload: "hi"}
	_, err := once.Do(ctx, c, in, func(context.Context, once.Attempt) (string, error) {
		return "", once.Permanent(errors.New("550 no such user"))
	})
	if err == nil {
		t.Fatal("a permanent failure reported no error")
	}
	k, _, err := once.KeyOf(in)
	if err != nil {
		t.Fatal(err)
	}
	failed, err := s.Get(ctx, k)
	if err != nil || failed.Status != once.StatusFailed || failed.Attempt != 1 {
		t.Fatalf("after a permanent failure: %+v, %v", failed, err)
	}
	if n := countEvents(t, s); n != 0 {
		t.Fatalf("the failure wrote %d event rows, want 0", n)
	}
	if _, err := c.Resolve(ctx, k, once.Resolution{Decision: once.DecisionDone, By: "ada", Note: "sent by hand"}); err != nil {
		t.Fatal(err)
	}
	want := "claimed(1,->in_flight,worker,w:1) failed(1,in_flight->failed,worker,w:1) resolved(1,failed->succeeded,ada,w:1)"
	evs := events(t, s, k)
	if got := trail(evs); got != want {
		t.Fatalf("trail %s, want %s", got, want)
	}
	if !evs[1].At.Equal(failed.CompletedAt) {
		t.Fatalf("the failure's time %v, want the row's completed_at %v when it failed", evs[1].At, failed.CompletedAt)
	}
	recent, err := s.RecentEvents(ctx, []once.EventType{once.EventFailed}, 10)
	if err != nil || trail(recent) != "failed(1,in_flight->failed,worker,w:1)" {
		t.Fatalf("recent failures: %s, %v", trail(recent), err)
	}

	// Failed again by a person, and resolved again: nothing doubles.
	in.Step = 2
	if _, err := once.Do(ctx, c, in, func(context.Context, once.Attempt) (string, error) {
		return "", once.Permanent(errors.New("550"))
	}); err == nil {
		t.Fatal("a permanent failure reported no error")
	}
	k2, _, _ := once.KeyOf(in)
	if _, err := c.Resolve(ctx, k2, once.Resolution{Decision: once.DecisionAbandon, By: "ada", Note: "abandon it"}); err != nil {
		t.Fatal(err)
	}
	// Abandoned once, it is abandoned: a second Abandon is refused.
	if _, err := c.Resolve(ctx, k2, once.Resolution{Decision: once.DecisionAbandon, By: "ada", Note: "abandon it again"}); !errors.Is(err, once.ErrConflict) {
		t.Fatalf("abandoning an abandoned action = %v, want a conflict", err)
	}
	want = "claimed(1,->in_flight,worker,w:1) failed(1,in_flight->failed,worker,w:1) resolved(1,failed->failed,ada,w:1) refused(1,failed->,ada,w:1)"
	if got := trail(events(t, s, k2)); got != want {
		t.Fatalf("trail %s, want %s", got, want)
	}
}

// TestTrailOfRowsFromBeforeTheHappyPath: rows an older build wrote have
// their claims and outcomes in the trail; after the migration their
// trails read exactly as they were written, with nothing made up beside
// them, and resolving one writes only the resolution.
func TestTrailOfRowsFromBeforeTheHappyPath(t *testing.T) {
	ctx := context.Background()
	s, _ := testdb.NewSQLite(t)
	if err := sqlite.MigrateTo(ctx, s, 6); err != nil {
		t.Fatal(err)
	}
	// As the store wrote them before: every claim and outcome an event.
	old := []struct {
		key, status string
		attempt     int
		events      [][4]string // type, attempt, from, to
	}{
		{strings.Repeat("a1", 32), "succeeded", 1, [][4]string{{"claimed", "1", "", "in_flight"}, {"succeeded", "1", "in_flight", "succeeded"}}},
		{strings.Repeat("b2", 32), "failed", 1, [][4]string{{"claimed", "1", "", "in_flight"}, {"failed", "1", "in_flight", "failed"}}},
		{strings.Repeat("c3", 32), "succeeded", 2, [][4]string{{"claimed", "1", "", "in_flight"}, {"released", "1", "in_flight", "released"},
			{"claimed", "2", "released", "in_flight"}, {"succeeded", "2", "in_flight", "succeeded"}}},
		{strings.Repeat("d4", 32), "in_flight", 1, [][4]string{{"claimed", "1", "", "in_flight"}}},
	}
	db := s.DB()
	for i, o := range old {
		completed := "NULL"
		if o.status == "succeeded" || o.status == "failed" {
			completed = "1700000005000"
		}
		if _, err := db.ExecContext(ctx, `INSERT INTO once_action (key, fingerprint, run_id, step, kind, target, status, attempt, lease_until,
    created_at, claimed_at, updated_at, completed_at, recovery) VALUES (?1, 'f', 'old', ?2, 'k', 't', ?3, ?4, 1700000060000,
    1700000000000, 1700000000000, 1700000005000, `+completed+`, 'review')`, o.key, i, o.status, o.attempt); err != nil {
			t.Fatal(err)
		}
		for j, e := range o.events {
			if _, err := db.ExecContext(ctx, `INSERT INTO once_event (key, at, type, attempt, from_status, to_status, actor, origin)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'worker', 'old-host:1')`, o.key, 1700000000000+int64(j)*1000, e[0], e[1], e[2], e[3]); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	written := 0
	for _, o := range old {
		var want []string
		for _, e := range o.events {
			want = append(want, fmt.Sprintf("%s(%s,%s->%s,worker,old-host:1)", e[0], e[1], e[2], e[3]))
		}
		evs := events(t, s, once.Key(o.key))
		if got := trail(evs); got != strings.Join(want, " ") {
			t.Errorf("%s: trail %s, want %s", o.status, got, strings.Join(want, " "))
		}
		for _, e := range evs {
			if e.ID == 0 {
				t.Errorf("%s: an event made up from the row beside the written ones: %+v", o.status, e)
			}
		}
		written += len(o.events)
	}
	recent, err := s.RecentEvents(ctx, nil, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(recent) != written {
		t.Fatalf("%d recent events, want the %d written: %s", len(recent), written, trail(recent))
	}
	for _, e := range recent {
		if e.ID == 0 {
			t.Errorf("a recent event made up from the row beside the written ones: %+v", e)
		}
	}

	c, err := once.New(once.Config{Store: s, Origin: "new-host:2"})
	if err != nil {
		t.Fatal(err)
	}
	k := once.Key(old[1].key)
	if _, err := c.Resolve(ctx, k, once.Resolution{Decision: once.DecisionDone, By: "ada", Note: "sent by hand"}); err != nil {
		t.Fatal(err)
	}
	want := "claimed(1,->in_flight,worker,old-host:1) failed(1,in_flight->failed,worker,old-host:1) resolved(1,failed->succeeded,ada,new-host:2)"
	if got := trail(events(t, s, k)); got != want {
		t.Fatalf("resolved: trail %s, want %s", got, want)
	}
	// A new key beside them follows the happy path.
	res, err := once.Do(ctx, c, once.Intent{Run: "new", Kind: "k", Target: "t"}, func(context.Context, once.Attempt) (int, error) { return 1, nil })
	if err != nil {
		t.Fatal(err)
	}
	if got, want := trail(events(t, s, res.Key)), "claimed(1,->in_flight,worker,new-host:2) succeeded(1,in_flight->succeeded,worker,new-host:2)"; got != want {
		t.Fatalf("a new key: trail %s, want %s", got, want)
	}
	if n := countEvents(t, s); n != written+1 {
		t.Fatalf("%d event rows, want the %d written before and the resolution", n, written)
	}
}

// TestPoolOfOneConnection: with the pool held to one connection, every
// operation completes, inside its own transactions and a caller's: none
// waits for a second connection (to prepare a statement) while its
// transaction holds the only one.
func TestPoolOfOneConnection(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, _ := testdb.NewSQLite(t)
	s.DB().SetMaxOpenConns(1)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := once.New(once.Config{Store: s, Origin: "one:1"})
	if err != nil {
		t.Fatal(err)
	}
	// First inside a caller's transaction, before any statement is
	// prepared, then again after.
	for i := range 2 {
		tx, err := s.DB().BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		in := once.Intent{Run: "tx", Step: int64(i), Kind: "k", Target: "t"}
		if _, err := once.DoTx(ctx, c, s, tx, in, func(context.Context, *sql.Tx, once.Attempt) (int, error) { return i, nil }); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	in := once.Intent{Run: "r", Kind: "k", Target: "t"}
	do := func(fn func(context.Context, once.Attempt) (int, error)) (once.Result[int], error) {
		return once.Do(ctx, c, in, fn)
	}
	if _, err := do(func(context.Context, once.Attempt) (int, error) { return 0, once.RetryLater(errors.New("later")) }); err == nil {
		t.Fatal("a RetryLater effect reported no error")
	}
	res, err := do(func(context.Context, once.Attempt) (int, error) { return 2, nil })
	if err != nil || res.Value != 2 {
		t.Fatalf("claimed again: %+v, %v", res, err)
	}
	if res, err := do(func(context.Context, once.Attempt) (int, error) { return 3, nil }); err != nil || !res.Replayed || res.Value != 2 {
		t.Fatalf("replay: %+v, %v", res, err)
	}
	in.Step = 1
	if _, err := do(func(context.Context, once.Attempt) (int, error) { return 0, once.Permanent(errors.New("no")) }); err == nil {
		t.Fatal("a permanent failure reported no error")
	}
	k, _, _ := once.KeyOf(in)
	if _, err := c.Resolve(ctx, k, once.Resolution{Decision: once.DecisionDone, By: "ada", Note: "by hand"}); err != nil {
		t.Fatal(err)
	}
	if got, want := trail(events(t, s, k)), "claimed(1,->in_flight,worker,one:1) failed(1,in_flight->failed,worker,one:1) resolved(1,failed->succeeded,ada,one:1)"; got != want {
		t.Fatalf("trail %s, want %s", got, want)
	}
	if _, err := s.RecentEvents(ctx, nil, 10); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Purge(ctx, once.PurgeRequest{OlderThan: time.Millisecond, Limit: 10}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Recoverable(ctx, once.RecoverRequest{Limit: 10, Hold: time.Second, Token: "h"}); err != nil {
		t.Fatal(err)
	}
}

// TestClaimReturnsTheRow: a new key's claim answers with the row it
// inserted, made from the request, not read back: it must be the row Get
// reads, whatever the request holds.
func TestClaimReturnsTheRow(t *testing.T) {
	ctx := context.Background()
	s, _ := testdb.NewSQLite(t)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	reqs := []once.ClaimRequest{
		{Fingerprint: "f", Kind: "k", Lease: time.Minute, Token: "t"},
		{Fingerprint: "f", Run: "r", Step: 7, Kind: "k", Target: "t", Payload: []byte{}, Lease: 1500 * time.Microsecond, Token: "t", Origin: "h:1",
			Recovery: once.VerifyThenDecide, Retention: 90 * time.Minute, RedriveAfter: 1500 * time.Microsecond, Redrive: true},
		{Fingerprint: "g", Run: "r", Step: -1, Kind: "send_email", Target: "ada@example.com", Payload: []byte(`{"a":1}`), Lease: time.Hour,
			Recovery: once.RetryWithProviderKey, Retention: time.Microsecond},
		{Fingerprint: "h", Kind: "k", Payload: []byte{0, 1, 2}, Lease: time.Millisecond, Recovery: once.AskPerson},
	}
	for i, req := range reqs {
		req.Key = once.Key(fmt.Sprintf("%064x", i))
		res, err := s.Claim(ctx, req)
		if err != nil || !res.Claimed {
			t.Fatalf("claim %d: %+v, %v", i, res, err)
		}
		got, err := s.Get(ctx, req.Key)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(res.Action, got) {
			t.Errorf("claim %d answered\n%+v\nbut the row reads\n%+v", i, res.Action, got)
		}
		if !res.Now.Equal(got.CreatedAt) {
			t.Errorf("claim %d: now %v, created at %v", i, res.Now, got.CreatedAt)
		}
	}
}
