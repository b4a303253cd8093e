package metrics_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/metrics"
	"github.com/oncehq/once/postgres"
)

func TestMetricsCountTransitions(t *testing.T) {
	url := testdb.RequirePostgres(t)
	ctx := context.Background()
	var b [6]byte
	rand.Read(b[:])
	schema := "once_metrics_" + hex.EncodeToString(b[:])
	store, err := postgres.Open(ctx, url, postgres.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	defer store.Pool().Exec(ctx, `DROP SCHEMA `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	// The client takes the hooks, so it is handed to the gauges after.
	m, err := metrics.New(reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := once.New(once.Config{Store: store, Hooks: m.Hooks()})
	if err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(reg, "once_actions"); n != 0 {
		t.Fatalf("once_actions before SetStats: %d series, want none", n)
	}
	m.SetStats(c)
	in := once.Intent{Run: "r", Kind: "send_email", Target: "ada", Payload: "a"}
	ok := func(context.Context, once.Attempt) (string, error) { return "id", nil }
	once.Do(ctx, c, in, ok)
	once.Do(ctx, c, in, ok)
	once.Do(ctx, c, in, ok)
	in.Payload = "b"
	once.Do(ctx, c, in, ok)
	once.Do(ctx, c, once.Intent{Run: "r", Step: 1, Kind: "send_email"}, func(context.Context, once.Attempt) (string, error) {
		return "", errors.New("reset")
	})

	want := `
# HELP once_actions Actions in the store by kind and status; status="review" is the review backlog. On a large log, succeeded and failed are from a count made now and then.
# TYPE once_actions gauge
once_actions{kind="send_email",status="review"} 1
once_actions{kind="send_email",status="succeeded"} 1
# HELP once_claims_total Claims won: a new attempt started.
# TYPE once_claims_total counter
once_claims_total{kind="send_email"} 2
# HELP once_fingerprint_refusals_total Attempts refused because their payload differed from the first.
# TYPE once_fingerprint_refusals_total counter
once_fingerprint_refusals_total{kind="send_email"} 1
# HELP once_outcomes_total Outcomes recorded by workers, by status.
# TYPE once_outcomes_total counter
once_outcomes_total{kind="send_email",status="review"} 1
once_outcomes_total{kind="send_email",status="succeeded"} 1
# HELP once_replays_total Duplicates answered from the store without running the effect.
# TYPE once_replays_total counter
once_replays_total{kind="send_email",status="succeeded"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"once_actions", "once_claims_total", "once_fingerprint_refusals_total", "once_outcomes_total", "once_replays_total"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(reg, "once_effect_duration_seconds"); n != 2 {
		t.Fatalf("effect histograms: %d series, want 2", n)
	}
	if _, err := metrics.New(nil, c); err == nil {
		t.Fatal("nil registerer accepted")
	}

	// A pass that re-drives one released action and finds another
	// with no hook: a counter and a gauge.
	m.Observe(ctx, once.Observation{Event: once.Event{Type: once.EventRedriven, Actor: once.ActorReaper}, Kind: "send_email"})
	m.ObservePass(once.ReapReport{Redriven: 1, Waiting: 3}, nil)
	want = `
# HELP once_redriven_total Released actions handed to their kind's Redrive hook because no delivery claimed them.
# TYPE once_redriven_total counter
once_redriven_total{kind="send_email"} 1
# HELP once_released_waiting Released actions past their kind's RedriveAfter that could not be re-driven, at the last reaper pass: they run only if their job is delivered again.
# TYPE once_released_waiting gauge
once_released_waiting 3
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "once_redriven_total", "once_released_waiting"); err != nil {
		t.Fatal(err)
	}
}

// TestMetricsGaugesFromClient: a client made before the metrics is
// counted when passed to New, and a count that fails (the store closed)
// shows as once_store_scrape_error 1 instead of stale gauges.
func TestMetricsGaugesFromClient(t *testing.T) {
	ctx := context.Background()
	c, store := testdb.SQLiteClient(t, once.Config{})
	for i := range 3 {
		in := once.Intent{Run: "r", Step: int64(i), Kind: "charge"}
		if _, err := once.Do(ctx, c, in, func(context.Context, once.Attempt) (int, error) { return i, nil }); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	if _, err := metrics.New(reg, c); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP once_actions Actions in the store by kind and status; status="review" is the review backlog. On a large log, succeeded and failed are from a count made now and then.
# TYPE once_actions gauge
once_actions{kind="charge",status="succeeded"} 3
# HELP once_store_scrape_error 1 if the last count of the store failed.
# TYPE once_store_scrape_error gauge
once_store_scrape_error 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "once_actions", "once_store_scrape_error"); err != nil {
		t.Fatal(err)
	}

	// The count runs while the registry gathers, beside the error gauge,
	// so the gauge shows a failure from the gather after it.
	store.Close()
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
	want = `
# HELP once_store_scrape_error 1 if the last count of the store failed.
# TYPE once_store_scrape_error gauge
once_store_scrape_error 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "once_actions", "once_store_scrape_error"); err != nil {
		t.Fatal(err)
	}
}
