package storetest

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/oncehq/once"
)

// Benchmark measures, for a store, the two paths a worker takes: a new intent
// (claim, effect, record: two round trips) and a duplicate (one round
// trip that returns the stored result).
func Benchmark(b *testing.B, s once.Store) {
	ctx := context.Background()
	c, err := once.New(once.Config{Store: s})
	if err != nil {
		b.Fatal(err)
	}
	effect := func(context.Context, once.Attempt) (string, error) { return "msg-id-0123456789", nil }

	b.Run("ClaimComplete", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			in := once.Intent{Run: "bench", Step: int64(i), Kind: "send_email", Target: "ada@example.com", Payload: "hello"}
			if _, err := once.Do(ctx, c, in, effect); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("ClaimCompleteParallel", func(b *testing.B) {
		var n atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				in := once.Intent{Run: "bench-par", Step: n.Add(1), Kind: "send_email", Target: "ada@example.com", Payload: "hello"}
				if _, err := once.Do(ctx, c, in, effect); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	dup := once.Intent{Run: "bench-dup", Kind: "send_email", Target: "ada@example.com", Payload: "hello"}
	if _, err := once.Do(ctx, c, dup, effect); err != nil {
		b.Fatal(err)
	}
	b.Run("Replay", func(b *testing.B) {
		for b.Loop() {
			res, err := once.Do(ctx, c, dup, effect)
			if err != nil || !res.Replayed {
				b.Fatal(res, err)
			}
		}
	})
	b.Run("ReplayParallel", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := once.Do(ctx, c, dup, effect); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("Key", func(b *testing.B) {
		in := once.Intent{Run: "bench", Step: 7, Kind: "send_email", Target: "ada@example.com", Payload: map[string]string{"subject": "hi", "body": "hello " + strconv.Itoa(7)}}
		for b.Loop() {
			once.KeyOf(in)
		}
	})
}
