package linearize_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/lab/linearize"
)

// The recorder and the model together catch what a broken ledger does,
// not only histories written by hand: over a real SQLite store made
// wrong on purpose, a few Do calls give a history porcupine rejects.

// unarbitrated is a store whose claim lets a second caller win a key
// another attempt holds: "check, then send".
type unarbitrated struct{ once.Store }

func (s unarbitrated) Claim(ctx context.Context, req once.ClaimRequest) (once.ClaimResult, error) {
	cr, err := s.Store.Claim(ctx, req)
	if err == nil && !cr.Claimed && cr.Action.Status == once.StatusInFlight {
		cr.Claimed = true
	}
	return cr, err
}

// unfenced is a store whose transitions apply to the row as it stands,
// whatever attempt and status it is at, and whose heartbeats never get
// through (a worker cut off).
type unfenced struct{ once.Store }

func (s unfenced) Transition(ctx context.Context, t once.Transition) (bool, error) {
	if cur, err := s.Get(ctx, t.Key); err == nil {
		t.Attempt, t.From = cur.Attempt, []once.Status{cur.Status}
	}
	return s.Store.Transition(ctx, t)
}

func (s unfenced) Heartbeat(context.Context, once.Key, int, time.Duration) (time.Time, bool, error) {
	return time.Time{}, false, errors.New("connection refused")
}

func TestCheckerSeesABrokenStore(t *testing.T) {
	t.Run("two callers win the same claim", func(t *testing.T) {
		s, _ := testdb.NewSQLite(t)
		if err := s.Migrate(context.Background()); err != nil {
			t.Fatal(err)
		}
		rec := linearize.NewRecorder()
		c, err := once.New(once.Config{Store: unarbitrated{s}, Hooks: rec.Hooks()})
		if err != nil {
			t.Fatal(err)
		}
		in := once.Intent{Run: "broken", Kind: kindEmail, Target: "ada@example.com"}
		both := make(chan struct{})
		var arrived sync.WaitGroup
		arrived.Add(2)
		effect := func(context.Context, once.Attempt) (string, error) {
			arrived.Done()
			select {
			case <-both:
			case <-time.After(10 * time.Second):
			}
			return "sent", nil
		}
		go func() {
			arrived.Wait()
			close(both)
		}()
		var wg sync.WaitGroup
		for id := range 2 {
			wg.Go(func() { linearize.Do(context.Background(), rec, id, c, in, effect) })
		}
		wg.Wait()
		rejected(t, rec, "claimed 2 times")
	})

	t.Run("a cut-off attempt's outcome overwrites its successor", func(t *testing.T) {
		s, _ := testdb.NewSQLite(t)
		if err := s.Migrate(context.Background()); err != nil {
			t.Fatal(err)
		}
		rec := linearize.NewRecorder()
		cfg := once.Config{
			Store: unfenced{s}, Hooks: rec.Hooks(),
			// A lease long enough that a claim slowed by a busy disk still
			// leaves time to start the effect: Do does not start one whose
			// lease is spent (Lease - Lease/5 after the claim was sent).
			Kinds: map[string]once.KindPolicy{kindCharge: {Recovery: once.RetryWithProviderKey, Lease: time.Second}},
		}
		cut, err := once.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Store = s
		healthy, err := once.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		in := once.Intent{Run: "broken", Kind: kindCharge, Target: "cus_1"}
		started, second, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
		go func() {
			defer close(done)
			// A zombie: it ignores its context and finishes after the
			// second attempt has.
			linearize.Do(context.Background(), rec, 0, cut, in, func(context.Context, once.Attempt) (string, error) {
				close(started)
				select {
				case <-second:
				case <-time.After(10 * time.Second):
				}
				return "ch-zombie", nil
			})
		}()
		select {
		case <-started:
		case <-done:
			t.Fatal("the first attempt returned without starting its effect: its claim took most of its lease")
		}
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			res, err := linearize.Do(context.Background(), rec, 1, healthy, in, func(context.Context, once.Attempt) (string, error) { return "ch-1", nil })
			if err == nil && res.Attempt == 2 {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		close(second)
		<-done
		rejected(t, rec, "outcome #1 succeeded")
	})
}

// rejected checks that the history rec holds is not linearizable, and
// that what porcupine or the recorder says names want.
func rejected(t *testing.T, rec *linearize.Recorder, want string) {
	t.Helper()
	v := linearize.Check(rec.History(), 10*time.Second)
	said := v.Explanation + strings.Join(rec.Problems(), "\n")
	if v.Result != porcupine.Illegal {
		t.Fatalf("a broken store's history was found %s (%d operations); the recorder says %v", v.Result, v.Ops, rec.Problems())
	}
	if !strings.Contains(said, want) {
		t.Fatalf("the rejection does not show %q:\n%s", want, said)
	}
	t.Logf("rejected, as it must be:\n%s", said)
}
