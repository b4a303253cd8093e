package postgres_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/faultproxy"
	"github.com/oncehq/once/postgres"
)

// TestLoadCutAndHungRepliesSmallPool is the load behind the pool-slot
// and hung-batch fixes: workers on a small pool, every intent delivered
// twice by an at-least-once queue, and the replies of claims and
// outcomes cut or hung every 100-300 ms. Every intent must end with its
// effect run once and recorded, or in review only when its effect
// really started (the default recovery asks a person about a worker
// that went silent); no effect runs twice, and none is lost. The
// figures are logged for RELIABILITY.md.
func TestLoadCutAndHungRepliesSmallPool(t *testing.T) {
	if testing.Short() {
		t.Skip("a load test; run without -short")
	}
	for _, unbatched := range []bool{false, true} {
		t.Run(fmt.Sprintf("unbatched=%v", unbatched), func(t *testing.T) {
			t.Parallel()
			loadUnderFaults(t, unbatched, 1500, 16, 8)
		})
	}
}

// delivery is one delivery of an intent's job.
type delivery struct {
	i  int
	at time.Time
}

func loadUnderFaults(t *testing.T, unbatched bool, intents, workers, pool int) {
	s, p, _ := behindProxy(t, pool, "", postgres.Config{Unbatched: unbatched})
	c, err := once.New(once.Config{Store: s, ClaimTimeout: time.Second, RecordTimeout: 6 * time.Second,
		Default: once.KindPolicy{Lease: 2 * time.Second}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ins := make([]once.Intent, intents)
	starts := make([]atomic.Int64, intents)
	for i := range ins {
		ins[i] = once.Intent{Run: fmt.Sprintf("load-%d", i), Kind: "send_email", Target: "ada@example.com"}
	}

	// The queue: each intent delivered twice at the start, and again
	// when a delivery is disposed of as a retry.
	var (
		mu      sync.Mutex
		queue   []delivery
		pending = 2 * intents
		settled = make(chan struct{})
		counts  = map[once.JobAction]int{}
		total   atomic.Int64
	)
	// The first deliveries are spread over 10 s, so the faults meet the
	// whole run, not its first seconds.
	began := time.Now()
	for i := range intents {
		queue = append(queue, delivery{i: i}, delivery{i: i})
	}
	rand.Shuffle(len(queue), func(a, b int) { queue[a], queue[b] = queue[b], queue[a] })
	for k := range queue {
		queue[k].at = began.Add(time.Duration(k) * 10 * time.Second / time.Duration(len(queue)))
	}
	take := func() (delivery, bool) {
		mu.Lock()
		defer mu.Unlock()
		for len(queue) == 0 && pending > 0 {
			mu.Unlock()
			time.Sleep(5 * time.Millisecond)
			mu.Lock()
		}
		if pending == 0 {
			return delivery{}, false
		}
		d := queue[0]
		queue = queue[1:]
		return d, true
	}
	settle := func(dl delivery, disp once.Disposition) {
		mu.Lock()
		defer mu.Unlock()
		counts[disp.Action]++
		if disp.Action == once.JobRetry {
			queue = append(queue, delivery{i: dl.i, at: time.Now().Add(min(disp.After, 500*time.Millisecond))})
			return
		}
		pending--
		if pending == 0 {
			close(settled)
		}
	}

	// Faults: a reply cut or hung every 100-300 ms, on claims or outcomes.
	stop := make(chan struct{})
	var faults atomic.Int64
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(100+rand.IntN(200)) * time.Millisecond):
			}
			marker := []byte(pgMarkers.Claim)
			if rand.IntN(2) == 0 {
				// In the outcome's statement alone and in the batch's.
				marker = []byte("u AS (")
			}
			if rand.IntN(2) == 0 {
				p.HangAfter(marker, faultproxy.PostgresReady)
			} else {
				p.CutAfter(marker, faultproxy.PostgresReady)
			}
			faults.Add(1)
		}
	}()

	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				dl, ok := take()
				if !ok {
					return
				}
				if wait := time.Until(dl.at); wait > 0 {
					time.Sleep(wait)
				}
				total.Add(1)
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				_, err := once.Do(ctx, c, ins[dl.i], func(context.Context, once.Attempt) (string, error) {
					starts[dl.i].Add(1)
					time.Sleep(time.Duration(1+rand.IntN(5)) * time.Millisecond)
					return "sent", nil
				})
				cancel()
				settle(dl, once.Dispose(err))
			}
		})
	}
	select {
	case <-settled:
	case <-time.After(4 * time.Minute):
		mu.Lock()
		t.Errorf("after 4 minutes %d deliveries still pending", pending)
		pending = 0
		mu.Unlock()
	}
	close(stop)
	wg.Wait()
	took := time.Since(began)

	var succeeded, review, reviewRan, twice, other int
	for i, in := range ins {
		a, err := s.Get(context.Background(), keyOf(t, in))
		n := starts[i].Load()
		switch {
		case err != nil:
			t.Errorf("intent %d: %v (started %d times)", i, err, n)
			other++
			continue
		case n > 1:
			twice++
			t.Errorf("intent %d: its effect started %d times", i, n)
		}
		switch {
		case a.Status == once.StatusSucceeded && n == 1:
			succeeded++
		case a.Status == once.StatusReview && n == 1:
			review++
			reviewRan++
		case a.Status == once.StatusReview:
			review++
			t.Errorf("intent %d: in review, but its effect never started (%s)", i, a.Error)
		default:
			other++
			t.Errorf("intent %d: ended %s at attempt %d with its effect started %d times", i, a.Status, a.Attempt, n)
		}
	}
	t.Logf("unbatched=%v: %d intents, %d workers, pool %d: %d deliveries (%v) in %v, %d faults; %d succeeded, %d in review (%d of them started), %d ran twice, %d otherwise",
		unbatched, intents, workers, pool, total.Load(), counts, took.Round(time.Millisecond), faults.Load(), succeeded, review, reviewRan, twice, other)
}
