package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/oncehq/once"
)

// RetryCountHeader counts how many times a job went through a retry
// queue. Handle sets it on every retry copy; Retries reads it.
const RetryCountHeader = "x-once-retries"

// Retries returns how many times the delivered job went through a retry
// queue: 0 for a job fresh from its publisher.
func Retries(d amqp.Delivery) int {
	switch v := d.Headers[RetryCountHeader].(type) {
	case int64:
		return int(v)
	case int32:
		return int(v)
	case int16:
		return int(v)
	case int8:
		return int(v)
	case int:
		return v
	case uint32:
		return int(v)
	case uint16:
		return int(v)
	case uint8:
		return int(v)
	case string:
		n, _ := strconv.Atoi(v)
		return n
	}
	return 0
}

// Handle runs work for one delivery and settles the delivery by what
// work returned, as once.Dispose says (the package documentation has the
// table). work calls once.Do or once.DoTx and returns its error
// unchanged; Handle returns the disposition it applied (After is the
// delay the retry was given) and the error settling met, if any. The
// work's own error is the caller's: log it with the disposition's Reason.
//
// An error that matches once.ErrPermanent but not once.ErrFailed — the
// work refused the job itself before any action, say a body that does
// not decode — is dropped, as Dispose says. With Config.DeadLetterFailed,
// a permanent failure (once.ErrFailed) is dropped rather than acked.
//
// The delivery must come from a consumer in manual-ack mode (autoAck
// false). When ctx is done before a retry is settled, the job is nacked
// with requeue instead of copied to a retry queue, so another consumer
// takes it; cancel the consumer (Channel.Cancel) before ctx, or the
// requeued job comes straight back. A panic in work settles the job as a
// retry and goes on up.
//
// Handle is safe for concurrent use: a consumer with a prefetch count
// above one may handle its deliveries in as many goroutines.
func (q *Queue) Handle(ctx context.Context, d amqp.Delivery, work func(context.Context, amqp.Delivery) error) (once.Disposition, error) {
	if d.Acknowledger == nil {
		return once.Disposition{Action: once.JobRetry, Reason: "not settled: the delivery has no channel"},
			errors.New("rabbitmq: Handle was given a Delivery with no channel (its Acknowledger is nil); pass one received from Channel.Consume")
	}
	if work == nil {
		err := errors.New("rabbitmq: Handle was given a nil work function; pass one that calls once.Do and returns its error")
		if nerr := d.Nack(false, true); nerr != nil {
			err = errors.Join(err, fmt.Errorf("rabbitmq: requeueing the job: %w", nerr))
		}
		return once.Disposition{Action: once.JobRetry, Reason: "no work function: requeued"}, err
	}
	start := time.Now()
	panicked, err := run(ctx, d, work)
	disp, serr := q.settle(ctx, d, q.dispose(err), start)
	if panicked != nil {
		panic(panicked)
	}
	return disp, serr
}

// run calls work, turning a panic into an error that retries the job; the
// panic value is returned to be raised again once the job is settled.
func run(ctx context.Context, d amqp.Delivery, work func(context.Context, amqp.Delivery) error) (panicked any, err error) {
	defer func() {
		if p := recover(); p != nil {
			panicked, err = p, fmt.Errorf("rabbitmq: the work panicked: %v", p)
		}
	}()
	return nil, work(ctx, d)
}

// dispose is once.Dispose with Config.DeadLetterFailed applied.
func (q *Queue) dispose(err error) once.Disposition {
	disp := once.Dispose(err)
	if q.deadFailed && disp.Action == once.JobAck && errors.Is(err, once.ErrFailed) {
		disp = once.Disposition{Action: once.JobDrop, Reason: "failed for good; recorded, and dead-lettered (Config.DeadLetterFailed)"}
	}
	return disp
}

// settle applies disp to the delivery.
func (q *Queue) settle(ctx context.Context, d amqp.Delivery, disp once.Disposition, start time.Time) (once.Disposition, error) {
	switch disp.Action {
	case once.JobAck:
		if err := d.Ack(false); err != nil {
			return disp, fmt.Errorf("rabbitmq: acking the job: %w; the broker delivers it again, and once replays its outcome", err)
		}
		return disp, nil
	case once.JobDrop:
		if err := d.Reject(false); err != nil {
			return disp, fmt.Errorf("rabbitmq: rejecting the job: %w; the broker delivers it again, and it is dropped again", err)
		}
		return disp, nil
	}
	if ctx.Err() != nil {
		disp.After = 0
		disp.Reason += "; the worker is stopping: requeued for another consumer"
		if err := d.Nack(false, true); err != nil {
			return disp, fmt.Errorf("rabbitmq: requeueing the job: %w; the broker delivers it again when the channel closes", err)
		}
		return disp, nil
	}
	delay, rq := q.route(disp.After)
	pctx, cancel := context.WithTimeout(ctx, q.confirmTimeout)
	err := q.publish(pctx, rq, retryCopy(d, delay))
	cancel()
	if err == nil {
		disp.After = delay
		if err := d.Ack(false); err != nil {
			return disp, fmt.Errorf("rabbitmq: the job was copied to %s, but acking the original failed: %w; the broker delivers it again as well, and once absorbs the duplicate", rq, err)
		}
		return disp, nil
	}
	// Nothing is lost: the original goes back to the work queue. A
	// publisher that fails at once must not turn that into a hot loop,
	// so the job is held until MinRetryDelay has passed since it came.
	pause(ctx, time.Until(start.Add(q.bands[0])))
	disp.After = 0
	disp.Reason += "; the retry could not be queued, so the job was requeued"
	err = fmt.Errorf("rabbitmq: copying the job to %s: %w; the job was requeued instead", rq, err)
	if nerr := d.Nack(false, true); nerr != nil {
		err = errors.Join(err, fmt.Errorf("rabbitmq: requeueing the job: %w; the broker delivers it again when the channel closes", nerr))
	}
	return disp, err
}

// pause waits for d or until ctx is done.
func pause(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// retryCopy is the message that waits delay in a retry queue for d: the
// same body, properties and headers, one more retry counted, and an
// expiration of delay.
//
// Some headers are left out. The broker's x-death and x-first-death-* /
// x-last-death-* record earlier dead-letterings of the message, and the
// broker reads x-death to find dead-letter cycles: a message dead-lettered
// to a queue its x-death already names, with no rejection since, is
// dropped. A job that once expired from the work queue (a work queue with
// a TTL) and was moved back from the dead-letter queue by hand would be
// dropped on its way back from the retry queue, so the copy starts
// afresh, and RetryCountHeader counts its retries instead. CC and BCC
// would route copies to other queues. The user id is left out because
// the broker refuses a message whose user id is not the publishing
// connection's user, and the job's own expiration gives way to the
// delay.
func retryCopy(d amqp.Delivery, delay time.Duration) amqp.Publishing {
	h := amqp.Table{}
	for k, v := range d.Headers {
		switch {
		case k == "x-death", k == "CC", k == "BCC",
			strings.HasPrefix(k, "x-first-death-"), strings.HasPrefix(k, "x-last-death-"):
			continue
		}
		h[k] = v
	}
	h[RetryCountHeader] = int64(Retries(d) + 1)
	return amqp.Publishing{
		Headers:         h,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    d.DeliveryMode,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		Expiration:      strconv.FormatInt(delay.Milliseconds(), 10),
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		AppId:           d.AppId,
		Body:            d.Body,
	}
}
