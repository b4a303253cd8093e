package natsjs_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncehq/once"
	"github.com/oncehq/once/natsjs"
)

// TestJoinedErrorsKeepReleasedStep runs a job of two independent steps
// that returns both their errors joined (errors.Join): the first step
// failed for good, the second was released (the provider said retry
// later). The released step needs another delivery; settling the job by
// the first step's failure alone would terminate it and leave the second
// waiting for a delivery that never comes.
func TestJoinedErrorsKeepReleasedStep(t *testing.T) {
	t.Parallel()
	b := setup(t, jetstream.ConsumerConfig{}, once.Config{})
	w := b.worker(t, natsjs.Config{})
	busy := true
	fn := func(ctx context.Context, msg jetstream.Msg) error {
		var j job
		if err := json.Unmarshal(msg.Data(), &j); err != nil {
			return once.Permanent(err)
		}
		sms := j.intent()
		sms.Kind, sms.Step = "sms", 0
		_, errSMS := once.Do(ctx, b.client, sms, func(context.Context, once.Attempt) (string, error) {
			return "", once.Permanent(errors.New("no such phone number"))
		})
		mail := j.intent()
		mail.Kind, mail.Step = "email", 1
		_, errMail := once.Do(ctx, b.client, mail, func(_ context.Context, a once.Attempt) (string, error) {
			b.log.effect(a)
			if busy {
				return "", once.RetryLater(errors.New("421 try again later"))
			}
			return "250 queued", nil
		})
		return errors.Join(errSMS, errMail)
	}
	b.publish(t, job{ID: "order-join", Customer: "cus_j", Amount: 4})
	msg, err := b.cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	d, err := w.Handle(context.Background(), msg, fn)
	if d.Action != once.JobRetry || !errors.Is(err, once.ErrFailed) || !errors.Is(err, once.ErrRetryLater) {
		t.Fatalf("settled %v (%v); want a retry: one step was released", d.Action, err)
	}
	busy = false
	msg, err = b.cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatalf("the job never came back for its released step: %v", err)
	}
	d, err = w.Handle(context.Background(), msg, fn)
	if d.Action == once.JobRetry || !errors.Is(err, once.ErrFailed) {
		t.Fatalf("second delivery settled %v (%v); want it done with: one step failed for good, the other sent", d.Action, err)
	}
	if _, _, effects := b.log.snapshot(); len(effects) != 2 {
		t.Fatalf("the email was tried %d times; want twice (released, then sent)", len(effects))
	}
}
