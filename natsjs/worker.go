package natsjs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/oncehq/once"
)

// Defaults for the zero fields of Config.
const (
	// DefaultProgress is the interval between InProgress signals when
	// neither Config.Progress nor the consumer's AckWait is known: a
	// third of JetStream's default AckWait (30 seconds).
	DefaultProgress = 10 * time.Second
	// DefaultRetryDelay is the first delivery's wait before a retry whose
	// disposition names no wait of its own.
	DefaultRetryDelay = time.Second
	// DefaultMaxRetryDelay caps the doubling of RetryDelay.
	DefaultMaxRetryDelay = time.Minute
	// DefaultAckTimeout bounds the wait for the server to confirm an ack.
	DefaultAckTimeout = 5 * time.Second
	// DefaultDrainTimeout is how long Consume lets running jobs finish
	// after its context ends before it cancels them.
	DefaultDrainTimeout = 30 * time.Second
	// DefaultMaxPanics is the panic on one message that terminates it.
	DefaultMaxPanics = 3
)

// jetStreamAckWait is the AckWait the server uses when a consumer sets
// none.
const jetStreamAckWait = 30 * time.Second

// Config configures a Worker. The zero value is usable.
type Config struct {
	// Progress is the interval between InProgress signals while a job
	// function runs. Zero means a third of the consumer's AckWait (or of
	// its shortest BackOff step): read from the consumer's cached info
	// by Consume, and asked of the server once per consumer by Handle
	// (which also learns the consumer's MaxDeliver there, and asks again
	// a few seconds after a lookup that failed); DefaultProgress while
	// that fails.
	Progress time.Duration
	// RetryDelay is the wait before a retried job is delivered again
	// when its disposition names none (once.Disposition.After is zero:
	// released, the database unreachable), doubled with every delivery
	// of the message up to MaxRetryDelay, so a job that keeps failing
	// does not spin. A disposition's own After is used when it is
	// longer. Zero means DefaultRetryDelay.
	RetryDelay time.Duration
	// MaxRetryDelay caps the doubling of RetryDelay. Zero means
	// DefaultMaxRetryDelay.
	MaxRetryDelay time.Duration
	// AckTimeout bounds the wait for the server to confirm an ack
	// (DoubleAck). Zero means DefaultAckTimeout.
	AckTimeout time.Duration
	// Concurrency is how many job functions Consume runs at once. Zero
	// means 1.
	Concurrency int
	// DrainTimeout is how long Consume lets running jobs finish after
	// its context ends; then their context is cancelled. Zero means
	// DefaultDrainTimeout.
	DrainTimeout time.Duration
	// MaxPanics bounds a poison message: a job function that panics is
	// recovered, its stack logged, and its message handed back with the
	// backoff, until its MaxPanics-th panic terminates it, with the panic
	// as the reason. The worker counts the panics itself (JetStream
	// counts deliveries, and a job retried for another reason is no
	// poison); a count starts again in a new process, and each worker
	// counts its own, so each worker meets a poison message at most
	// MaxPanics times. Zero means DefaultMaxPanics (3); 1 terminates at
	// the first panic.
	MaxPanics int
	// OnSettle, if not nil, is called by Consume after each message was
	// settled, with what Handle returned, in place of the log line
	// Consume writes otherwise: count dispositions, alert on settlement
	// errors (and on ErrLastDelivery). It is called from the jobs'
	// goroutines, concurrently, so it must be safe for that.
	OnSettle func(msg jetstream.Msg, d once.Disposition, err error)
	// Logger gets Consume's line per settled message and its consumer
	// errors. Nil means slog.Default().
	Logger *slog.Logger
}

// Worker runs job functions for JetStream messages and settles each
// message by what once recorded. It is safe for concurrent use.
type Worker struct {
	js  jetstream.JetStream
	cfg Config
	log *slog.Logger

	// consumers caches, per stream and consumer, what Handle needs of
	// the consumer's configuration (a *consumerEntry). A lookup that
	// failed is kept only for a while (retryAfter), then asked again.
	consumers   sync.Map
	lookupRetry time.Duration

	// panics counts the panics of each message this worker handed
	// back (by stream, consumer and stream sequence), at most
	// maxTrackedPanics of them.
	panicsMu sync.Mutex
	panics   map[string]panicCount
	// overflowed is when a count last found no room: until it is stale,
	// a message without a count may have panicked uncounted, so its
	// deliveries bound it.
	overflowed time.Time
}

// panicCount is a message's panics, and when the last one was.
type panicCount struct {
	n    int
	last time.Time
}

// maxTrackedPanics bounds Worker.panics, so a flood of poison messages
// costs bounded memory. When it is full, stale counts (of a message
// another worker settled) are dropped; if it is still full, a message
// without a count is bounded by its delivery count instead, until the
// overflow is stale: that counts other deliveries too, but holds the
// bound.
const maxTrackedPanics = 4096

// defaultLookupRetry is how long a failed lookup of a consumer stands
// before a message of that consumer asks again (doubled with each
// failure in a row, up to maxLookupRetry): long enough that a
// server that refuses the lookup (a permission, a JetStream API that
// times out) does not cost every message a round trip, short enough
// that a passing failure leaves no worker blind for its life.
const defaultLookupRetry = 5 * time.Second

// JobFunc is the application's work for one message: decode the job,
// call once.Do (or once.DoTx) for each of its effects, and return the
// error Do returned (nil when every effect succeeded or was replayed).
// The error decides how the message is settled (see the package
// documentation). Return once.Permanent(err) for a job refused before
// any Do (it cannot be decoded): the message is terminated, since no
// delivery will decode it.
type JobFunc func(ctx context.Context, msg jetstream.Msg) error

// New returns a worker that settles messages of js's connection. js is
// used to learn a consumer's AckWait and the server's version (a reason
// travels with Term only on servers from 2.10.4, which understand it).
func New(js jetstream.JetStream, cfg Config) (*Worker, error) {
	switch {
	case js == nil:
		return nil, errors.New("natsjs: New needs a jetstream.JetStream; make one with jetstream.New(nc)")
	case cfg.Progress < 0, cfg.RetryDelay < 0, cfg.MaxRetryDelay < 0, cfg.AckTimeout < 0, cfg.DrainTimeout < 0:
		return nil, errors.New("natsjs: Config.Progress, RetryDelay, MaxRetryDelay, AckTimeout and DrainTimeout must not be negative; zero means the default")
	case cfg.Concurrency < 0:
		return nil, fmt.Errorf("natsjs: Config.Concurrency is %d; it must be at least 1, or zero for 1", cfg.Concurrency)
	case cfg.MaxPanics < 0:
		return nil, fmt.Errorf("natsjs: Config.MaxPanics is %d; it must be at least 1, or zero for %d", cfg.MaxPanics, DefaultMaxPanics)
	case cfg.RetryDelay > 0 && cfg.MaxRetryDelay > 0 && cfg.MaxRetryDelay < cfg.RetryDelay:
		return nil, fmt.Errorf("natsjs: Config.MaxRetryDelay (%v) is shorter than RetryDelay (%v)", cfg.MaxRetryDelay, cfg.RetryDelay)
	}
	cfg.RetryDelay = cmp.Or(cfg.RetryDelay, DefaultRetryDelay)
	cfg.MaxRetryDelay = cmp.Or(cfg.MaxRetryDelay, max(DefaultMaxRetryDelay, cfg.RetryDelay))
	cfg.AckTimeout = cmp.Or(cfg.AckTimeout, DefaultAckTimeout)
	cfg.Concurrency = cmp.Or(cfg.Concurrency, 1)
	cfg.DrainTimeout = cmp.Or(cfg.DrainTimeout, DefaultDrainTimeout)
	cfg.MaxPanics = cmp.Or(cfg.MaxPanics, DefaultMaxPanics)
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Worker{js: js, cfg: cfg, log: log, lookupRetry: defaultLookupRetry}, nil
}

// ErrLastDelivery is joined to the error Handle returns when a job that
// needed another delivery got its consumer's last one (MaxDeliver):
// JetStream does not deliver it again, so Handle terminates it instead
// of calling it a retry. If once holds the job's action, the kind's
// Redrive hook brings it back once it is released or approved; if the job failed
// before any Do claimed it (the database unreachable), or was handed
// back unrun, nothing does: publish it again.
var ErrLastDelivery = errors.New("natsjs: the consumer's last delivery (MaxDeliver) of a job that needed another; JetStream does not deliver it again")

// ErrDeliveryLimitUnknown is joined to the error Handle returns when a
// job that needed another delivery was handed back (Nak) while its
// consumer's MaxDeliver could not be read: if this was the last
// delivery, JetStream does not deliver it again. Handle asks for the
// consumer again on a later message; give the worker's user the right
// to read it ($JS.API.CONSUMER.INFO).
var ErrDeliveryLimitUnknown = errors.New("natsjs: the consumer's MaxDeliver could not be read; if this was its last delivery, JetStream does not deliver the job again")

// ErrPanicked matches a *PanicError.
var ErrPanicked = errors.New("natsjs: the job function panicked")

// PanicError is the error Handle returns for a job function that
// panicked: the panic is recovered, so one poison message does not kill
// the worker and every job behind it.
type PanicError struct {
	// Value is what the function panicked with.
	Value any
	// Stack is the goroutine's stack at the panic.
	Stack []byte
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("natsjs: the job function panicked: %v", e.Value)
}
func (e *PanicError) Is(target error) bool { return target == ErrPanicked }

// ErrNotSettled matches a *SettleError.
var ErrNotSettled = errors.New("natsjs: message not settled")

// SettleError reports a settlement (ack, nak or term) that the server
// did not take or did not confirm. Nothing is lost: what the job did is
// recorded by once, and the message comes back after AckWait, when its
// next delivery is settled the same way (an ack after a replay).
type SettleError struct {
	// Action is the settlement that failed.
	Action once.JobAction
	Err    error
}

func (e *SettleError) Error() string {
	return fmt.Sprintf("natsjs: %s not settled: %v; the message comes back after AckWait and its next delivery settles it", e.Action, e.Err)
}
func (e *SettleError) Is(target error) bool { return target == ErrNotSettled }
func (e *SettleError) Unwrap() error        { return e.Err }

// Handle runs fn for msg and settles msg by what fn returned, and
// returns the disposition it applied (After is the delay it asked for)
// and an error for the log: fn's error as it returned it, joined with a
// *SettleError when the settlement failed. Call it from any loop that
// takes messages (Consumer.Consume, Messages, Fetch), or use Consume.
//
// While fn runs, msg.InProgress is sent every Config.Progress. ctx is
// the worker's: when it has ended before fn starts, fn is not run and
// msg is handed back (Nak); when it has ended by the time fn returns, a
// retry is a Nak without the backoff, so another worker takes the job at
// once. An ack is sent only when once recorded the outcome (Dispose says
// JobAck), never because the worker stops. A retry on the consumer's
// last delivery (its MaxDeliver) is terminated instead, with
// ErrLastDelivery joined to the error: JetStream would not deliver it
// again. A panic in fn is recovered and returned as a *PanicError, its
// stack logged; the message is retried, and terminated at its
// Config.MaxPanics-th panic.
func (w *Worker) Handle(ctx context.Context, msg jetstream.Msg, fn JobFunc) (once.Disposition, error) {
	switch {
	case w == nil:
		return retry("not run: nil *Worker"), errors.New("natsjs: Handle called on a nil *Worker; build one with natsjs.New")
	case msg == nil:
		return retry("not run: no message"), errors.New("natsjs: Handle called with a nil message")
	case fn == nil:
		return retry("not run: no job function"), errors.New("natsjs: Handle called with a nil job function; pass the function that calls once.Do")
	}
	meta, err := msg.Metadata()
	if err != nil {
		return retry("not run: not a JetStream message"), fmt.Errorf("natsjs: the message on %q carries no JetStream metadata, so it cannot be acknowledged: %w; take messages from a jetstream.Consumer with explicit acks", msg.Subject(), err)
	}
	facts := w.consumer(ctx, meta)
	if ctx.Err() != nil {
		d, last := w.lastDelivery(ctx, meta, facts, retry("not run: the worker is stopping"))
		serr := w.settle(ctx, msg, d)
		return d, errors.Join(fmt.Errorf("natsjs: job not run, the worker is stopping: %w", context.Cause(ctx)), last, serr)
	}

	stop := keepAlive(msg, cmp.Or(w.cfg.Progress, facts.progress), w.log)
	ferr := func() (err error) {
		defer stop()
		defer func() {
			if p := recover(); p != nil {
				err = &PanicError{Value: p, Stack: debug.Stack()}
			}
		}()
		return fn(ctx, msg)
	}()

	d := dispose(ferr)
	var pe *PanicError
	if errors.As(ferr, &pe) {
		d = w.poison(msg, meta, pe)
	} else if d.Action != once.JobRetry {
		w.forgetPanics(meta)
	}
	if d.Action == once.JobRetry {
		if ctx.Err() != nil {
			// Stopping: hand the job to another worker now. A wait the
			// action itself needs (a lease) still holds.
			d.Reason += "; the worker is stopping"
		} else {
			d.After = max(d.After, w.backoff(meta.NumDelivered))
		}
	}
	d, last := w.lastDelivery(ctx, meta, facts, d)
	serr := w.settle(ctx, msg, d)
	if serr == nil && last == nil {
		return d, ferr // as fn returned it
	}
	return d, errors.Join(ferr, last, serr)
}

// maxPanicReason bounds the panic value quoted in a Term's reason.
const maxPanicReason = 200

// poison logs a job function's panic, with its stack, and says what to
// do with its message: hand it back for another delivery, or terminate
// it at its MaxPanics-th panic, so a poison message neither kills the
// worker nor goes round for ever.
func (w *Worker) poison(msg jetstream.Msg, meta *jetstream.MsgMetadata, pe *PanicError) once.Disposition {
	v := fmt.Sprint(pe.Value)
	if len(v) > maxPanicReason {
		v = strings.ToValidUTF8(v[:maxPanicReason], "") + "…"
	}
	n, counted := w.countPanic(meta)
	count := fmt.Sprintf("panic %d of at most %d", n, w.cfg.MaxPanics)
	if !counted {
		n = int(min(meta.NumDelivered, uint64(w.cfg.MaxPanics)))
		count = fmt.Sprintf("too many messages' panics to count, so its deliveries count, at most %d", w.cfg.MaxPanics)
	}
	final := n >= w.cfg.MaxPanics
	if final {
		w.forgetPanics(meta)
	}
	w.log.Error("natsjs: the job function panicked",
		"job", jobOf(msg, meta), "delivered", meta.NumDelivered, "panics", n, "counted", counted, "max_panics", w.cfg.MaxPanics, "terminated", final,
		"panic", v, "stack", string(pe.Stack))
	if final {
		return once.Disposition{Action: once.JobDrop, Reason: fmt.Sprintf("the job function panicked on delivery %d (%s, Config.MaxPanics): %s; terminated as a poison message",
			meta.NumDelivered, count, v)}
	}
	return retry(fmt.Sprintf("the job function panicked on delivery %d (%s): %s", meta.NumDelivered, count, v))
}

// panicKey names a message for Worker.panics.
func panicKey(meta *jetstream.MsgMetadata) string {
	return meta.Stream + "\x00" + meta.Consumer + "\x00" + strconv.FormatUint(meta.Sequence.Stream, 10)
}

// countPanic counts one more panic of the message and returns its
// count; counted is false when there was no room to count it.
func (w *Worker) countPanic(meta *jetstream.MsgMetadata) (n int, counted bool) {
	k := panicKey(meta)
	now := time.Now()
	w.panicsMu.Lock()
	defer w.panicsMu.Unlock()
	if w.panics == nil {
		w.panics = map[string]panicCount{}
	}
	// A poison message panics again within its backoff, at most
	// MaxRetryDelay: a count older than many of those is stale.
	stale := now.Add(-10 * w.cfg.MaxRetryDelay)
	c, ok := w.panics[k]
	if !ok && meta.NumDelivered > 1 && w.overflowed.After(stale) {
		return 0, false // it may have panicked before, uncounted
	}
	if !ok && len(w.panics) >= maxTrackedPanics {
		for old, oc := range w.panics {
			if oc.last.Before(stale) {
				delete(w.panics, old)
			}
		}
		if len(w.panics) >= maxTrackedPanics {
			w.overflowed = now
			return 0, false
		}
	}
	c.n++
	c.last = now
	w.panics[k] = c
	return c.n, true
}

// forgetPanics drops the panic count of a message that is settled for
// good.
func (w *Worker) forgetPanics(meta *jetstream.MsgMetadata) {
	w.panicsMu.Lock()
	defer w.panicsMu.Unlock()
	if len(w.panics) > 0 {
		delete(w.panics, panicKey(meta))
	}
}

// jobOf names msg's job for the log: its stream and sequence, and its
// Nats-Msg-Id when it has one.
func jobOf(msg jetstream.Msg, meta *jetstream.MsgMetadata) string {
	job := meta.Stream + "/" + strconv.FormatUint(meta.Sequence.Stream, 10)
	if id := msg.Headers().Get(jetstream.MsgIDHeader); id != "" {
		job += " (Nats-Msg-Id " + strconv.Quote(id) + ")"
	}
	return job
}

func retry(reason string) once.Disposition {
	return once.Disposition{Action: once.JobRetry, Reason: reason}
}

// dispose is once.Dispose, except in two cases.
//
// A job that failed for good is terminated rather than acked: JetStream
// tells a finished message from one given up on (an advisory, a
// dead-letter consumer), and a declined card or an invalid address is
// the second. (once.Permanent returned by the job function before any
// Do, an undecodable job, is terminated by Dispose itself.)
//
// A superseded attempt (*once.FencedError) hands the message back rather
// than acking it, whatever its outcome. Its claim lapsed, so the message
// was most likely delivered again meanwhile, and the newer attempt runs
// on that delivery. JetStream settles a message, not one delivery of it:
// this delivery's ack would settle the newer one's too, and if the newer
// attempt then ends released, its Nak finds nothing to hand back and
// the action waits for a delivery that never comes. The next delivery
// replays the outcome or meets the newer claim.
func dispose(err error) once.Disposition {
	var fenced *once.FencedError
	d := once.Dispose(err)
	switch {
	case errors.As(err, &fenced):
		return once.Disposition{Action: once.JobRetry, Reason: "superseded by a newer attempt (" + string(fenced.Outcome) +
			" when fenced out); handed back, since an ack would settle the newer attempt's delivery of the message too"}
	case d.Action == once.JobAck && errors.Is(err, once.ErrFailed):
		// Dispose acks only when nothing is left to do (for joined
		// errors, when every one is done).
		return once.Disposition{Action: once.JobDrop, Reason: "failed permanently; recorded"}
	}
	return d
}

// settle sends the settlement d names. The worker's context may have
// ended; a settlement is sent all the same, bounded by AckTimeout.
func (w *Worker) settle(ctx context.Context, msg jetstream.Msg, d once.Disposition) error {
	var err error
	switch d.Action {
	case once.JobAck:
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.AckTimeout)
		err = msg.DoubleAck(actx)
		cancel()
	case once.JobRetry:
		if d.After > 0 {
			err = msg.NakWithDelay(d.After)
		} else {
			err = msg.Nak()
		}
	case once.JobDrop:
		if w.termReasons() {
			err = msg.TermWithReason(d.Reason)
		} else {
			err = msg.Term()
		}
	default:
		err = fmt.Errorf("unknown job action %v", d.Action)
	}
	if err != nil {
		return &SettleError{Action: d.Action, Err: err}
	}
	return nil
}

// settlement names what settle sends for d, for the log.
func (w *Worker) settlement(d once.Disposition) string {
	switch d.Action {
	case once.JobAck:
		return "DoubleAck"
	case once.JobRetry:
		if d.After > 0 {
			return "NakWithDelay"
		}
		return "Nak"
	case once.JobDrop:
		if w.termReasons() {
			return "TermWithReason"
		}
		return "Term"
	}
	return d.Action.String()
}

// termReasons reports whether the connected server takes a reason with
// Term.
func (w *Worker) termReasons() bool {
	return termReasonSupported(w.js.Conn().ConnectedServerVersion())
}

// termReasonSupported reports whether a server of version v takes a
// reason with Term. Servers before 2.10.4 ignore "+TERM reason"
// altogether, so the message would be delivered again instead of
// terminated.
func termReasonSupported(v string) bool {
	v = strings.TrimPrefix(v, "v")
	v, _, _ = strings.Cut(v, "-")
	parts := strings.Split(v, ".")
	if len(parts) != 3 {
		return false
	}
	var n [3]int
	for i, p := range parts {
		x, err := strconv.Atoi(p)
		if err != nil {
			return false
		}
		n[i] = x
	}
	return n[0] > 2 || n[0] == 2 && (n[1] > 10 || n[1] == 10 && n[2] >= 4)
}

// backoff is the retry delay for a message delivered n times.
func (w *Worker) backoff(n uint64) time.Duration {
	d := w.cfg.RetryDelay
	for i := uint64(1); i < n && d < w.cfg.MaxRetryDelay; i++ {
		d *= 2
	}
	return min(d, w.cfg.MaxRetryDelay)
}

// consumerFacts is what Handle needs of a message's consumer.
type consumerFacts struct {
	// progress is the InProgress interval its AckWait calls for.
	progress time.Duration
	// maxDeliver is its MaxDeliver; zero or less for no limit.
	maxDeliver int
	// lookupErr is why the consumer could not be read, and lookedUp
	// when; progress and maxDeliver are then not known.
	lookupErr error
	lookedUp  time.Time
}

func factsOf(c jetstream.ConsumerConfig) consumerFacts {
	return consumerFacts{progress: progressFor(c), maxDeliver: c.MaxDeliver}
}

// lastDelivery is facts.lastDelivery, with the consumer asked again
// before a retry is terminated as its last delivery: its MaxDeliver may
// have been raised since the worker read it, and the job would be
// dropped with deliveries left (TestMaxDeliverRaisedIsReadAgain). It
// costs a lookup only on what looks like a last delivery.
func (w *Worker) lastDelivery(ctx context.Context, meta *jetstream.MsgMetadata, facts consumerFacts, d once.Disposition) (once.Disposition, error) {
	nd, err := facts.lastDelivery(meta, d)
	if !errors.Is(err, ErrLastDelivery) {
		return nd, err
	}
	again := w.consumerAgain(ctx, meta)
	if again.lookupErr != nil {
		// Not answered now: what was read before decides.
		return nd, err
	}
	return again.lastDelivery(meta, d)
}

// lastDelivery turns d, a retry, into a termination when meta is its
// consumer's last delivery: a Nak would not bring the job back, so the
// disposition says what happens, and the error returned (matching
// ErrLastDelivery) lets the log say it louder than a retry.
func (f consumerFacts) lastDelivery(meta *jetstream.MsgMetadata, d once.Disposition) (once.Disposition, error) {
	if d.Action == once.JobRetry && f.lookupErr != nil {
		// Not known to be unlimited: handed back, and said out loud
		// (TestConsumerLookupFailureIsAskedAgain).
		return d, fmt.Errorf("%w (delivery %d; reading it failed: %v)", ErrDeliveryLimitUnknown, meta.NumDelivered, f.lookupErr)
	}
	if d.Action != once.JobRetry || f.maxDeliver <= 0 || meta.NumDelivered < uint64(f.maxDeliver) {
		return d, nil
	}
	d = once.Disposition{Action: once.JobDrop, Reason: fmt.Sprintf("%s; but this was the consumer's last delivery (MaxDeliver %d), and JetStream does not deliver it again: terminated", d.Reason, f.maxDeliver)}
	return d, ErrLastDelivery
}

// consumerEntry is what a worker knows of one consumer, and the lookup
// of it in flight.
type consumerEntry struct {
	mu    sync.Mutex
	facts consumerFacts
	have  bool // a lookup ended (or Consume read the facts)
	// asking is closed when the lookup in flight ends; nil when none is.
	asking chan struct{}
	// failures counts the lookups that failed in a row.
	failures int
}

// maxLookupRetry caps the growing wait between lookups that fail.
const maxLookupRetry = time.Minute

// consumer returns the facts of meta's consumer: cached, or asked of the
// server once per consumer. A lookup that failed is asked again after
// lookupRetry, doubled with each failure in a row up to a minute, so one
// failure does not leave the worker without its consumer's MaxDeliver
// and AckWait for its life. One message asks at a time; the others take
// what is known meanwhile (a failure's defaults), or, before anything
// is, wait for that lookup.
func (w *Worker) consumer(ctx context.Context, meta *jetstream.MsgMetadata) consumerFacts {
	e := w.entry(meta)
	e.mu.Lock()
	if e.have && (e.facts.lookupErr == nil || e.asking != nil || time.Since(e.facts.lookedUp) < w.retryAfter(e.failures)) {
		f := e.facts
		e.mu.Unlock()
		return f
	}
	e.mu.Unlock()
	// Nothing known yet, or a failure due to be asked again: ask, or
	// wait for the lookup another message makes (bounded by its own
	// timeout).
	return w.ask(ctx, meta, e)
}

// consumerAgain asks the server for meta's consumer whatever is cached,
// or waits for the lookup in flight, and returns what it found.
func (w *Worker) consumerAgain(ctx context.Context, meta *jetstream.MsgMetadata) consumerFacts {
	return w.ask(ctx, meta, w.entry(meta))
}

// entry is what the worker knows of meta's consumer.
func (w *Worker) entry(meta *jetstream.MsgMetadata) *consumerEntry {
	v, _ := w.consumers.LoadOrStore(meta.Stream+"\x00"+meta.Consumer, &consumerEntry{})
	return v.(*consumerEntry)
}

// ask looks the consumer up for e, whose lock is not held, as the one
// lookup in flight.
func (w *Worker) ask(ctx context.Context, meta *jetstream.MsgMetadata, e *consumerEntry) (f consumerFacts) {
	ch := make(chan struct{})
	e.mu.Lock()
	if e.asking != nil {
		// Another message started one meanwhile: take its answer.
		ch = e.asking
		e.mu.Unlock()
		<-ch
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.facts
	}
	e.asking = ch
	e.mu.Unlock()
	f = consumerFacts{progress: DefaultProgress, lookupErr: errors.New("the lookup did not end"), lookedUp: time.Now()}
	defer func() {
		// Also when the lookup panics: nobody waits on it for ever.
		e.mu.Lock()
		switch {
		case f.lookupErr == nil:
			e.facts, e.failures = f, 0
		case e.have && e.facts.lookupErr == nil:
			// Asked again (consumerAgain) and not answered: what was
			// read before still stands.
		default:
			e.facts = f
			e.failures++
		}
		e.have, e.asking = true, nil
		failures := e.failures
		e.mu.Unlock()
		close(ch)
		if f.lookupErr != nil {
			w.log.Warn("natsjs: cannot read the consumer's AckWait and MaxDeliver; sending InProgress at the default interval, and asking again later",
				"stream", meta.Stream, "consumer", meta.Consumer, "interval", f.progress, "retry_after", w.retryAfter(failures), "err", f.lookupErr)
		}
	}()
	f = w.lookup(ctx, meta)
	return f
}

// retryAfter is how long a lookup's failure stands after n in a row.
func (w *Worker) retryAfter(n int) time.Duration {
	d := w.lookupRetry
	for i := 1; i < n && d < maxLookupRetry; i++ {
		d *= 2
	}
	return min(d, maxLookupRetry)
}

// lookup asks the server for meta's consumer.
func (w *Worker) lookup(ctx context.Context, meta *jetstream.MsgMetadata) consumerFacts {
	// Asked even when ctx has ended: a job handed back unrun needs the
	// consumer's MaxDeliver too.
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	c, err := w.js.Consumer(ictx, meta.Stream, meta.Consumer)
	if err != nil {
		return consumerFacts{progress: DefaultProgress, lookupErr: err, lookedUp: time.Now()}
	}
	return factsOf(c.CachedInfo().Config)
}

// progressFor is a third of the shortest wait after which the server
// delivers an unacknowledged message again.
func progressFor(c jetstream.ConsumerConfig) time.Duration {
	wait := cmp.Or(c.AckWait, jetStreamAckWait)
	for _, b := range c.BackOff {
		if b > 0 {
			wait = min(wait, b)
		}
	}
	return max(wait/3, time.Millisecond)
}

// keepAlive sends InProgress for msg every interval until stop is
// called; stop returns once no more will be sent. A failed signal is
// logged and the next one tried: if none gets through, the message comes
// back after AckWait and the claim answers the duplicate.
func keepAlive(msg jetstream.Msg, every time.Duration, log *slog.Logger) (stop func()) {
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if err := msg.InProgress(); err != nil {
					log.Debug("natsjs: InProgress not sent", "subject", msg.Subject(), "err", err)
				}
			}
		}
	}()
	return func() {
		close(done)
		<-exited
	}
}
