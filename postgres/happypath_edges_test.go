package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncehq/once"
	"github.com/oncehq/once/postgres"
)

// The edges of the unwritten happy path: what the trail says when a
// decision, a purge, a caller's transaction or a schema from before
// migration 008 meets the events the row stands for.

var onlyFailed = []once.Status{once.StatusFailed}

// hpKey is a key of its own for each name.
func hpKey(name string) once.Key {
	k, _, err := once.KeyOf(once.Intent{Run: "hp", Step: 1, Kind: "send_email", Target: name, Payload: name})
	if err != nil {
		panic(err)
	}
	return k
}

// hpClaim claims k as attempt 1, from origin.
func hpClaim(t *testing.T, s once.Store, k once.Key, origin string) {
	t.Helper()
	res, err := s.Claim(context.Background(), once.ClaimRequest{Key: k, Fingerprint: "f", Run: "hp", Step: 1, Kind: "send_email",
		Target: "t", Lease: time.Minute, Token: "claim", Origin: origin})
	if err != nil || !res.Claimed {
		t.Fatalf("claim: %+v, %v", res, err)
	}
}

// hpMove applies t and fails unless it applied.
func hpMove(t *testing.T, s once.Store, tr once.Transition) {
	t.Helper()
	tr.Event.Key, tr.Event.Attempt, tr.Event.To = tr.Key, tr.Attempt, tr.To
	if tr.NewAttempt {
		tr.Event.Attempt++
	}
	if ok, err := s.Transition(context.Background(), tr); err != nil || !ok {
		t.Fatalf("transition %s -> %s: %v, %v", tr.From, tr.To, ok, err)
	}
}

// workerOutcome is the transition a worker records for attempt, from
// the status it stands in.
func workerOutcome(k once.Key, attempt int, from, to once.Status, origin string) once.Transition {
	tr := once.Transition{Key: k, Attempt: attempt, From: []once.Status{from}, To: to, Token: "w" + string(to) + string(from),
		Event: once.Event{Type: once.EventType(to), From: from, Actor: once.ActorWorker, Origin: origin}}
	if to == once.StatusSucceeded {
		tr.Result = []byte(`"sent"`)
	} else {
		tr.Error = "550 mailbox does not exist"
	}
	return tr
}

// hpFailFirst claims k and records the worker's permanent failure of
// attempt 1: the row alone tells it.
func hpFailFirst(t *testing.T, s once.Store, k once.Key) {
	t.Helper()
	hpClaim(t, s, k, "w:1")
	hpMove(t, s, workerOutcome(k, 1, once.StatusInFlight, once.StatusFailed, "w:1"))
}

// writtenEvents counts the event rows written for k, of typ if not empty.
func writtenEvents(t *testing.T, s *postgres.Store, schema string, k once.Key, typ once.EventType) int {
	t.Helper()
	var n int
	if err := s.Pool().QueryRow(context.Background(), `SELECT count(*) FROM `+tableOf(schema, "event")+` WHERE key = $1 AND ($2 = '' OR type = $2)`,
		string(k), string(typ)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// types is a trail's event types, joined by commas.
func types(evs []once.Event) string {
	var b []string
	for _, e := range evs {
		b = append(b, string(e.Type))
	}
	return strings.Join(b, ",")
}

// recentOf is RecentEvents(nil) for k alone, newest first.
func recentOf(t *testing.T, s once.Store, k once.Key) []once.Event {
	t.Helper()
	all, err := s.RecentEvents(context.Background(), nil, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var out []once.Event
	for _, e := range all {
		if e.Key == k {
			out = append(out, e)
		}
	}
	return out
}

// blockedOrDone returns when a statement on schema's tables waits for a
// lock held elsewhere, or when done delivers (its value is then
// returned, with true).
func blockedOrDone(t *testing.T, s *postgres.Store, schema string, done <-chan error) (error, bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-done:
			return err, true
		default:
		}
		var n int
		if err := s.Pool().QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid() AND strpos(query, $1) > 0`, schema).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return nil, false
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("the decision neither finished nor waited for a lock")
	return nil, false
}

// TestKeptOutcomeIsWrittenOnce: two decisions on the same failed first
// attempt whose statements overlap (two people deciding, or one
// deciding again while a first try still runs on a connection that
// stopped answering) write the failure out once. The transaction here
// stands for the window of the first decision's statement: it has
// written the failure out and not yet committed; it holds no hold
// token, so its own transition changes nothing.
func TestKeptOutcomeIsWrittenOnce(t *testing.T) {
	s, schema := newStore(t)
	ctx := context.Background()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := once.New(once.Config{Store: s, Origin: "ops-host:1"})
	if err != nil {
		t.Fatal(err)
	}
	k := hpKey("twice")
	hpFailFirst(t, s, k)

	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	first := once.Transition{Key: k, Attempt: 1, From: onlyFailed, To: once.StatusReleased, Hold: "not-held", Error: "released by ann",
		Event: once.Event{Key: k, Attempt: 1, Type: once.EventResolved, From: once.StatusFailed, To: once.StatusReleased, Actor: "ann", Note: "retry: checked"}}
	if ok, err := s.BindTx(tx).Transition(ctx, first); err != nil || ok {
		t.Fatalf("the held-back decision: %v, %v; want it to change nothing", ok, err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.Resolve(ctx, k, once.Resolution{Decision: once.DecisionRetry, By: "bob", Note: "checked too", Attempt: 1})
		done <- err
	}()
	err, finished := blockedOrDone(t, s, schema, done)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if !finished {
		err = <-done
	}
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	if n := writtenEvents(t, s, schema, k, once.EventFailed); n != 1 {
		t.Errorf("the failure of attempt 1 was written out %d times, want once", n)
	}
	evs, err := s.Events(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if got := types(evs); got != "claimed,failed,resolved" {
		t.Errorf("trail %s, want claimed,failed,resolved", got)
	}
	if got := types(recentOf(t, s, k)); got != "resolved,failed,claimed" {
		t.Errorf("recent events %s, want resolved,failed,claimed", got)
	}
}

// TestKeptOutcomeRacesPurge: a decision on a failed first attempt that
// meets a purge of the same action leaves nothing of it behind. An
// event written for a row the purge is deleting outlives it (the purge
// deletes the events its statement saw), and a later action with the
// same key (a delivery after the retention) then shows the old failure
// in its own trail.
func TestKeptOutcomeRacesPurge(t *testing.T) {
	s, schema := newStore(t)
	ctx := context.Background()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := once.New(once.Config{Store: s, Origin: "ops-host:1"})
	if err != nil {
		t.Fatal(err)
	}
	k := hpKey("purged")
	hpFailFirst(t, s, k)
	if _, err := s.Pool().Exec(ctx, `UPDATE `+tableOf(schema, "action")+` SET retain_until = now() - interval '1 second' WHERE key = $1`, string(k)); err != nil {
		t.Fatal(err)
	}

	// The purge has deleted the row and its events, and not committed.
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if n, err := s.BindTx(tx).Purge(ctx, once.PurgeRequest{Limit: 10}); err != nil || n != 1 {
		t.Fatalf("purge: %d, %v", n, err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.Resolve(ctx, k, once.Resolution{Decision: once.DecisionRetry, By: "ops", Note: "checked", Attempt: 1})
		done <- err
	}()
	err, finished := blockedOrDone(t, s, schema, done)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if !finished {
		err = <-done
	}
	if !errors.Is(err, once.ErrNotFound) {
		t.Logf("Resolve of a purged action: %v", err)
	}
	if n := writtenEvents(t, s, schema, k, ""); n != 0 {
		t.Errorf("%d events of the purged action outlive it, want none", n)
	}

	// The same key again, later: its trail is its own.
	hpClaim(t, s, k, "w:2")
	hpMove(t, s, workerOutcome(k, 1, once.StatusInFlight, once.StatusSucceeded, "w:2"))
	evs, err := s.Events(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if got := types(evs); got != "claimed,succeeded" {
		t.Errorf("the new action's trail %s, want claimed,succeeded", got)
	}
}

// TestRecentEventsOrderInOneTransaction: an action claimed and
// succeeded in one transaction (DoTx) has its claim and its success at
// the same time, now() of the transaction; RecentEvents still lists the
// success as the newer, as it did when both were written (by id).
func TestRecentEventsOrderInOneTransaction(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := once.New(once.Config{Store: s, Origin: "tx-host:1"})
	if err != nil {
		t.Fatal(err)
	}
	var keys []once.Key
	for i := range 5 {
		tx, err := s.Pool().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		in := once.Intent{Run: "tx", Step: int64(i), Kind: "ledger", Target: "acct", Payload: i}
		res, err := once.DoTx(ctx, c, s, tx, in, func(context.Context, pgx.Tx, once.Attempt) (int, error) { return i, nil })
		if err != nil {
			tx.Rollback(ctx)
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, res.Key)
	}
	for _, k := range keys {
		evs, err := s.Events(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if got := types(evs); got != "claimed,succeeded" {
			t.Errorf("%s: trail %s, want claimed,succeeded", k[:8], got)
		}
		if got := types(recentOf(t, s, k)); got != "succeeded,claimed" {
			t.Errorf("%s: recent events, newest first, %s; want succeeded,claimed", k[:8], got)
		}
	}
	// Across actions too: the newest action's success comes first.
	recent, err := s.RecentEvents(ctx, nil, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(recent) != 2 || recent[0].Key != keys[4] || recent[0].Type != once.EventSucceeded {
		t.Errorf("RecentEvents(nil, 2) = %s of %v; want the last action's success first", types(recent), recent)
	}
}

// TestClaimedBefore008OutcomeNamesItsProcess: an action claimed before
// migration 008 (its claim written to the trail, its row with no
// origin) and finished after it: the worker's outcome, read back from
// the row, names the process that claimed it, as the written claim
// does, and so does the outcome a decision writes out.
func TestClaimedBefore008OutcomeNamesItsProcess(t *testing.T) {
	s, schema := newStore(t)
	ctx := context.Background()
	ms, err := postgres.Migrations(postgres.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(ms, func(m once.Migration) bool { return m.Version == 8 })
	if i < 0 {
		t.Fatal("no migration 8")
	}
	// The schema as version 7 left it, and two actions claimed then, as
	// that version's claim wrote them: the row, and a claimed event.
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	mt := tableOf(schema, "migration")
	for _, stmt := range []string{`CREATE SCHEMA ` + pgx.Identifier{schema}.Sanitize(),
		`CREATE TABLE ` + mt + ` (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`} {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range ms[:i] {
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			t.Fatalf("migration %d: %v", m.Version, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+mt+` (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
			t.Fatal(err)
		}
	}
	ok, failed := hpKey("old-ok"), hpKey("old-failed")
	for _, k := range []once.Key{ok, failed} {
		if _, err := tx.Exec(ctx, `INSERT INTO `+tableOf(schema, "action")+` (key, fingerprint, run_id, step, kind, target, status, attempt, lease_until, token)
			VALUES ($1, 'f', 'hp', 1, 'send_email', 't', 'in_flight', 1, now() + interval '1 hour', 'claim')`, string(k)); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+tableOf(schema, "event")+` (key, type, attempt, from_status, to_status, actor, origin)
			VALUES ($1, 'claimed', 1, '', 'in_flight', 'worker', 'old-host:7')`, string(k)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// Their workers, still running, record their outcomes now.
	hpMove(t, s, workerOutcome(ok, 1, once.StatusInFlight, once.StatusSucceeded, "old-host:7"))
	hpMove(t, s, workerOutcome(failed, 1, once.StatusInFlight, once.StatusFailed, "old-host:7"))
	c, err := once.New(once.Config{Store: s, Origin: "ops-host:1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Resolve(ctx, failed, once.Resolution{Decision: once.DecisionAbandon, By: "ops", Note: "bounced", Attempt: 1}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		k    once.Key
		want string
	}{
		{ok, "claimed(1,->in_flight,worker,old-host:7) succeeded(1,in_flight->succeeded,worker,old-host:7)"},
		{failed, "claimed(1,->in_flight,worker,old-host:7) failed(1,in_flight->failed,worker,old-host:7) resolved(1,failed->failed,ops,ops-host:1)"},
	} {
		evs, err := s.Events(ctx, c.k)
		if err != nil {
			t.Fatal(err)
		}
		if got := trail(evs); got != c.want {
			t.Errorf("trail %s\nwant  %s", got, c.want)
		}
		recent := recentOf(t, s, c.k)
		slices.Reverse(recent)
		if got := trail(recent); got != c.want {
			t.Errorf("recent events, oldest first, %s\nwant  %s", got, c.want)
		}
	}
}

// TestTrailReadsAgree: for the paths off the happy one that meet an
// unwritten event (a decision on a failure, a late outcome after a
// review, an abandon or a verification, a takeover), Events and
// RecentEvents tell the same trail, once each, in order.
func TestTrailReadsAgree(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := once.New(once.Config{Store: s, Origin: "ops-host:1"})
	if err != nil {
		t.Fatal(err)
	}
	resolve := func(k once.Key, d once.Decision) {
		t.Helper()
		if _, err := c.Resolve(ctx, k, once.Resolution{Decision: d, By: "ops", Note: "checked", Attempt: 1}); err != nil {
			t.Fatal(err)
		}
	}
	reaper := func(k once.Key, attempt int, from, to once.Status, typ once.EventType, newAttempt bool) once.Transition {
		tr := once.Transition{Key: k, Attempt: attempt, From: []once.Status{from}, To: to, NewAttempt: newAttempt,
			Event: once.Event{Type: typ, From: from, Actor: once.ActorReaper, Origin: "reaper:1"}}
		if to == once.StatusInFlight {
			tr.Lease = time.Minute
		}
		if to == once.StatusSucceeded {
			tr.Result = []byte(`"found"`)
		}
		return tr
	}
	refuse := func(k once.Key, to once.Status) {
		t.Helper()
		if err := s.AppendEvent(ctx, once.Event{Key: k, Type: once.EventRefused, Attempt: 1, To: to, Actor: once.ActorWorker, Origin: "w:1",
			Note: "late outcome of attempt 1 refused"}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name  string
		run   func(k once.Key)
		trail string
	}{
		{"success", func(k once.Key) {
			hpClaim(t, s, k, "w:1")
			hpMove(t, s, workerOutcome(k, 1, once.StatusInFlight, once.StatusSucceeded, "w:1"))
		}, "claimed,succeeded"},
		{"failure then done", func(k once.Key) {
			hpFailFirst(t, s, k)
			resolve(k, once.DecisionDone)
		}, "claimed,failed,resolved"},
		{"failure then retry, run again", func(k once.Key) {
			hpFailFirst(t, s, k)
			resolve(k, once.DecisionRetry)
			if res, err := s.Claim(ctx, once.ClaimRequest{Key: k, Fingerprint: "f", Run: "hp", Step: 1, Kind: "send_email", Target: "t",
				Lease: time.Minute, Token: "c2", Origin: "w:2"}); err != nil || !res.Claimed || res.Action.Attempt != 2 {
				t.Fatalf("claim again: %+v, %v", res, err)
			}
			hpMove(t, s, workerOutcome(k, 2, once.StatusInFlight, once.StatusSucceeded, "w:2"))
		}, "claimed,failed,resolved,claimed,succeeded"},
		{"review then late success", func(k once.Key) {
			hpClaim(t, s, k, "w:1")
			hpMove(t, s, reaper(k, 1, once.StatusInFlight, once.StatusReview, once.EventReview, false))
			hpMove(t, s, workerOutcome(k, 1, once.StatusReview, once.StatusSucceeded, "w:1"))
		}, "claimed,review,succeeded"},
		{"review, abandon, late success", func(k once.Key) {
			hpClaim(t, s, k, "w:1")
			hpMove(t, s, reaper(k, 1, once.StatusInFlight, once.StatusReview, once.EventReview, false))
			resolve(k, once.DecisionAbandon)
			hpMove(t, s, workerOutcome(k, 1, once.StatusFailed, once.StatusSucceeded, "w:1"))
		}, "claimed,review,resolved,succeeded"},
		{"verified, late success refused", func(k once.Key) {
			hpClaim(t, s, k, "w:1")
			hpMove(t, s, reaper(k, 1, once.StatusInFlight, once.StatusSucceeded, once.EventVerified, false))
			if ok, err := s.Transition(ctx, workerOutcome(k, 1, once.StatusInFlight, once.StatusSucceeded, "w:1")); err != nil || ok {
				t.Fatalf("the late success applied over a verification: %v, %v", ok, err)
			}
			refuse(k, once.StatusSucceeded)
		}, "claimed,verified,refused"},
		{"unknown, verified", func(k once.Key) {
			hpClaim(t, s, k, "w:1")
			tr := workerOutcome(k, 1, once.StatusInFlight, once.StatusUnknown, "w:1")
			tr.Event.Type, tr.Lease = once.EventUnknown, time.Millisecond
			hpMove(t, s, tr)
			hpMove(t, s, reaper(k, 1, once.StatusUnknown, once.StatusSucceeded, once.EventVerified, false))
		}, "claimed,unknown,verified"},
		{"taken over, late failure refused", func(k once.Key) {
			hpClaim(t, s, k, "w:1")
			hpMove(t, s, reaper(k, 1, once.StatusInFlight, once.StatusInFlight, once.EventTakenOver, true))
			hpMove(t, s, workerOutcome(k, 2, once.StatusInFlight, once.StatusSucceeded, "reaper:1"))
			refuse(k, once.StatusFailed)
		}, "claimed,taken_over,succeeded,refused"},
		{"verifier could not tell, then the worker's success", func(k once.Key) {
			hpClaim(t, s, k, "w:1")
			tr := reaper(k, 1, once.StatusInFlight, once.StatusInFlight, once.EventVerifyFailed, false)
			tr.VerifyFailures = 1
			hpMove(t, s, tr)
			hpMove(t, s, workerOutcome(k, 1, once.StatusInFlight, once.StatusSucceeded, "w:1"))
		}, "claimed,verify_failed,succeeded"},
		{"released by the reaper, late failure", func(k once.Key) {
			hpClaim(t, s, k, "w:1")
			hpMove(t, s, reaper(k, 1, once.StatusInFlight, once.StatusReleased, once.EventReleased, false))
			hpMove(t, s, workerOutcome(k, 1, once.StatusReleased, once.StatusFailed, "w:1"))
			resolve(k, once.DecisionRetry)
		}, "claimed,released,failed,resolved"},
		{"success, refused decision", func(k once.Key) {
			hpClaim(t, s, k, "w:1")
			hpMove(t, s, workerOutcome(k, 1, once.StatusInFlight, once.StatusSucceeded, "w:1"))
			if _, err := c.Resolve(ctx, k, once.Resolution{Decision: once.DecisionRetry, By: "ops", Note: "late", Attempt: 1}); err == nil {
				t.Fatal("a decision on a success applied")
			}
		}, "claimed,succeeded,refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := hpKey(tc.name)
			tc.run(k)
			evs, err := s.Events(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			if got := types(evs); got != tc.trail {
				t.Fatalf("trail %s, want %s", got, tc.trail)
			}
			recent := recentOf(t, s, k)
			slices.Reverse(recent)
			if got, want := sig(recent), sig(evs); got != want {
				t.Fatalf("RecentEvents, oldest first:\n%s\nEvents:\n%s", got, want)
			}
			for i := 1; i < len(evs); i++ {
				if evs[i].At.Before(evs[i-1].At) {
					t.Fatalf("event %d (%s at %v) is before the one it follows (%s at %v)", i, evs[i].Type, evs[i].At, evs[i-1].Type, evs[i-1].At)
				}
			}
		})
	}
}

// sig is a trail with everything its readers show.
func sig(evs []once.Event) string {
	var b []string
	for _, e := range evs {
		b = append(b, fmt.Sprintf("%d %s %s(%d,%s->%s,%s,%s) %q", e.ID, e.At.Format(time.RFC3339Nano), e.Type, e.Attempt, e.From, e.To, e.Actor, e.Origin, e.Note))
	}
	return strings.Join(b, "\n")
}

// TestKeptOutcomeKeepsItsPlace: a failure written out by a decision
// goes where it happened in the trail, before whatever was written
// between the failure and the decision (here a decision refused, made
// on a page of another attempt), as it stood when the trail was read
// before the decision.
func TestKeptOutcomeKeepsItsPlace(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := once.New(once.Config{Store: s, Origin: "ops-host:1"})
	if err != nil {
		t.Fatal(err)
	}
	k := hpKey("place")
	hpFailFirst(t, s, k)
	if _, err := c.Resolve(ctx, k, once.Resolution{Decision: once.DecisionRetry, By: "ops", Note: "stale page", Attempt: 2}); err == nil {
		t.Fatal("a decision on another attempt applied")
	}
	before, err := s.Events(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if got := types(before); got != "claimed,failed,refused" {
		t.Fatalf("trail before the decision %s, want claimed,failed,refused", got)
	}
	if _, err := c.Resolve(ctx, k, once.Resolution{Decision: once.DecisionAbandon, By: "ops", Note: "bounced", Attempt: 1}); err != nil {
		t.Fatal(err)
	}
	evs, err := s.Events(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if got := types(evs); got != "claimed,failed,refused,resolved" {
		t.Errorf("trail after the decision %s, want claimed,failed,refused,resolved", got)
	}
	recent := recentOf(t, s, k)
	slices.Reverse(recent)
	if got := types(recent); got != "claimed,failed,refused,resolved" {
		t.Errorf("recent events, oldest first, %s; want claimed,failed,refused,resolved", got)
	}
}
