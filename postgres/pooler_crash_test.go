package postgres_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/faultproxy"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/postgres"
)

// The link from PgBouncer to PostgreSQL drops after the server
// committed a batch; PgBouncer tells its client "server conn crashed?"
// (FATAL, 08P01). That error says nothing of whether the batch
// committed: each request in it is read back by its token, as a
// statement of its own whose reply was lost is, and the caller whose
// claim (or outcome) it was carries on as its owner.

// crashedPooler is a store with group commit behind a PgBouncer in
// transaction mode whose link to PostgreSQL runs through a fault proxy.
// While gate is on, its lone requests wait (up to 5 s) until two more
// have queued, so that those two go as one batch.
func crashedPooler(t *testing.T, ctx context.Context) (s *postgres.Store, p *faultproxy.Proxy, gate *atomic.Bool) {
	t.Helper()
	up, err := url.Parse(testdb.RequirePostgres(t))
	if err != nil {
		t.Fatal(err)
	}
	p, err = faultproxy.Start(up.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	up.Host = p.Addr()
	b := testdb.RequirePgBouncer(t, testdb.PgBouncerOptions{Upstream: up.String(), PoolSize: 4})
	schema := uniqueSchema("once_crashed_")
	dropSchema(t, schema)
	s, err = testdb.RetryTooManyClients(ctx, func() (*postgres.Store, error) {
		return postgres.Open(ctx, b.URL+"&pool_max_conns=4&default_query_exec_mode=exec",
			postgres.Config{Schema: schema, Pooler: postgres.PoolerTransaction, Logger: quiet})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	gate = new(atomic.Bool)
	postgres.SetBeforeBatch(s, func(n int) {
		if n != 1 || !gate.Load() {
			return
		}
		for deadline := time.Now().Add(5 * time.Second); postgres.Queued(s) < 2 && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
	})
	return s, p, gate
}

// batchMarker is in every batch's first statement and in no lone one.
var batchMarker = []byte("set_config('lock_timeout'")

// TestGroupCommitPoolerCrashAfterCommitReadsBack: three Dos at once, a
// lone claim and a batch of two (then a lone outcome and a batch of
// two); the batch commits and the pooler's link to the server drops
// before its reply. Each effect runs once, each Do reports its success,
// and no trail says an outcome was refused.
func TestGroupCommitPoolerCrashAfterCommitReadsBack(t *testing.T) {
	for _, phase := range []string{"claims", "outcomes"} {
		t.Run(phase, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			s, p, gate := crashedPooler(t, ctx)
			c, err := once.New(once.Config{Store: s, Default: once.KindPolicy{Lease: time.Minute}, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			var cut <-chan struct{}
			armCut := func() {
				cut = p.CutAfter(batchMarker, faultproxy.PostgresReady)
				gate.Store(true)
				go func() {
					<-cut
					gate.Store(false)
				}()
			}
			if phase == "claims" {
				armCut()
			}
			var (
				started atomic.Int64
				arm     sync.Once
				runs    [3]atomic.Int64
				errs    [3]error
				wg      sync.WaitGroup
			)
			ins := make([]once.Intent, 3)
			for i := range ins {
				ins[i] = once.Intent{Run: fmt.Sprintf("crash-%s-%d", phase, i), Kind: "send_email", Target: "ada@example.com"}
				wg.Go(func() {
					_, errs[i] = once.Do(ctx, c, ins[i], func(context.Context, once.Attempt) (string, error) {
						runs[i].Add(1)
						// Every claim has been answered (or given up on, 5 s)
						// before any outcome is sent, so the cut meets the
						// outcomes' batch.
						started.Add(1)
						for deadline := time.Now().Add(5 * time.Second); started.Load() < 3 && time.Now().Before(deadline); {
							time.Sleep(time.Millisecond)
						}
						if phase == "outcomes" {
							arm.Do(armCut)
						}
						return "sent", nil
					})
				})
			}
			wg.Wait()
			select {
			case <-cut:
			default:
				t.Fatal("the batch's reply was never cut")
			}
			for i, in := range ins {
				if errs[i] != nil || runs[i].Load() != 1 {
					t.Errorf("Do %d = %v (ran %d); want its effect run once and its success reported", i, errs[i], runs[i].Load())
				}
				k := keyOf(t, in)
				a, err := s.Get(ctx, k)
				if err != nil || a.Status != once.StatusSucceeded || a.Attempt != 1 {
					t.Errorf("Do %d stored %s attempt %d (%v); want succeeded, attempt 1", i, a.Status, a.Attempt, err)
				}
				evs, err := s.Events(ctx, k)
				if tr := eventTypes(evs); err != nil || tr != "claimed,succeeded" {
					t.Errorf("Do %d's trail %s (%v); want claimed,succeeded", i, tr, err)
				}
			}
		})
	}
}

// eventTypes is a trail's event types, comma-separated.
func eventTypes(evs []once.Event) string {
	var b []string
	for _, e := range evs {
		b = append(b, string(e.Type))
	}
	return strings.Join(b, ",")
}
