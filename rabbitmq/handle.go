package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/oncehq/once"
)

// RetryCountHeader counts how many times a job went through a retry
// queue. Handle sets it on every retry copy; Retries reads it.
const RetryCountHeader = "x-once-retries"

// PanicCountHeader counts how many times the work panicked on a job.
// Handle sets it on the retry copy of a job whose work panicked, and
// dead-letters the job at Config.MaxPanics.
const PanicCountHeader = "x-once-panics"

// maxCount is the largest count Handle takes in RetryCountHeader or
// PanicCountHeader. A job retried every second would need 68 years to
// get there: a larger count was not written by this package.
const maxCount = math.MaxInt32

// Retries returns how many times the delivered job went through a retry
// queue: 0 for a job fresh from its publisher. A RetryCountHeader this
// package would not have written (negative, above 2^31-1, not an
// integer) reads as -1; Handle refuses such a job to the dead-letter
// queue without running it.
func Retries(d amqp.Delivery) int {
	n, err := count(d.Headers, RetryCountHeader)
	if err != nil {
		return -1
	}
	return n
}

// count reads a count header: absent is 0; an integer from 0 to
// maxCount (or its decimal text) is the count; anything else is an
// error that names the header and what it held.
func count(h amqp.Table, name string) (int, error) {
	v, ok := h[name]
	if !ok {
		return 0, nil
	}
	var n int64
	switch v := v.(type) {
	case int64:
		n = v
	case int32:
		n = int64(v)
	case int16:
		n = int64(v)
	case int8:
		n = int64(v)
	case int:
		n = int64(v)
	case uint32:
		n = int64(v)
	case uint16:
		n = int64(v)
	case uint8:
		n = int64(v)
	case string:
		x, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("header %s is %.40q, not a count", name, v)
		}
		n = x
	default:
		return 0, fmt.Errorf("header %s is a %T, not an integer count", name, v)
	}
	if n < 0 || n > maxCount {
		return 0, fmt.Errorf("header %s is %d, outside 0 to %d", name, n, maxCount)
	}
	return int(n), nil
}

// ErrPanicked matches a *PanicError.
var ErrPanicked = errors.New("rabbitmq: the work panicked")

// PanicError is what Handle returns for work that panicked: the panic
// is recovered, so one poison job does not kill the worker.
type PanicError struct {
	// Value is what the work panicked with.
	Value any
	// Stack is the goroutine's stack at the panic.
	Stack []byte
}

func (e *PanicError) Error() string        { return fmt.Sprintf("rabbitmq: the work panicked: %v", e.Value) }
func (e *PanicError) Is(target error) bool { return target == ErrPanicked }

// ErrBadCount matches the error Handle returns for a job whose
// RetryCountHeader or PanicCountHeader this package would not have
// written.
var ErrBadCount = errors.New("rabbitmq: a count header this package did not write")

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
// requeued job comes straight back.
//
// A panic in work is recovered, logged with its stack (Config.Logger)
// and returned as a *PanicError: the job is retried, with one more
// panic counted in PanicCountHeader, and rejected (dead-lettered) with
// the panic as the reason once Config.MaxPanics panics are counted. A
// job whose RetryCountHeader or PanicCountHeader is not a count this
// package writes (negative, above 2^31-1, not an integer) is rejected
// without running work, with an error matching ErrBadCount.
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
	_, rerr := count(d.Headers, RetryCountHeader)
	panics, perr := count(d.Headers, PanicCountHeader)
	if bad := errors.Join(rerr, perr); bad != nil {
		reason := fmt.Sprintf("refused unrun: %v; dead-lettered", bad)
		q.log.Warn("rabbitmq: job refused: "+bad.Error(), "queue", q.name, "message_id", d.MessageId, "delivery_tag", d.DeliveryTag)
		disp, serr := q.settle(ctx, d, once.Disposition{Action: once.JobDrop, Reason: reason}, time.Now(), false)
		return disp, errors.Join(fmt.Errorf("%w: %v; the job was rejected without running: publish it again without the header", ErrBadCount, bad), serr)
	}
	start := time.Now()
	pe, err := run(ctx, d, work)
	disp := q.dispose(err)
	if pe != nil {
		disp = q.poison(d, panics+1, pe)
	}
	disp, serr := q.settle(ctx, d, disp, start, pe != nil)
	if pe != nil {
		return disp, errors.Join(pe, serr)
	}
	return disp, serr
}

// maxPanicReason bounds the panic value quoted in a reason.
const maxPanicReason = 200

// poison logs work's panic on d, its n-th, with its stack, and says what
// to do with the job: retry it, or from the MaxPanics-th panic on,
// reject it to the dead-letter queue, so a poison job neither kills the
// worker nor goes round the retry queues for ever.
func (q *Queue) poison(d amqp.Delivery, n int, pe *PanicError) once.Disposition {
	v := fmt.Sprint(pe.Value)
	if len(v) > maxPanicReason {
		v = strings.ToValidUTF8(v[:maxPanicReason], "") + "…"
	}
	final := n >= q.maxPanics
	q.log.Error("rabbitmq: the work panicked", "queue", q.name, "message_id", d.MessageId, "delivery_tag", d.DeliveryTag,
		"panics", n, "max_panics", q.maxPanics, "dead_lettered", final, "panic", v, "stack", string(pe.Stack))
	if final {
		return once.Disposition{Action: once.JobDrop, Reason: fmt.Sprintf("the work panicked %d times (Config.MaxPanics %d): %s; dead-lettered as a poison job", n, q.maxPanics, v)}
	}
	return once.Disposition{Action: once.JobRetry, Reason: fmt.Sprintf("the work panicked (%d of at most %d): %s", n, q.maxPanics, v)}
}

// run calls work, turning a panic into a *PanicError.
func run(ctx context.Context, d amqp.Delivery, work func(context.Context, amqp.Delivery) error) (pe *PanicError, err error) {
	defer func() {
		if p := recover(); p != nil {
			pe, err = &PanicError{Value: p, Stack: debug.Stack()}, nil
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
// A retry copy counts one more panic when panicked is set.
func (q *Queue) settle(ctx context.Context, d amqp.Delivery, disp once.Disposition, start time.Time, panicked bool) (once.Disposition, error) {
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
	err := q.publish(pctx, rq, retryCopy(d, delay, panicked))
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
// same body, properties and headers, one more retry counted (and one more
// panic, when panicked), and an expiration of delay. Handle refuses a
// job whose counts it would not have written, so neither wraps.
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
func retryCopy(d amqp.Delivery, delay time.Duration, panicked bool) amqp.Publishing {
	h := amqp.Table{}
	for k, v := range d.Headers {
		switch {
		case k == "x-death", k == "CC", k == "BCC",
			strings.HasPrefix(k, "x-first-death-"), strings.HasPrefix(k, "x-last-death-"):
			continue
		}
		h[k] = v
	}
	h[RetryCountHeader] = int64(max(Retries(d), 0) + 1)
	if panicked {
		n, _ := count(d.Headers, PanicCountHeader)
		h[PanicCountHeader] = int64(n + 1)
	}
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
