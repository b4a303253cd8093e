package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncehq/once"
	"github.com/oncehq/once/console"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/postgres"
)

// postgresClient is a client over a PostgreSQL store in a schema of its
// own, named from prefix (also returned), dropped when the test ends.
func postgresClient(t *testing.T, prefix string) (*pgxpool.Pool, *postgres.Store, *once.Client, string) {
	t.Helper()
	dsn := testdb.RequirePostgres(t)
	ctx := context.Background()
	pool, err := testdb.RetryTooManyClients(ctx, func() (*pgxpool.Pool, error) { return pgxpool.New(ctx, dsn) })
	if err != nil {
		t.Fatal(err)
	}
	schema := fmt.Sprintf("%s_%d", prefix, time.Now().UnixNano())
	store, err := postgres.New(pool, postgres.Config{Schema: schema})
	if err != nil {
		pool.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		store.Close()
		pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		pool.Close()
	})
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	client, err := once.New(once.Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	return pool, store, client, schema
}

// On a log too large to count at each page, the PostgreSQL store counts
// succeeded and failed now and then; the overview and /api/stats say when
// those counts were made, and still count the review backlog now.
func TestOverviewSaysWhenALargeLogWasCounted(t *testing.T) {
	ctx := context.Background()
	pool, store, client, schema := postgresClient(t, "once_large")
	const finished = 100_000
	if _, err := pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema, "once_action"}.Sanitize()+` (key, fingerprint, run_id, step, kind, target, status, attempt, result, completed_at, retain_until)
SELECT md5(g::text) || md5(g::text), '', '', g, 'send_email', '', 'succeeded', 1, '{}', now(), now() + interval '7 days' FROM generate_series(1, $1::int) g`, finished); err != nil {
		t.Fatal(err)
	}
	h, err := console.New(console.Config{Client: client})
	if err != nil {
		t.Fatal(err)
	}
	get := func(p string) string {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", p, nil))
		if rec.Code != 200 {
			t.Fatalf("GET %s: %d %s", p, rec.Code, rec.Body)
		}
		return rec.Body.String()
	}
	// The first page counts the whole log, and says nothing.
	if body := get("/"); strings.Contains(body, "as counted") {
		t.Fatalf("the overview of a log counted now says it was counted earlier:\n%s", section(body, "Overview"))
	}
	// An action put up for review after that count is counted by the next
	// page, beside the finished actions of the earlier count.
	key := once.Key(strings.Repeat("cd", 32))
	cr, err := store.Claim(ctx, once.ClaimRequest{Key: key, Fingerprint: "f", Kind: "send_email", Lease: time.Hour, Token: "t"})
	if err != nil || !cr.Claimed {
		t.Fatal(cr, err)
	}
	if ok, err := store.Transition(ctx, once.Transition{Key: key, Attempt: 1, From: []once.Status{once.StatusInFlight}, To: once.StatusReview, Error: "asked"}); err != nil || !ok {
		t.Fatal(ok, err)
	}
	body := get("/")
	if !strings.Contains(body, "Succeeded and failed as counted") {
		t.Fatalf("the overview of a large log does not say when its finished actions were counted:\n%s", section(body, "Overview"))
	}
	if kinds := get("/kinds"); !strings.Contains(kinds, "Succeeded and failed as counted") {
		t.Fatalf("the kinds page of a large log does not say when its finished actions were counted:\n%s", section(kinds, "Kinds"))
	}
	if !strings.Contains(body, "<strong>1</strong>") {
		t.Fatalf("the overview does not count the action put up for review since:\n%s", section(body, "Overview"))
	}
	var st struct {
		ByStatus     map[string]int64 `json:"by_status"`
		FinishedAsOf *time.Time       `json:"finished_as_of"`
	}
	if err := json.Unmarshal([]byte(get("/api/stats")), &st); err != nil {
		t.Fatal(err)
	}
	if st.FinishedAsOf == nil || st.ByStatus["succeeded"] != finished || st.ByStatus["review"] != 1 {
		t.Fatalf("/api/stats = %+v (as of %v), want %d succeeded as of the first count and 1 in review", st.ByStatus, st.FinishedAsOf, finished)
	}
}
