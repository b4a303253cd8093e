package natsjs_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncehq/once/natsjs"
)

// countHandler counts the worker's lines about a failed lookup.
type countHandler struct{ n *atomic.Int64 }

func (h countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "cannot read the consumer") {
		h.n.Add(1)
	}
	return nil
}
func (h countHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countHandler) WithGroup(string) slog.Handler      { return h }

// TestConsumerLookupOneAtATime: with the consumer unreadable for good,
// the messages that arrive together make one lookup between them, not
// one each (each waiting out its 5 s timeout before its job ran), and
// no lookup is made again before the failure's wait is over.
func TestConsumerLookupOneAtATime(t *testing.T) {
	t.Parallel()
	n := startPrivateNATS(t)
	_, admin := n.connect(t, "admin")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stream, err := admin.CreateStream(ctx, jetstream.StreamConfig{Name: "JOBS", Subjects: []string{"jobs.>"}})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "worker", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 5, MaxAckPending: 1000})
	if err != nil {
		t.Fatal(err)
	}
	_, wjs := n.connect(t, "worker")
	var lookups atomic.Int64
	w, err := natsjs.New(wjs, natsjs.Config{Logger: slog.New(countHandler{&lookups})})
	if err != nil {
		t.Fatal(err)
	}
	const per = 50
	wave := func(name string, most int64) {
		for i := range per {
			if _, err := admin.Publish(ctx, "jobs.x", []byte(fmt.Sprint(i))); err != nil {
				t.Fatal(err)
			}
		}
		batch, err := cons.Fetch(per, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		before := lookups.Load()
		var wg sync.WaitGroup
		var slowest atomic.Int64
		t0 := time.Now()
		for msg := range batch.Messages() {
			wg.Go(func() {
				s := time.Now()
				w.Handle(ctx, msg, func(context.Context, jetstream.Msg) error { return nil })
				slowest.Store(max(slowest.Load(), int64(time.Since(s))))
			})
		}
		wg.Wait()
		asked := lookups.Load() - before
		t.Logf("%s: %d messages, %d failed lookups of the consumer, slowest Handle %v, wave %v", name, per, asked, time.Duration(slowest.Load()), time.Since(t0))
		if asked > most {
			t.Errorf("%s: %d messages made %d lookups of the consumer; want at most %d", name, per, asked, most)
		}
	}
	wave("wave 1 (nothing known)", 1)
	wave("wave 2 (within 5 s of the failure)", 0)
	time.Sleep(6 * time.Second)
	wave("wave 3 (after 5 s)", 1)
}
