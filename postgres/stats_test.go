package postgres

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncehq/once"
	"github.com/oncehq/once/storekit"
	"github.com/oncehq/once/storetest"
)

// fillFinished writes n succeeded actions of kind into table, as a log
// that grew for a while would hold them.
func fillFinished(t *testing.T, conn *pgx.Conn, table, kind string, n int) {
	t.Helper()
	if _, err := conn.Exec(context.Background(), `INSERT INTO `+table+` (key, fingerprint, run_id, step, kind, target, status, attempt, result, completed_at, retain_until)
SELECT md5($1 || g::text) || md5(g::text), '', '', g, $1, '', 'succeeded', 1, '{}', now(), now() + interval '7 days' FROM generate_series(1, $2::int) g`, kind, n); err != nil {
		t.Fatal(err)
	}
}

// A console or a metrics scrape asks for the counts often: every page,
// every fifteen seconds. On a large log, counting every finished action
// each time reads the whole log each time, and a scrape with a deadline
// fails once the log is large enough. The open statuses, which a person
// acts on, are counted at each call through their indexes; the finished
// ones are counted again only now and then.
func TestStatsOfALargeLogReadItOnlyNowAndThen(t *testing.T) {
	ctx := context.Background()
	conn, s := largeUncounted(t)
	table := s.names.Table("action")
	const finished = storekit.LiveRows + 5_000
	first, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := storetest.Counted(first, once.StatusSucceeded); got != finished {
		t.Fatalf("the first count finds %d succeeded, want %d", got, finished)
	}
	// An action claimed after the first count is counted by the next.
	if _, err := s.Claim(ctx, once.ClaimRequest{Key: once.Key(strings.Repeat("ab", 32)), Fingerprint: "f", Kind: "live", Lease: time.Hour, Token: "t"}); err != nil {
		t.Fatal(err)
	}
	const calls = 20
	for i := range calls {
		stats, err := s.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := storetest.Counted(stats, once.StatusInFlight); got != 1 {
			t.Fatalf("call %d counts %d in flight, want the 1 claimed after the first count", i, got)
		}
		if got := storetest.Counted(stats, once.StatusSucceeded); got != finished {
			t.Fatalf("call %d counts %d succeeded, want %d", i, got, finished)
		}
	}
	// The approval queue is counted with the other open statuses
	// (TestStatsOfALargeLogReadItOnlyNowAndThen failed without it).
	gated := once.ClaimRequest{Key: once.Key(strings.Repeat("cd", 32)), Fingerprint: "f", Kind: "gated", Lease: time.Hour, Token: "t2",
		Approval: time.Hour, OnExpiry: once.StatusFailed}
	if _, err := s.Claim(ctx, gated); err != nil {
		t.Fatal(err)
	}
	if stats, err := s.Stats(ctx); err != nil || storetest.Counted(stats, once.StatusAwaitingApproval) != 1 {
		t.Fatalf("a large log's counts find %d awaiting approval (%v); want 1", storetest.Counted(stats, once.StatusAwaitingApproval), err)
	}
	// One count of the whole log, and a few rows read for the open ones;
	// twice the log leaves room for one count again in between.
	if read := scanned(t, conn, s, table, 0); read >= 2*finished {
		t.Fatalf("%d calls of Stats read %d rows of a log of %d: each call counted the whole log", calls+1, read, finished)
	}
}

// Counts made now and then catch up with the log, and say when they were
// made; a small log is counted whole at every call.
func TestStatsOfALargeLogCatchUp(t *testing.T) {
	ctx := context.Background()
	conn, s := planStoreWith(t, nil)
	table := s.names.Table("action")
	s.counts.Every = func(time.Duration) time.Duration { return 0 }
	fillFinished(t, conn, table, "small", 10)
	stats, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range stats {
		if !c.AsOf.IsZero() {
			t.Fatalf("a small log's count %+v says it was made earlier; it is made by each call", c)
		}
	}
	fillFinished(t, conn, table, "bulk", storekit.LiveRows)
	stats, err = s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := storetest.Counted(stats, once.StatusSucceeded); got != storekit.LiveRows+10 {
		t.Fatalf("a count of the whole log finds %d succeeded, want %d", got, storekit.LiveRows+10)
	}
	before := time.Now()
	fillFinished(t, conn, table, "later", 7)
	deadline := time.Now().Add(30 * time.Second)
	for {
		stats, err := s.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := storetest.Counted(stats, once.StatusSucceeded); got == storekit.LiveRows+17 {
			for _, c := range stats {
				if c.Status == once.StatusSucceeded && c.AsOf.Before(before.Add(-time.Second)) {
					t.Fatalf("the count %+v includes actions written after it says it was made (%v)", c, before)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the counts never caught up with the log: %d succeeded, want %d (%s)", storetest.Counted(stats, once.StatusSucceeded), storekit.LiveRows+17, strconv.Quote(table))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A caller with a deadline shorter than a count of the whole log (a
// metrics scrape's, on a log of tens of millions) got an error from
// every call, for ever: each call started the count again, and none
// finished. The count a call gives up on goes on in the background, and
// later calls answer from it.
func TestStatsOfALogTooLargeToCountInADeadlineAnswerLater(t *testing.T) {
	ctx := context.Background()
	_, s := largeUncounted(t)
	const finished = storekit.LiveRows + 5_000
	// Far shorter than a count of the log (tens of milliseconds), and
	// long enough for the open statuses' counts, read by their indexes.
	const deadline = 10 * time.Millisecond
	call := func() ([]once.StatusCount, error) {
		cctx, cancel := context.WithTimeout(ctx, deadline)
		defer cancel()
		return s.Stats(cctx)
	}
	var errs []error
	for give := time.Now().Add(20 * time.Second); time.Now().Before(give); {
		stats, err := call()
		if err == nil {
			if got := storetest.Counted(stats, once.StatusSucceeded); got != finished {
				t.Fatalf("%d succeeded counted, want %d", got, finished)
			}
			return
		}
		errs = append(errs, err)
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("every call with a deadline of %v failed (%d calls; the last: %v): none of them could count the log", deadline, len(errs), errs[len(errs)-1])
}

// largeUncounted is a store over the test's pool whose log, of
// storekit.LiveRows+5,000 finished actions, the statistics say is large, and
// which has not counted it yet.
func largeUncounted(t *testing.T) (*pgx.Conn, *Store) {
	t.Helper()
	conn, s := planStoreWith(t, nil)
	table := s.names.Table("action")
	fillFinished(t, conn, table, "bulk", storekit.LiveRows+5_000)
	if _, err := conn.Exec(context.Background(), `ANALYZE `+table); err != nil {
		t.Fatal(err)
	}
	return conn, s
}

// A store over the caller's pool still answers Stats after Close; with no
// count made, and none to be started, it says so at once, instead of
// waiting for a count that never comes.
func TestStatsAfterCloseAnswersAtOnce(t *testing.T) {
	_, s := largeUncounted(t)
	s.Close()
	done := make(chan error, 1)
	go func() {
		_, err := s.Stats(context.Background())
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "closed") {
			t.Fatalf("Stats after Close = %v; want an error saying the store is closed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Stats after Close, with no deadline, never returned")
	}
}

// Close while the first count starts: no count starts after Close
// returns (the race detector watches the wait group).
func TestStatsRacingClose(t *testing.T) {
	_, s := largeUncounted(t)
	for i := range 20 {
		s := &Store{db: s.db, pool: s.pool, names: s.names, q: s.q, log: s.log}
		c := newCounts(s)
		s.counts = c
		stopped := make(chan struct{})
		go func() {
			defer close(stopped)
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			s.Stats(ctx)
		}()
		time.Sleep(time.Duration(i%5) * time.Millisecond)
		c.Close()
		counting := c.Counting()
		<-stopped
		if counting {
			t.Fatalf("round %d: a count runs after close returned", i)
		}
	}
}

// A log that grew past storekit.LiveRows after its first count (an
// import, a restore) is counted in the background from the first call that
// could not count it within its deadline.
func TestStatsOfALogThatGrewPastItsFirstCountAnswerLater(t *testing.T) {
	ctx := context.Background()
	conn, s := planStoreWith(t, nil)
	table := s.names.Table("action")
	fillFinished(t, conn, table, "small", 10)
	if _, err := s.Stats(ctx); err != nil {
		t.Fatal(err)
	}
	fillFinished(t, conn, table, "bulk", storekit.LiveRows+5_000)
	if _, err := conn.Exec(ctx, `ANALYZE `+table); err != nil {
		t.Fatal(err)
	}
	const deadline = 10 * time.Millisecond
	var last error
	for give := time.Now().Add(20 * time.Second); time.Now().Before(give); time.Sleep(50 * time.Millisecond) {
		cctx, cancel := context.WithTimeout(ctx, deadline)
		stats, err := s.Stats(cctx)
		cancel()
		if err == nil && storetest.Counted(stats, once.StatusSucceeded) == storekit.LiveRows+5_010 {
			return
		}
		last = err
	}
	t.Fatalf("no call with a deadline of %v counted the grown log (the last: %v)", deadline, last)
}

// The cells come in the same order whether the log is counted whole or
// in two parts, whatever the column's collation.
func TestStatsOrderDoesNotDependOnTheLogsSize(t *testing.T) {
	ctx := context.Background()
	conn, s := planStoreWith(t, nil)
	table := s.names.Table("action")
	if _, err := conn.Exec(ctx, `ALTER TABLE `+table+` ALTER COLUMN kind TYPE text COLLATE "und-x-icu"`); err != nil {
		t.Skipf("no ICU collation to order kinds by: %v", err)
	}
	fillFinished(t, conn, table, "charge", 5)
	fillFinished(t, conn, table, "Email", 5)
	kinds := func() []string {
		stats, err := s.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ks []string
		for _, c := range stats {
			ks = append(ks, c.Kind)
		}
		return ks
	}
	small := kinds()
	fillFinished(t, conn, table, "bulk", storekit.LiveRows)
	kinds() // the count that finds the log large
	large := kinds()
	if !slices.Contains(large, "bulk") || !slices.Equal(slices.DeleteFunc(slices.Clone(large), func(k string) bool { return k == "bulk" }), small) {
		t.Fatalf("a small log's kinds come as %q, a large one's as %q", small, large)
	}
}
