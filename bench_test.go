package once_test

import (
	"context"
	"encoding/json"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/testdb"
)

// BenchmarkKey measures KeyOf over the payloads callers pass most: it
// runs on every Do before any I/O.
func BenchmarkKey(b *testing.B) {
	type message struct {
		To      string            `json:"to"`
		Subject string            `json:"subject"`
		Body    string            `json:"body"`
		Tags    []string          `json:"tags,omitempty"`
		Headers map[string]string `json:"headers,omitempty"`
		Retries int               `json:"retries"`
	}
	for _, tc := range []struct {
		name    string
		payload any
	}{
		{"None", nil},
		{"Bytes", []byte("hello, world")},
		{"String", "hello"},
		{"MapString", map[string]string{"subject": "hi", "body": "hello 7"}},
		{"MapAny", map[string]any{"subject": "hi", "body": "hello 7", "n": 3, "ok": true, "to": []any{"ada@example.com"}}},
		{"Struct", message{To: "ada@example.com", Subject: "hi", Body: "hello 7", Tags: []string{"a", "b"}, Headers: map[string]string{"x-id": "1"}, Retries: 2}},
		{"RawMessage", json.RawMessage(`{"subject":"hi","body":"hello 7"}`)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			in := once.Intent{Run: "bench", Step: 7, Kind: "send_email", Target: "ada@example.com", Payload: tc.payload}
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := once.KeyOf(in); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// timedStore is a real store that adds up the time spent in its calls,
// so a benchmark can tell the library's own cost from the database's.
type timedStore struct {
	once.Store
	spent atomic.Int64
}

func (s *timedStore) since(start time.Time) { s.spent.Add(int64(time.Since(start))) }

func (s *timedStore) Claim(ctx context.Context, req once.ClaimRequest) (once.ClaimResult, error) {
	defer s.since(time.Now())
	return s.Store.Claim(ctx, req)
}

func (s *timedStore) Transition(ctx context.Context, t once.Transition) (bool, error) {
	defer s.since(time.Now())
	return s.Store.Transition(ctx, t)
}

func (s *timedStore) Heartbeat(ctx context.Context, key once.Key, attempt int, lease time.Duration) (time.Time, bool, error) {
	defer s.since(time.Now())
	return s.Store.Heartbeat(ctx, key, attempt, lease)
}

func (s *timedStore) Get(ctx context.Context, key once.Key) (once.Action, error) {
	defer s.since(time.Now())
	return s.Store.Get(ctx, key)
}

// BenchmarkDoOverhead measures what Do adds over the store calls it
// makes, on a real SQLite store: overhead-ns/op is the time spent outside
// the store's calls, overhead-allocs/op the allocations beyond those of
// the same store calls made directly (store-allocs/op, measured with
// testing.AllocsPerRun on requests built beforehand). The direct calls
// get a context with a deadline, as Do's calls must: with one, the
// database/sql and SQLite drivers watch the context of every statement,
// at some thirty allocations a call, which are the store's.
func BenchmarkDoOverhead(b *testing.B) {
	ctx := context.Background()
	s, _ := testdb.NewSQLite(b)
	if err := s.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	ts := &timedStore{Store: s}
	c, err := once.New(once.Config{Store: ts})
	if err != nil {
		b.Fatal(err)
	}
	const result = "msg-id-0123456789"
	effect := func(context.Context, once.Attempt) (string, error) { return result, nil }
	payload := map[string]string{"subject": "hi", "body": "hello"}
	intent := func(run string, step int) once.Intent {
		return once.Intent{Run: run, Step: int64(step), Kind: "send_email", Target: "ada@example.com", Payload: payload}
	}
	pol := c.Policy("send_email")
	dctx, cancel := context.WithTimeout(ctx, time.Hour)
	defer cancel()
	claimOf := func(in once.Intent, i int) once.ClaimRequest {
		k, fp, err := once.KeyOf(in)
		if err != nil {
			b.Fatal(err)
		}
		return once.ClaimRequest{Key: k, Fingerprint: fp, Run: in.Run, Step: in.Step, Kind: in.Kind, Target: in.Target,
			Payload: []byte(`{"body":"hello","subject":"hi"}`), Lease: pol.Lease + pol.Lease/5, Token: "claim-token-" + strconv.Itoa(i),
			Origin: c.Origin(), Recovery: pol.Recovery, Retention: pol.Retention, RedriveAfter: pol.RedriveAfter}
	}
	// measure runs op in the benchmark's loop and reports, beside ns/op
	// and allocs/op, the part of each spent outside the store.
	measure := func(b *testing.B, storeAllocs float64, op func(i int)) {
		b.ReportAllocs()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		ts.spent.Store(0)
		start := time.Now()
		n := 0
		for b.Loop() {
			op(n)
			n++
		}
		elapsed := time.Since(start)
		runtime.ReadMemStats(&after)
		inStore := time.Duration(ts.spent.Load())
		b.ReportMetric(float64(inStore)/float64(n), "store-ns/op")
		b.ReportMetric(float64(elapsed-inStore)/float64(n), "overhead-ns/op")
		b.ReportMetric(storeAllocs, "store-allocs/op")
		b.ReportMetric(float64(after.Mallocs-before.Mallocs)/float64(n)-storeAllocs, "overhead-allocs/op")
	}

	b.Run("New", func(b *testing.B) {
		// The store's own: the claim and the record of the same kind of
		// action, made directly.
		// The function may run more than once on the same store: every
		// run takes runs of its own.
		prefix := "bench-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		const runs = 200
		reqs := make([]once.ClaimRequest, runs+1)
		for i := range reqs {
			reqs[i] = claimOf(intent(prefix+"-store", i), i)
		}
		res, _ := json.Marshal(result)
		n := 0
		storeAllocs := testing.AllocsPerRun(runs, func() {
			req := reqs[n]
			n++
			cr, err := s.Claim(dctx, req)
			if err != nil || !cr.Claimed {
				b.Fatal(cr, err)
			}
			ok, err := s.Transition(dctx, once.Transition{Key: req.Key, Attempt: 1, From: []once.Status{once.StatusInFlight}, To: once.StatusSucceeded, Result: res, Token: req.Token,
				Event: once.Event{Key: req.Key, Type: once.EventSucceeded, Attempt: 1, From: once.StatusInFlight, To: once.StatusSucceeded, Actor: once.ActorWorker, Origin: c.Origin()}})
			if err != nil || !ok {
				b.Fatal(ok, err)
			}
		})
		measure(b, storeAllocs, func(i int) {
			if _, err := once.Do(ctx, c, intent(prefix, i), effect); err != nil {
				b.Fatal(err)
			}
		})
	})
	b.Run("Replay", func(b *testing.B) {
		dup := intent("bench-dup", 0)
		if _, err := once.Do(ctx, c, dup, effect); err != nil {
			b.Fatal(err)
		}
		req := claimOf(dup, 0)
		storeAllocs := testing.AllocsPerRun(200, func() {
			if cr, err := s.Claim(dctx, req); err != nil || cr.Claimed {
				b.Fatal(cr, err)
			}
		})
		measure(b, storeAllocs, func(int) {
			res, err := once.Do(ctx, c, dup, effect)
			if err != nil || !res.Replayed || res.Value != result {
				b.Fatal(res, err)
			}
		})
	})
}
