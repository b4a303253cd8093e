// Package rabbitmq runs once's workers on RabbitMQ: it declares a work
// queue with delayed retry beside it, settles each delivery as
// once.Dispose says, and publishes the jobs of released actions again for
// the reaper (KindPolicy.Redrive).
//
// # Topology
//
// Queue.Declare declares, idempotently, with durable queues:
//
//	Config.Queue                        the work queue; consumers take jobs from it
//	Config.Queue+".retry.quorum."+band  retry queues, one per band of delays: quorum queues
//	                                    that nobody consumes
//	Config.DeadLetterQueue              optional; the work queue dead-letters dropped jobs to it
//
// A job to be retried is not nacked back onto the work queue: the broker
// would deliver it again at once, and a job whose claim another attempt
// holds for two minutes would go round thousands of times. It is copied
// into a retry queue instead, with a per-message expiration of the delay,
// and the original is acked once the broker has confirmed the copy. Nobody
// consumes a retry queue, so the copy sits there until it expires; the
// retry queues are declared with x-dead-letter-exchange "" and
// x-dead-letter-routing-key set to the work queue, so the broker then
// moves it back to the work queue, where a consumer takes it again.
//
// RabbitMQ expires messages only at the head of a queue: a copy that must
// wait ten minutes holds up every one-second copy queued behind it. So
// there is a retry queue per band of delays, each twice as long as the
// one before, from MinRetryDelay up to the first at least MaxRetryDelay
// (1s, 2s, 4s, … 1h8m16s by default: 13 queues). A delay (raised to
// MinRetryDelay if shorter) goes to the shortest band at least as long.
// Every copy in a band waits more than half the band's length and at most
// all of it, so the copies queued ahead of a copy have expired by the end
// of the band's length after it was queued: a job comes back no sooner
// than its delay, and sooner than twice it. A delay longer than
// MaxRetryDelay is cut to it: the job comes back early, once finds the
// action still waiting, and Dispose sends it round again.
//
// # Settling
//
// Handle runs the work (which calls once.Do or once.DoTx) and settles the
// delivery, which must come from a consumer in manual-ack mode:
//
//	once.Dispose says   Handle does
//	JobAck              Ack
//	JobRetry            copy to the retry queue for max(After, MinRetryDelay), wait for
//	                    the broker's confirm, then Ack; without a confirm, Nack with
//	                    requeue, so the job is never lost (at worst delivered twice,
//	                    which once absorbs)
//	JobDrop             Reject without requeue: the broker dead-letters it to
//	                    DeadLetterQueue, or discards it when there is none
//	ctx done, JobRetry  Nack with requeue, for another consumer: the worker is stopping
//	work panicked       recovered and logged with its stack; a retry with the panic
//	                    counted (x-once-panics), and Reject at Config.MaxPanics (3)
//	forged count        Reject unrun: x-once-retries or x-once-panics negative, above
//	                    2^31-1 or not an integer
//
// The broker's Reject carries no reason: Handle returns it in the
// Disposition (and the error) for the caller's log.
//
// A retry with no delay (a released action, a database that was not
// there) also waits MinRetryDelay, so a job that fails at once cannot
// loop hot between a consumer and its queue.
//
// A job whose action awaits a person's approval
// (*once.AwaitingApprovalError) is not run. On a kind without a Redrive
// hook it goes round a retry queue, a minute at a time (just past the
// wait's expiry when that comes sooner; MaxRetryDelay at most), until a
// person decides: the first delivery after an approval runs it, and the
// first after the wait expired dead-letters it. RabbitMQ counts no
// deliveries, so the wait (ApprovalPolicy.Expiry, 24 hours by default)
// bounds the loop, at about one delivery a minute. On a kind with a
// Redrive hook the job is dead-lettered at once, and the reaper
// publishes it again once it is approved.
//
// # Publishing
//
// Retries, re-drives and Queue.Publish go to the default exchange with
// the mandatory flag, on a channel in confirm mode, and return only when
// the broker has confirmed the message: an unroutable message (its queue
// was deleted) is returned by the broker and reported as an error, not
// taken for delivered. A confirm-mode channel numbers its messages and
// confirms by number, and the broker's return carries no number at all,
// so each channel carries one message at a time: a publish takes a
// channel from a small pool (opening one when none is free), waits for
// its confirm and gives it back. Publishing is safe for concurrent use,
// and each concurrent publish has a channel of its own; a channel that
// failed, or whose confirm did not come in time, is closed rather than
// reused.
//
// The connection in Config.Conn is the application's: this package does
// not reconnect. Give it a connection with amqp091's automatic recovery
// (amqp091.Config.Recovery), or make a new Queue on a new connection.
// RabbitMQ's own advice is to publish on a different connection from the
// one consumers use, so that flow control on the publisher does not slow
// the acks.
//
// # Retry queues are quorum queues
//
// The broker moves an expired copy back to the work queue by
// dead-lettering it. A classic queue dead-letters at most once, without
// a confirm, and writes down lazily what it moved: when its node is
// killed, copies that moved to the work queue just before are lost, and
// a job whose claim never reached once's store (the database was cut off
// at the claim, and Dispose said retry) is then lost with nothing left
// to find it. So the retry queues are quorum queues with at-least-once
// dead-lettering (x-queue-type "quorum", x-dead-letter-strategy
// "at-least-once", x-overflow "reject-publish"): the retry queue keeps
// an expired copy until the work queue has confirmed it, and moves it
// again after a crash. A crash loses no copy, on one node or in a
// cluster; at worst a copy is moved twice, and once absorbs the
// duplicate. A copy that cannot be moved (the work queue was deleted, or
// its node is down) stays in its retry queue until it can. The work
// queue may be classic or quorum (Config.QueueArgs): either confirms a
// persistent message only once it has it on disk. A job published
// transient stays transient, and a classic work queue does not keep it
// across a restart of the broker.
//
// One caveat is the broker's: RabbitMQ writes down lazily which queues
// a node runs, and a queue declared moments before its node is killed
// can come back empty, whatever its type. It matters only when the
// first Declare and a crash come seconds apart.
//
// This needs RabbitMQ 3.10 or later (per-message expiration and
// at-least-once dead-lettering in quorum queues); Declare refuses an
// older broker. Each quorum queue is a Raft group of its own, with its
// own log on each of its replicas: a work queue brings one per band (13
// by default).
//
// Before quorum retry queues the adapter declared classic ones, named
// Config.Queue+".retry."+band. The new names differ, so Declare works
// on a broker that still has the old queues; the copies waiting in them
// still move back to the work queue when they expire. Delete the old
// queues once they are empty (rabbitmqctl list_queues name messages).
package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Defaults for the zero fields of Config.
const (
	// DefaultMinRetryDelay is the shortest wait of a retried job.
	DefaultMinRetryDelay = time.Second
	// DefaultMaxRetryDelay is the longest: a verifier's backoff reaches
	// an hour.
	DefaultMaxRetryDelay = time.Hour
	// DefaultConfirmTimeout bounds the wait for the broker's confirm.
	DefaultConfirmTimeout = 10 * time.Second
	// DefaultMaxPanics is the panic of the work on one job that
	// dead-letters it.
	DefaultMaxPanics = 3
)

// maxBands bounds the retry queues one work queue gets.
const maxBands = 32

// Config configures a Queue. Only Conn and Queue are required.
type Config struct {
	// Conn is the connection Declare, retries, re-drives and Publish use.
	// Required. It stays the caller's: Close does not close it.
	Conn *amqp.Connection
	// Queue is the work queue's name. Required.
	Queue string
	// DeadLetterQueue, if not empty, is declared, and the work queue is
	// declared to dead-letter to it (x-dead-letter-exchange "" and
	// x-dead-letter-routing-key), so a dropped job waits there for a
	// person. Empty means the work queue gets no dead-letter arguments:
	// dropped jobs are discarded, unless a broker policy names a
	// dead-letter exchange. The action is in once's store either way.
	DeadLetterQueue string
	// QueueArgs are further arguments for the work queue's declaration
	// (x-queue-type, x-max-length, …). They must agree with the queue if
	// it exists already.
	QueueArgs amqp.Table
	// MinRetryDelay is the shortest wait of a retried job, and the
	// length of the first retry queue: a retry with a shorter delay (or
	// none) waits this long. It must be a whole number of milliseconds,
	// the unit of a message's expiration. Zero means
	// DefaultMinRetryDelay (1 second).
	MinRetryDelay time.Duration
	// MaxRetryDelay is the longest: the retry queues double in length
	// from MinRetryDelay until one is at least this long, and a longer
	// delay is cut to it. Zero means DefaultMaxRetryDelay (1 hour).
	MaxRetryDelay time.Duration
	// ConfirmTimeout bounds the wait for the broker's confirm of a
	// retry, a re-drive or a Publish. A retry whose confirm does not come
	// in time requeues the job instead. Zero means DefaultConfirmTimeout
	// (10 seconds).
	ConfirmTimeout time.Duration
	// DeadLetterFailed rejects the job of an action that failed for
	// good (once.ErrFailed) instead of acking it, so it lands in the
	// dead-letter queue beside the dropped ones. Dispose acks it (the
	// failure is recorded, nothing is left to do); set this when
	// operators look for failed jobs in the dead-letter queue.
	DeadLetterFailed bool
	// MaxPanics bounds a poison job: work that panics is recovered, its
	// stack logged, and the job retried with the panic counted in
	// PanicCountHeader, until the MaxPanics-th panic rejects it (to the
	// dead-letter queue) with the panic as the reason. Zero means
	// DefaultMaxPanics (3); 1 rejects at the first panic.
	MaxPanics int
	// Logger gets the panics of the work, with their stacks. Nil means
	// slog.Default().
	Logger *slog.Logger
}

// Queue is one work queue with its retry and dead-letter queues: it
// declares them, settles deliveries, and publishes with confirms. It is
// safe for concurrent use; make one per work queue and share it.
type Queue struct {
	conn           *amqp.Connection
	name           string
	dlq            string
	args           amqp.Table
	bands          []time.Duration
	maxDelay       time.Duration
	confirmTimeout time.Duration
	deadFailed     bool
	maxPanics      int
	log            *slog.Logger

	mu     sync.Mutex
	idle   []*pubChannel
	closed bool
}

// New validates cfg and returns a Queue. It does no I/O: call Declare
// before the first job is consumed.
func New(cfg Config) (*Queue, error) {
	switch {
	case cfg.Conn == nil:
		return nil, errors.New("rabbitmq: Config.Conn is nil; pass the *amqp091.Connection to publish retries and re-drives on")
	case cfg.Queue == "":
		return nil, errors.New("rabbitmq: Config.Queue is empty; name the work queue")
	case strings.HasPrefix(cfg.Queue, "amq."):
		return nil, fmt.Errorf("rabbitmq: Config.Queue %q starts with \"amq.\", which the broker reserves; choose another name", cfg.Queue)
	case strings.HasPrefix(cfg.DeadLetterQueue, "amq."):
		return nil, fmt.Errorf("rabbitmq: Config.DeadLetterQueue %q starts with \"amq.\", which the broker reserves; choose another name", cfg.DeadLetterQueue)
	case cfg.DeadLetterQueue == cfg.Queue:
		return nil, fmt.Errorf("rabbitmq: Config.DeadLetterQueue is the work queue %q; name a queue of its own, or leave it empty", cfg.Queue)
	case cfg.MinRetryDelay < 0 || cfg.MaxRetryDelay < 0 || cfg.ConfirmTimeout < 0:
		return nil, errors.New("rabbitmq: Config.MinRetryDelay, MaxRetryDelay and ConfirmTimeout must not be negative; zero means the default")
	case cfg.MaxPanics < 0:
		return nil, fmt.Errorf("rabbitmq: Config.MaxPanics is %d; it must be at least 1, or zero for %d", cfg.MaxPanics, DefaultMaxPanics)
	case cfg.MinRetryDelay%time.Millisecond != 0:
		return nil, fmt.Errorf("rabbitmq: Config.MinRetryDelay is %v; it must be a whole number of milliseconds (a message's expiration is in milliseconds)", cfg.MinRetryDelay)
	}
	if cfg.DeadLetterQueue != "" {
		for _, k := range []string{"x-dead-letter-exchange", "x-dead-letter-routing-key"} {
			if _, ok := cfg.QueueArgs[k]; ok {
				return nil, fmt.Errorf("rabbitmq: Config.QueueArgs sets %s and Config.DeadLetterQueue is set too; leave one of them out", k)
			}
		}
	}
	minDelay := cmpOr(cfg.MinRetryDelay, DefaultMinRetryDelay)
	maxDelay := cmpOr(cfg.MaxRetryDelay, DefaultMaxRetryDelay)
	if maxDelay < minDelay {
		return nil, fmt.Errorf("rabbitmq: Config.MaxRetryDelay (%v) is shorter than MinRetryDelay (%v)", maxDelay, minDelay)
	}
	var bands []time.Duration
	for b := minDelay; ; b *= 2 {
		bands = append(bands, b)
		if b >= maxDelay {
			break
		}
		if len(bands) == maxBands {
			return nil, fmt.Errorf("rabbitmq: Config.MaxRetryDelay (%v) is more than 2^%d times MinRetryDelay (%v): that would take more than %d retry queues; raise MinRetryDelay or lower MaxRetryDelay",
				maxDelay, maxBands-1, minDelay, maxBands)
		}
	}
	q := &Queue{
		conn:           cfg.Conn,
		name:           cfg.Queue,
		dlq:            cfg.DeadLetterQueue,
		args:           cfg.QueueArgs,
		bands:          bands,
		maxDelay:       maxDelay,
		confirmTimeout: cmpOr(cfg.ConfirmTimeout, DefaultConfirmTimeout),
		deadFailed:     cfg.DeadLetterFailed,
		maxPanics:      DefaultMaxPanics,
		log:            cfg.Logger,
	}
	if cfg.MaxPanics > 0 {
		q.maxPanics = cfg.MaxPanics
	}
	if q.log == nil {
		q.log = slog.Default()
	}
	// A queue name is a short string: at most 255 bytes.
	for _, n := range append(q.RetryQueues(), q.name, q.dlq) {
		if len(n) > 255 {
			return nil, fmt.Errorf("rabbitmq: queue name %.40q… is %d bytes; the broker takes at most 255 (the retry queues add %d to Config.Queue)",
				n, len(n), len(q.retryQueue(len(bands)-1))-len(q.name))
		}
	}
	return q, nil
}

func cmpOr(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// Name is the work queue's name.
func (q *Queue) Name() string { return q.name }

// RetryQueues names the retry queues, shortest delay first, for
// monitoring (their depth is the number of jobs waiting to come back).
// They are quorum queues; see the package documentation.
func (q *Queue) RetryQueues() []string {
	names := make([]string, len(q.bands))
	for i := range q.bands {
		names[i] = q.retryQueue(i)
	}
	return names
}

func (q *Queue) retryQueue(band int) string {
	return q.name + ".retry.quorum." + q.bands[band].String()
}

// route says how long a retry that asked to wait after waits, and in
// which retry queue: between MinRetryDelay and MaxRetryDelay, rounded up
// to a whole millisecond, in the shortest band at least as long.
func (q *Queue) route(after time.Duration) (time.Duration, string) {
	d := min(max(after, q.bands[0]), q.maxDelay)
	d = (d + time.Millisecond - 1).Truncate(time.Millisecond)
	last := len(q.bands) - 1
	for i, b := range q.bands[:last] {
		if d <= b {
			return d, q.retryQueue(i)
		}
	}
	return d, q.retryQueue(last)
}

// Declare declares the work queue, its retry queues and the dead-letter
// queue, all durable; the retry queues are quorum queues with
// at-least-once dead-lettering. It is idempotent, and safe to run from
// every worker at start-up. A queue that exists with other arguments
// makes the broker refuse the declaration; the error names it. A broker
// older than RabbitMQ 3.10 is refused, since its quorum queues would
// never expire a retried job.
func (q *Queue) Declare(ctx context.Context) error {
	if err := checkVersion(q.conn.Properties); err != nil {
		return err
	}
	ch, err := q.conn.Channel()
	if err != nil {
		return fmt.Errorf("rabbitmq: opening a channel to declare the queues: %w", err)
	}
	defer ch.Close()
	declare := func(name string, args amqp.Table) error {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("rabbitmq: declaring queue %q: %w", name, err)
		}
		if _, err := ch.QueueDeclare(name, true, false, false, false, args); err != nil {
			var ae *amqp.Error
			if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
				return fmt.Errorf("rabbitmq: queue %q exists with other settings (%s); delete it, or declare it durable with the arguments %v: %w", name, ae.Reason, args, err)
			}
			return fmt.Errorf("rabbitmq: declaring queue %q: %w", name, err)
		}
		return nil
	}
	if q.dlq != "" {
		if err := declare(q.dlq, nil); err != nil {
			return err
		}
	}
	args := amqp.Table{}
	for k, v := range q.args {
		args[k] = v
	}
	if q.dlq != "" {
		args["x-dead-letter-exchange"] = ""
		args["x-dead-letter-routing-key"] = q.dlq
	}
	if err := declare(q.name, args); err != nil {
		return err
	}
	for _, name := range q.RetryQueues() {
		if err := declare(name, retryQueueArgs(q.name)); err != nil {
			return err
		}
	}
	return nil
}

// retryQueueArgs are the arguments of a retry queue that dead-letters to
// the work queue named work. At-least-once dead-lettering needs
// x-overflow reject-publish: with the default drop-head the broker falls
// back to at most once.
func retryQueueArgs(work string) amqp.Table {
	return amqp.Table{
		"x-queue-type":              "quorum",
		"x-dead-letter-strategy":    "at-least-once",
		"x-overflow":                "reject-publish",
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": work,
	}
}

// checkVersion refuses a broker older than RabbitMQ 3.10, whose quorum
// queues neither expire messages nor dead-letter at least once. A broker
// that does not say its version, or says it in another form, is let
// through: the declaration or the first retry tells.
func checkVersion(props amqp.Table) error {
	v, _ := props["version"].(string)
	var major, minor int
	if _, err := fmt.Sscanf(v, "%d.%d", &major, &minor); err != nil {
		return nil
	}
	if major < 3 || major == 3 && minor < 10 {
		return fmt.Errorf("rabbitmq: the broker is RabbitMQ %s; the retry queues are quorum queues with per-message expiration and at-least-once dead-lettering, which need RabbitMQ 3.10 or later: upgrade the broker", v)
	}
	return nil
}

// Close closes the idle publishing channels; a publish still running
// closes its own when it ends. It does not close Config.Conn. Later
// retries and re-drives fail (and a retried job is requeued).
func (q *Queue) Close() error {
	q.mu.Lock()
	idle := q.idle
	q.idle, q.closed = nil, true
	q.mu.Unlock()
	var errs []error
	for _, pc := range idle {
		if err := pc.ch.Close(); err != nil && !errors.Is(err, amqp.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
