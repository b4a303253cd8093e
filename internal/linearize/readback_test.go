//go:build repro

// Reproductions of violations the linearizability check found in once,
// kept out of the default run until they are fixed:
//
//	go test -tags repro -run Repro -v ./internal/linearize/

package linearize_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"testing"

	"github.com/anishathalye/porcupine"
	"github.com/jackc/pgx/v5"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/faultproxy"
	"github.com/oncehq/once/internal/linearize"
	"github.com/oncehq/once/internal/testdb"
)

// A worker records a success; the reply is lost after the commit. Its
// retry is refused (the row moved on: it is the worker's own write), and
// the read that should tell it so (Client.recorded) loses its reply too.
// Do then answers *FencedError, "its outcome (succeeded) was not
// recorded", and the trail gains a "refused" event, while the success is
// recorded and replayed to every duplicate.
func TestReproRecordedOutcomeReportedFenced(t *testing.T) {
	url := testdb.RequirePostgres(t)
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	var b [6]byte
	rand.Read(b[:])
	schema := "once_repro_" + hex.EncodeToString(b[:])
	ctx := context.Background()
	direct := openStore(t, ctx, withParams(url, "pool_max_conns=2"), schema)
	t.Cleanup(func() {
		direct.Pool().Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	})
	if err := direct.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	proxy, err := faultproxy.Start(fmt.Sprintf("%s:%d", cfg.Host, cfg.Port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	cut := openStore(t, ctx, fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable&default_query_exec_mode=exec&pool_max_conns=4", cfg.User, proxy.Addr(), cfg.Database), schema)

	rec := linearize.NewRecorder()
	worker, err := once.New(once.Config{Store: cut, Hooks: rec.Hooks()})
	if err != nil {
		t.Fatal(err)
	}
	other, err := once.New(once.Config{Store: direct, Hooks: rec.Hooks()})
	if err != nil {
		t.Fatal(err)
	}
	in := once.Intent{Run: "repro", Kind: "send_email", Target: "ada@example.com"}
	_, err = linearize.Do(ctx, rec, 0, worker, in, func(context.Context, once.Attempt) (string, error) {
		// The outcome's reply is lost after it committed, then the
		// reply of the next read of the row (Store.Get).
		outcome := proxy.CutAfter([]byte("WITH u AS ("), faultproxy.PostgresReady)
		go func() {
			<-outcome
			proxy.CutAfter([]byte("redrive FROM"), faultproxy.PostgresReady)
		}()
		return "250 queued", nil
	})
	dup, dupErr := linearize.Do(ctx, rec, 1, other, in, func(context.Context, once.Attempt) (string, error) { return "sent again", nil })
	evs, _ := other.Events(ctx, dup.Key)
	for _, e := range evs {
		t.Logf("trail: %s attempt %d %s→%s: %s", e.Type, e.Attempt, e.From, e.To, e.Note)
	}
	v := linearize.Check(rec.History(), 0)
	if v.Result != porcupine.Ok {
		t.Logf("%s", v.Explanation)
	}
	var fenced *once.FencedError
	if errors.As(err, &fenced) && dupErr == nil && dup.Replayed && dup.Value == "250 queued" {
		t.Fatalf("Do answered %v, and the success it says was not recorded is replayed: %+v", err, dup)
	}
}
