package rabbitmq

import (
	"context"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/oncehq/once"
)

// maxIdle bounds the publishing channels kept open between publishes.
const maxIdle = 8

// pubChannel is a channel in confirm mode that carries one message at a
// time, so the confirm it waits for and a return the broker sends are
// both this message's.
type pubChannel struct {
	ch *amqp.Channel
	// returns holds the broker's return of an unroutable message. The
	// broker sends a return before the confirm of the same message, and
	// the library hands both over in order, so once the confirm is in, a
	// return for the message is already here. One message at a time
	// means at most one return, so the buffer never fills.
	returns chan amqp.Return
}

// take returns an idle publishing channel, or opens one.
func (q *Queue) take() (*pubChannel, error) {
	q.mu.Lock()
	for len(q.idle) > 0 {
		pc := q.idle[len(q.idle)-1]
		q.idle = q.idle[:len(q.idle)-1]
		if !pc.ch.IsClosed() {
			q.mu.Unlock()
			return pc, nil
		}
	}
	closed := q.closed
	q.mu.Unlock()
	if closed {
		return nil, errors.New("the Queue was closed")
	}
	ch, err := q.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("opening a publishing channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		ch.Close()
		return nil, fmt.Errorf("putting the publishing channel in confirm mode: %w", err)
	}
	return &pubChannel{ch: ch, returns: ch.NotifyReturn(make(chan amqp.Return, 1))}, nil
}

// give puts a channel whose last message was settled back in the pool.
func (q *Queue) give(pc *pubChannel) {
	q.mu.Lock()
	if !q.closed && len(q.idle) < maxIdle && !pc.ch.IsClosed() {
		q.idle = append(q.idle, pc)
		pc = nil
	}
	q.mu.Unlock()
	if pc != nil {
		pc.ch.Close()
	}
}

// publish sends msg to queue through the default exchange and waits for
// the broker's confirm. A nil error means the broker has the message in
// the queue. An error means it may not: when the confirm did not come
// (ctx ended, the channel closed) it may or may not have been queued.
//
// It returns when ctx ends, whatever the connection does. A broker that
// stops answering without closing the connection holds every call the
// client makes on it — opening a channel, putting it in confirm mode,
// writing a large message, closing the channel — until the client's
// heartbeat gives up on the connection, or for ever without one. Those
// calls run on a goroutine of their own, which finishes (and closes its
// channel) when the broker answers or the connection dies.
func (q *Queue) publish(ctx context.Context, queue string, msg amqp.Publishing) error {
	done := make(chan error, 1)
	go func() { done <- q.publishOn(ctx, queue, msg) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("no confirm from the broker for the message to queue %q: %w; it may or may not have been queued (the connection does not answer)", queue, context.Cause(ctx))
	}
}

// publishOn is publish on a channel taken from the pool, waiting as long
// as the connection makes it.
func (q *Queue) publishOn(ctx context.Context, queue string, msg amqp.Publishing) error {
	pc, err := q.take()
	if err != nil {
		return err
	}
	dc, err := pc.ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, msg)
	if err == nil && dc == nil {
		err = errors.New("the channel is not in confirm mode")
	}
	if err != nil {
		pc.ch.Close()
		return fmt.Errorf("publishing to queue %q: %w", queue, err)
	}
	acked, err := dc.WaitContext(ctx)
	switch {
	case err != nil:
		// The confirm may still come: the channel is not reused.
		pc.ch.Close()
		return fmt.Errorf("no confirm from the broker for the message to queue %q: %w; it may or may not have been queued", queue, err)
	case !acked && pc.ch.IsClosed():
		return fmt.Errorf("the channel closed before the broker confirmed the message to queue %q; it may or may not have been queued", queue)
	case !acked:
		pc.ch.Close()
		return fmt.Errorf("the broker refused (nacked) the message to queue %q", queue)
	}
	select {
	case r, ok := <-pc.returns:
		// Not ok: the channel closed after the confirm, with no return.
		if ok {
			q.give(pc)
			return fmt.Errorf("the broker could not route the message to queue %q (%d %s): the queue does not exist; run Declare", queue, r.ReplyCode, r.ReplyText)
		}
	default:
	}
	q.give(pc)
	return nil
}

// Publish puts a job on the work queue and returns once the broker has
// confirmed it, so a job the caller was told is published survives a
// crash of the caller (and, with a durable queue and a persistent
// message, of the broker). A zero DeliveryMode is taken as Persistent.
// An error means it may not have been queued; publishing it again is
// safe, since once absorbs the duplicate.
func (q *Queue) Publish(ctx context.Context, msg amqp.Publishing) error {
	if msg.DeliveryMode == 0 {
		msg.DeliveryMode = amqp.Persistent
	}
	ctx, cancel := context.WithTimeout(ctx, q.confirmTimeout)
	defer cancel()
	if err := q.publish(ctx, q.name, msg); err != nil {
		return fmt.Errorf("rabbitmq: %w", err)
	}
	return nil
}

// RedriveMessageID is the message id of a re-driven job: the action's
// key and the attempt that was released. Re-driving the same release
// again (every RedriveAfter until a delivery claims it) gives the same
// id, so the copies can be told apart from a job published anew.
func RedriveMessageID(a once.Action) string {
	return fmt.Sprintf("%s-%d", a.Key, a.Attempt)
}

// Redrive returns a hook for KindPolicy.Redrive that publishes a
// released action's job to the work queue again. A released action runs
// only when its job is delivered again; when the job was already acked
// or dropped (a person chose Retry on a review item, say), nobody would
// deliver it, so the reaper calls the hook.
//
// build makes the job from the action (its Run is the job's id, its
// Payload the canonical payload); its MessageId is replaced by
// RedriveMessageID, and a zero DeliveryMode is taken as Persistent. The
// hook returns once the broker has confirmed the message, and an error
// when it refused, could not route, or did not confirm it: the reaper
// then tries again on a later pass. A job re-driven twice, or re-driven
// while its old copy still waits somewhere, is delivered twice, and once
// absorbs it.
func (q *Queue) Redrive(build func(once.Action) (amqp.Publishing, error)) func(context.Context, once.Action) error {
	return func(ctx context.Context, a once.Action) error {
		if build == nil {
			return errors.New("rabbitmq: the Redrive hook was made with a nil build function; pass one that makes the job's message from the action")
		}
		msg, err := build(a)
		if err != nil {
			return fmt.Errorf("rabbitmq: building the job of action %s to re-drive: %w", a.Key, err)
		}
		msg.MessageId = RedriveMessageID(a)
		if msg.DeliveryMode == 0 {
			msg.DeliveryMode = amqp.Persistent
		}
		ctx, cancel := context.WithTimeout(ctx, q.confirmTimeout)
		defer cancel()
		if err := q.publish(ctx, q.name, msg); err != nil {
			return fmt.Errorf("rabbitmq: re-driving action %s: %w", a.Key, err)
		}
		return nil
	}
}
