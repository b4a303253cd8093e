package metrics_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/metrics"
)

// A verifier that finds an effect landed is a recovery, whoever asked
// it: the worker that claimed a released action asked it before running
// anything, and ran nothing, so no worker outcome is counted, and the
// verifier's time is its own.
func TestVerifiedBeforeAReleasedActionRunsIsARecovery(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	var asked atomic.Int64
	c, store := testdb.SQLiteClient(t, once.Config{Hooks: m.Hooks(), Default: once.KindPolicy{Recovery: once.VerifyThenDecide,
		Verifier: func(context.Context, once.Action) (bool, json.RawMessage, error) {
			if asked.Add(1) == 1 {
				return false, nil, nil
			}
			time.Sleep(20 * time.Millisecond)
			return true, json.RawMessage(`"v"`), nil
		}}})
	ctx := context.Background()
	in := deadClaim(t, store)
	r, err := once.NewReaper(c, once.ReaperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := r.RunOnce(ctx); err != nil || rep.Released != 1 {
		t.Fatalf("the reaper's pass = %+v, %v; want the dead claim released", rep, err)
	}
	res, err := once.Do(ctx, c, in, func(context.Context, once.Attempt) (string, error) { return "x", nil })
	if err != nil || !res.Replayed || res.Value != "v" {
		t.Fatalf("Do = %+v, %v; want the verifier's result", res, err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP once_recoveries_total Unknown outcomes recovered, by recovery mode and outcome.
# TYPE once_recoveries_total counter
once_recoveries_total{kind="charge",outcome="released",recovery="verify_then_decide"} 1
once_recoveries_total{kind="charge",outcome="verified",recovery="verify_then_decide"} 1
`), "once_recoveries_total", "once_outcomes_total"); err != nil {
		t.Fatal(err)
	}
}

// A worker that meets a dead claim and, under AskPerson, puts it up for
// review decided a recovery; no effect of its own ended so, and no
// worker outcome is counted.
func TestReviewOfADeadClaimFoundInlineIsARecovery(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, store := testdb.SQLiteClient(t, once.Config{Hooks: m.Hooks(), Default: once.KindPolicy{Recovery: once.AskPerson}})
	ctx := context.Background()
	in := deadClaim(t, store)
	if _, err := once.Do(ctx, c, in, func(context.Context, once.Attempt) (string, error) { return "x", nil }); !errors.Is(err, once.ErrReview) {
		t.Fatalf("Do = %v; want the dead claim put up for review", err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP once_recoveries_total Unknown outcomes recovered, by recovery mode and outcome.
# TYPE once_recoveries_total counter
once_recoveries_total{kind="charge",outcome="review",recovery="ask_person"} 1
`), "once_recoveries_total", "once_outcomes_total"); err != nil {
		t.Fatal(err)
	}
}

// deadClaim claims an intent on s as a worker that died at once, and
// returns it once the claim's lease has lapsed.
func deadClaim(t *testing.T, s once.Store) once.Intent {
	t.Helper()
	in := once.Intent{Kind: "charge", Target: "acct", Run: "r", Step: 1}
	k, fp, err := once.KeyOf(in)
	if err != nil {
		t.Fatal(err)
	}
	if cr, err := s.Claim(context.Background(), once.ClaimRequest{Key: k, Fingerprint: fp, Run: in.Run, Step: in.Step, Kind: in.Kind, Target: in.Target, Lease: time.Millisecond}); err != nil || !cr.Claimed {
		t.Fatal(cr, err)
	}
	time.Sleep(20 * time.Millisecond)
	return in
}
