package once_test

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/testdb"
)

// heartbeatLoops counts the goroutines that are running (or about to run)
// a heartbeat loop of this package.
func heartbeatLoops() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "oncehq/once.(*heartbeat)") || strings.Contains(g, "oncehq/once.(*Client).heartbeat") {
			n++
		}
	}
	return n
}

// beatCounter is a real store that counts the heartbeats each key gets,
// and says when one has had enough.
type beatCounter struct {
	once.Store
	mu     sync.Mutex
	beats  map[once.Key]int
	want   int
	enough chan once.Key
}

func (s *beatCounter) Heartbeat(ctx context.Context, key once.Key, attempt int, lease time.Duration) (time.Time, bool, error) {
	until, held, err := s.Store.Heartbeat(ctx, key, attempt, lease)
	if err == nil && held {
		s.mu.Lock()
		s.beats[key]++
		if s.beats[key] == s.want {
			s.enough <- key
		}
		s.mu.Unlock()
	}
	return until, held, err
}

func (s *beatCounter) count(key once.Key) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.beats[key]
}

// An effect that returns before its first heartbeat is due starts none,
// even after it would have been due; one that outlives it gets them, and
// its claim holds.
func TestHeartbeatOnlyForLongEffects(t *testing.T) {
	st, _ := testdb.NewSQLite(t)
	if err := st.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	s := &beatCounter{Store: st, beats: map[once.Key]int{}, want: 2, enough: make(chan once.Key, 1)}
	const lease = 900 * time.Millisecond // a heartbeat every 300ms
	// MaxExecution bounds the long effect if no heartbeat ever comes.
	c, err := once.New(once.Config{Store: s, Default: once.KindPolicy{Lease: lease, MaxExecution: 30 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	short := once.Intent{Run: "hb", Step: 0, Kind: "send_email"}
	res, err := once.Do(ctx, c, short, func(context.Context, once.Attempt) (string, error) {
		if n := heartbeatLoops(); n != 0 {
			t.Errorf("%d heartbeat loops run beside an effect that has just started, want none", n)
		}
		return "quick", nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// The long effect starts after the short one returned and runs
	// until it has had two heartbeats: longer than the short one's
	// first would have waited.
	long := once.Intent{Run: "hb", Step: 1, Kind: "send_email"}
	lres, err := once.Do(ctx, c, long, func(ctx context.Context, a once.Attempt) (string, error) {
		select {
		case k := <-s.enough:
			if n := heartbeatLoops(); n != 1 {
				t.Errorf("%d heartbeat loops run beside a long effect, want 1", n)
			}
			if k != a.Key {
				t.Errorf("heartbeats for %s, want %s", k, a.Key)
			}
			return "slow", nil
		case <-ctx.Done():
			return "", ctx.Err()
		}
	})
	if err != nil || lres.Value != "slow" {
		t.Fatalf("long effect: %+v, %v", lres, err)
	}
	if n := s.count(res.Key); n != 0 {
		t.Errorf("the short effect's claim got %d heartbeats, want none", n)
	}
	if n := s.count(lres.Key); n < 2 {
		t.Errorf("the long effect's claim got %d heartbeats, want 2 or more", n)
	}
	a, err := c.Get(ctx, lres.Key)
	if err != nil || a.Status != once.StatusSucceeded || a.Attempt != 1 {
		t.Fatalf("long effect's action: %+v, %v", a, err)
	}
}
