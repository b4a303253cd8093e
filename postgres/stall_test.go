package postgres_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/faultproxy"
	"github.com/oncehq/once/postgres"
)

// TestGroupCommitHungLoneOutcomeHoldsNoClaim: an outcome sent alone, at
// once, on a connection that then hangs counts as the batch in flight,
// and requests made meanwhile queue behind it. A claim on a free key
// from another worker, with healthy connections free in the pool, must
// not wait for that hang (RecordTimeout/3, 10 s) and be told a
// transaction holds its key: it goes out on another connection, and its
// effect runs.
func TestGroupCommitHungLoneOutcomeHoldsNoClaim(t *testing.T) {
	d, schema := newStore(t)
	if err := d.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	ps, proxy := proxiedStoreWith(t, postgres.Config{Schema: schema})
	c, err := once.New(once.Config{Store: ps, ClaimTimeout: 2 * time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	// One connection used and back in the pool, so the claim below
	// need not dial through the proxy while the outcome hangs.
	if _, err := once.Do(context.Background(), c, once.Intent{Run: "warm", Kind: "send_email", Target: "ada@example.com"},
		func(context.Context, once.Attempt) (string, error) { return "sent", nil }); err != nil {
		t.Fatal(err)
	}
	var (
		hung     <-chan struct{}
		claimErr = make(chan error, 1)
		ran      atomic.Int64
		took     time.Duration
	)
	_, err = once.Do(context.Background(), c, once.Intent{Run: "hung-outcome", Kind: "send_email", Target: "ada@example.com"},
		func(context.Context, once.Attempt) (string, error) {
			hung = proxy.HangAfter([]byte(pgMarkers.Transition), faultproxy.PostgresReady)
			go func() {
				<-hung
				start := time.Now()
				_, err := once.Do(context.Background(), c, once.Intent{Run: "free-key", Kind: "send_email", Target: "bob@example.com"},
					func(context.Context, once.Attempt) (string, error) {
						ran.Add(1)
						return "sent", nil
					})
				took = time.Since(start)
				claimErr <- err
			}()
			return "sent", nil
		})
	if err != nil {
		t.Logf("the hung outcome's Do: %v", err)
	}
	select {
	case <-hung:
	default:
		t.Fatal("the outcome's connection never hung")
	}
	if err := <-claimErr; err != nil || ran.Load() != 1 {
		t.Fatalf("Do on a free key behind a hung outcome = %v (ran %d, after %v); want it claimed on another connection and run", err, ran.Load(), took)
	}
	t.Logf("the free key's Do took %v behind the hung outcome", took)
}
