package natsjs_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncehq/once"
	"github.com/oncehq/once/natsjs"
)

// TestWaitingMessageKeptAlive runs a job three times as long as the
// consumer's AckWait on a worker with one slot, while a second job waits
// in the worker for the slot. The waiting job is the worker's: it must be
// kept alive like a running one, not delivered again (to this worker or
// another, spending one of the consumer's MaxDeliver) while it waits.
func TestWaitingMessageKeptAlive(t *testing.T) {
	t.Parallel()
	const ackWait = time.Second
	b := setup(t, jetstream.ConsumerConfig{AckWait: ackWait}, once.Config{})
	w := b.worker(t, natsjs.Config{Concurrency: 1})
	started := make(chan struct{}, 2)
	c := consume(t, w, b.cons, charge(b.client, b.log, func(_ context.Context, a once.Attempt) (string, error) {
		b.log.effect(a)
		started <- struct{}{}
		if _, _, effects := b.log.snapshot(); len(effects) == 1 {
			time.Sleep(3 * ackWait) // the first job outlasts AckWait; the second waits
		}
		return "ch", nil
	}))
	b.publish(t, job{ID: "order-long", Customer: "cus_l", Amount: 1})
	<-started
	b.publish(t, job{ID: "order-next", Customer: "cus_n", Amount: 2})
	i := b.settledAll(t, 2)
	c.stop()
	if i.NumRedelivered != 0 || i.Delivered.Consumer != 2 {
		t.Fatalf("%d deliveries of 2 jobs (%d messages redelivered); want each job delivered once", i.Delivered.Consumer, i.NumRedelivered)
	}
}
