package linearize_test

// Two violations the linearizability check found, made small: an
// outcome whose reply was lost, then refused on its retry because it had
// applied, was reported superseded (*FencedError, "not recorded") while
// it stood in the ledger. Both over PostgreSQL, whose replies a fault
// proxy can lose; each is checked with the model and by what Do said.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/jackc/pgx/v5"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/faultproxy"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/lab/linearize"
)

// A worker records a success; the reply is lost after the commit. Its
// retry is refused (the row moved on: it is the worker's own write), and
// the read that should tell it so (Client.recorded) loses its reply too.
// Do answered *FencedError, "its outcome (succeeded) was not recorded",
// and the trail gained a "refused" event, while the success was recorded
// and replayed to every duplicate. The read is now tried again.
func TestRecordedSuccessWhoseReadBackIsLost(t *testing.T) {
	worker, other, proxy, rec := reproClients(t)
	in := once.Intent{Run: "readback", Kind: "send_email", Target: "ada@example.com"}
	res, err := linearize.Do(context.Background(), rec, 0, worker, in, func(context.Context, once.Attempt) (string, error) {
		// The outcome's reply is lost after it committed, then the
		// reply of the next read of the row (Store.Get).
		outcome := proxy.CutAfter([]byte("WITH u AS ("), faultproxy.PostgresReady)
		go func() {
			<-outcome
			proxy.CutAfter([]byte("redrive FROM"), faultproxy.PostgresReady)
		}()
		return "250 queued", nil
	})
	dup, dupErr := linearize.Do(context.Background(), rec, 1, other, in, func(context.Context, once.Attempt) (string, error) { return "sent again", nil })
	checkReadBack(t, rec, other, dup.Key)
	if err != nil || res.Value != "250 queued" || dupErr != nil || !dup.Replayed || dup.Value != "250 queued" {
		t.Fatalf("Do = %+v, %v; the duplicate = %+v, %v; want the success reported, then replayed", res, err, dup, dupErr)
	}
}

// A worker records a release (its effect returned RetryLater); the reply
// hangs after the commit. While it waits, the next delivery claims the
// released action as attempt 2 and succeeds. The worker's retry is
// refused (the action moved on), and the read-back (Client.recorded)
// looked for the worker's event in the trail only while the row was at
// the worker's attempt: Do answered *FencedError, "its outcome (released)
// was not recorded", for the release that let attempt 2 run.
func TestRecordedReleaseClaimedBeforeItsReplyCame(t *testing.T) {
	worker, other, proxy, rec := reproClients(t)
	in := once.Intent{Run: "readback", Kind: "send_email", Target: "ada@example.com"}
	var hung <-chan struct{}
	_, err := linearize.Do(context.Background(), rec, 0, worker, in, func(context.Context, once.Attempt) (string, error) {
		hung = proxy.HangAfter([]byte("WITH u AS ("), faultproxy.PostgresReady)
		go func() {
			<-hung
			linearize.Do(context.Background(), rec, 1, other, in, func(context.Context, once.Attempt) (string, error) { return "250 queued", nil })
		}()
		return "", once.RetryLater(errors.New("421 try again later"))
	})
	k, _, _ := once.KeyOf(in)
	checkReadBack(t, rec, other, k)
	if !errors.Is(err, once.ErrRetryLater) || errors.Is(err, once.ErrFenced) {
		t.Fatalf("Do answered %v; want the release reported (ErrRetryLater): it was recorded, and attempt 2 claimed it", err)
	}
}

// checkReadBack logs k's trail and checks the history.
func checkReadBack(t *testing.T, rec *linearize.Recorder, c *once.Client, k once.Key) {
	t.Helper()
	evs, _ := c.Events(context.Background(), k)
	for _, e := range evs {
		t.Logf("trail: %s attempt %d %s→%s: %s", e.Type, e.Attempt, e.From, e.To, e.Note)
		if e.Type == once.EventRefused {
			t.Errorf("the trail says an outcome was refused; every outcome applied")
		}
	}
	if v := linearize.Check(rec.History(), 10*time.Second); v.Result != porcupine.Ok {
		t.Errorf("the history is %s:\n%s", v.Result, v.Explanation)
	}
}

// reproClients returns a client whose store reaches a fresh schema
// through a fault proxy, a client reaching it directly, the proxy, and a
// recorder both clients report to.
func reproClients(t *testing.T) (cut, direct *once.Client, proxy *faultproxy.Proxy, rec *linearize.Recorder) {
	t.Helper()
	url := testdb.RequirePostgres(t)
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	var b [6]byte
	rand.Read(b[:])
	schema := "once_repro_" + hex.EncodeToString(b[:])
	ctx := context.Background()
	d := openStore(t, ctx, withParams(url, "pool_max_conns=2"), schema)
	t.Cleanup(func() {
		d.Pool().Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	})
	if err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	proxy, err = faultproxy.Start(fmt.Sprintf("%s:%d", cfg.Host, cfg.Port))
	if err != nil {
		t.Fatal(err)
	}
	c := openStore(t, ctx, fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable&default_query_exec_mode=exec&pool_max_conns=4", cfg.User, proxy.Addr(), cfg.Database), schema)
	// Before the store closes (cleanups run last first): closing the
	// proxy ends the hung connection the pool would wait for.
	t.Cleanup(func() { proxy.Close() })
	rec = linearize.NewRecorder()
	cc := once.Config{Store: c, Hooks: rec.Hooks(), RecordTimeout: 3 * time.Second}
	if cut, err = once.New(cc); err != nil {
		t.Fatal(err)
	}
	cc.Store = d
	if direct, err = once.New(cc); err != nil {
		t.Fatal(err)
	}
	return cut, direct, proxy, rec
}
