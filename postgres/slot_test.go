package postgres_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/faultproxy"
	"github.com/oncehq/once/postgres"
)

// TestHungConnectionsFreeTheirPoolSlots: a statement given up on a
// connection that hangs is closed by pgx in the background, which
// drains the socket for up to 15 s; the pool must not count that
// connection meanwhile. With a pool of two, two claims whose replies
// hang (each committed) leave no slot for the second one's read-back,
// and that caller's own claim was left unrun, for a person to be asked
// about after its lease. Each claim is found to be its caller's, and
// each effect runs once.
func TestHungConnectionsFreeTheirPoolSlots(t *testing.T) {
	for _, unbatched := range []bool{true, false} {
		t.Run(fmt.Sprintf("unbatched=%v", unbatched), func(t *testing.T) {
			s, p, _ := behindProxy(t, 2, "", postgres.Config{Unbatched: unbatched})
			c, err := once.New(once.Config{Store: s, ClaimTimeout: time.Second, Default: once.KindPolicy{Lease: time.Minute}, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			for i := range 2 {
				hung := p.HangAfter([]byte(pgMarkers.Claim), faultproxy.PostgresReady)
				in := once.Intent{Run: fmt.Sprintf("slot-%d", i), Kind: "send_email", Target: "ada@example.com"}
				var ran atomic.Int64
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				res, err := once.Do(ctx, c, in, func(context.Context, once.Attempt) (string, error) {
					ran.Add(1)
					return "sent", nil
				})
				cancel()
				select {
				case <-hung:
				default:
					t.Fatalf("claim %d: its reply never hung", i+1)
				}
				if err != nil || res.Value != "sent" || ran.Load() != 1 {
					t.Fatalf("claim %d, its reply hung, %d connection(s) hung before it: Do = %+v, %v (ran %d); want the claim taken as its own and run once",
						i+1, i, res, err, ran.Load())
				}
			}
		})
	}
}
