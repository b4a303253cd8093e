package sqlite_test

import (
	"context"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/sqlite"
	"github.com/oncehq/once/storetest"
)

// fillFinished writes n succeeded actions of kind straight into the
// store's file, as a log that grew for a while would hold them.
func fillFinished(t *testing.T, s *sqlite.Store, kind string, n int) {
	t.Helper()
	now := time.Now().UnixMilli()
	if _, err := s.DB().Exec(`WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < ?2)
INSERT INTO once_action (key, fingerprint, run_id, step, kind, target, status, attempt, result, created_at, claimed_at, updated_at, completed_at, retain_until)
SELECT printf('%s-%064d', ?1, i), '', '', i, ?1, '', 'succeeded', 1, '{}', ?3, ?3, ?3, ?3, ?3 + 604800000 FROM g`, kind, n, now); err != nil {
		t.Fatal(err)
	}
}

// live is how many finished actions the tests' logs may hold and be
// counted whole at every call, which the store allows a hundred
// thousand: a log past it is large, for less than it costs to write.
const live = 1_000

// largeLog is a migrated store whose log holds more finished actions
// than Stats counts at every call: finished of them.
func largeLog(t *testing.T) (s *sqlite.Store, finished int64) {
	t.Helper()
	s, _ = groupStore(t)
	sqlite.SetStatsLive(s, live)
	fillFinished(t, s, "bulk", live+50)
	return s, live + 50
}

// A console or a metrics scrape asks for the counts often: every page,
// every fifteen seconds. The SQLite store counted its whole log at each
// call, in the application's own process: 1.5 s of a core at two million
// actions. The open statuses are counted at each call through their
// indexes; the finished ones are counted again only now and then, and
// say when.
func TestStatsOfALargeLogCountItOnlyNowAndThen(t *testing.T) {
	ctx := context.Background()
	s, finished := largeLog(t)
	before := time.Now()
	first, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := storetest.Counted(first, once.StatusSucceeded); got != finished {
		t.Fatalf("the first count finds %d succeeded, want %d", got, finished)
	}
	// Claimed after the first count: counted by the next call. Finished
	// after it: not, until the next count of the finished actions, which
	// is not due for a minute.
	if _, err := s.Claim(ctx, newClaim("live")); err != nil {
		t.Fatal(err)
	}
	fillFinished(t, s, "later", 10)
	for i := range 20 {
		stats, err := s.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := storetest.Counted(stats, once.StatusInFlight); got != 1 {
			t.Fatalf("call %d counts %d in flight, want the 1 claimed after the first count", i, got)
		}
		if got := storetest.Counted(stats, once.StatusSucceeded); got != finished {
			t.Fatalf("call %d counts %d succeeded, want the %d of the first count: it counted the whole log again", i, got, finished)
		}
		for _, c := range stats {
			if c.Status == once.StatusSucceeded && (c.AsOf.Before(before) || c.AsOf.After(time.Now())) {
				t.Fatalf("call %d: %+v does not say when it was counted", i, c)
			}
		}
	}
}

// A caller with a deadline shorter than a count of the whole log (a
// metrics scrape's, on a log of tens of millions) is answered once a
// count it gave up on, which goes on in the background, is made.
func TestStatsOfALogTooLargeToCountInADeadlineAnswerLater(t *testing.T) {
	ctx := context.Background()
	// A log large enough for a count to outlast the deadline.
	s, _ := groupStore(t)
	sqlite.SetStatsLive(s, live)
	const finished = 30_000
	fillFinished(t, s, "bulk", finished)
	// Far shorter than a count of the log, and long enough for the
	// open statuses' counts, read by their indexes.
	const deadline = 10 * time.Millisecond
	give := time.Now().Add(30 * time.Second)
	for i := 0; ; i++ {
		cctx, cancel := context.WithTimeout(ctx, deadline)
		stats, err := s.Stats(cctx)
		cancel()
		if err == nil {
			if got := storetest.Counted(stats, once.StatusSucceeded); got != finished {
				t.Fatalf("call %d counts %d succeeded, want %d", i, got, finished)
			}
			return
		}
		if time.Now().After(give) {
			t.Fatalf("%d calls with a deadline of %v, none answered: %v", i+1, deadline, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A small log is counted whole at every call; once large, counts made
// now and then catch up with it.
func TestStatsOfALargeLogCatchUp(t *testing.T) {
	ctx := context.Background()
	s, _ := groupStore(t)
	sqlite.SetStatsEvery(s, func(time.Duration) time.Duration { return 0 })
	sqlite.SetStatsLive(s, live)
	fillFinished(t, s, "small", 10)
	stats, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range stats {
		if !c.AsOf.IsZero() {
			t.Fatalf("a small log's count %+v says it was made earlier; it is made by each call", c)
		}
	}
	fillFinished(t, s, "bulk", live)
	if stats, err = s.Stats(ctx); err != nil {
		t.Fatal(err)
	}
	if got := storetest.Counted(stats, once.StatusSucceeded); got != live+10 {
		t.Fatalf("a count of the whole log finds %d succeeded, want %d", got, live+10)
	}
	fillFinished(t, s, "later", 7)
	deadline := time.Now().Add(30 * time.Second)
	for {
		stats, err := s.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if storetest.Counted(stats, once.StatusSucceeded) == live+17 {
			for _, c := range stats {
				if c.Status == once.StatusSucceeded && c.AsOf.IsZero() {
					t.Fatalf("a large log's count %+v does not say when it was made", c)
				}
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the counts never caught up with the log: %d succeeded, want %d", storetest.Counted(stats, once.StatusSucceeded), live+17)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A large log's open statuses are counted through their indexes at each
// call: the approval queue and approved actions among them, or the
// console's overview says nobody waits for a person.
func TestStatsOfALargeLogCountTheApprovalQueue(t *testing.T) {
	ctx := context.Background()
	s, _ := largeLog(t)
	if _, err := s.Stats(ctx); err != nil {
		t.Fatal(err)
	}
	for i, status := range []once.Status{once.StatusAwaitingApproval, once.StatusApproved} {
		req := newClaim("gated-" + string(status))
		req.Approval, req.OnExpiry = time.Hour, once.StatusFailed
		cr, err := s.Claim(ctx, req)
		if err != nil || cr.Action.Status != once.StatusAwaitingApproval {
			t.Fatalf("claim %d = %+v, %v", i, cr, err)
		}
		if status == once.StatusApproved {
			if ok, err := s.Transition(ctx, once.Transition{Key: req.Key, Attempt: 1, From: []once.Status{once.StatusAwaitingApproval}, To: once.StatusApproved,
				Event: once.Event{Type: once.EventApproved, From: once.StatusAwaitingApproval, Actor: "ada"}}); !ok || err != nil {
				t.Fatalf("approve = %v, %v", ok, err)
			}
		}
	}
	stats, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, status := range []once.Status{once.StatusAwaitingApproval, once.StatusApproved} {
		if got := storetest.Counted(stats, status); got != 1 {
			t.Errorf("a large log's counts find %d %s; want 1", got, status)
		}
	}
}
