package natsjs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/oncehq/once"
)

// Consume runs fn, through Handle, for every message cons delivers, up to
// Config.Concurrency at once, until ctx ends or the consumer stops
// (deleted, the connection closed).
//
// When ctx ends, Consume stops taking messages (the ones already in the
// client's buffer are handed back with a Nak, unrun), lets the running
// jobs finish within Config.DrainTimeout, then cancels their context and
// waits for them, and returns nil. When the consumer stops on its own,
// Consume waits for the running jobs the same way and returns the error
// that stopped it. Each settled message is passed to Config.OnSettle, or
// logged.
//
// The consumer must acknowledge explicitly (jetstream.AckExplicitPolicy).
// opts go to cons.Consume. Unless they set PullMaxMessages or
// PullMaxBytes, the client pulls one message at a time, so a message
// waits in this worker only for a free slot, and gets InProgress while it
// waits; a
// ConsumeErrHandler among them replaces the one that logs consumer
// errors and reports what stopped the consumer.
func (w *Worker) Consume(ctx context.Context, cons jetstream.Consumer, fn JobFunc, opts ...jetstream.PullConsumeOpt) error {
	switch {
	case w == nil:
		return errors.New("natsjs: Consume called on a nil *Worker; build one with natsjs.New")
	case cons == nil:
		return errors.New("natsjs: Consume needs a jetstream.Consumer; get one with stream.Consumer or js.CreateOrUpdateConsumer")
	case fn == nil:
		return errors.New("natsjs: Consume called with a nil job function; pass the function that calls once.Do")
	}
	name := "consumer"
	if info := cons.CachedInfo(); info != nil {
		name = fmt.Sprintf("consumer %s of stream %s", info.Name, info.Stream)
		if p := info.Config.AckPolicy; p != jetstream.AckExplicitPolicy {
			// AckAll would let one finished job ack the jobs still
			// running before it; AckNone never delivers a job again.
			return fmt.Errorf("natsjs: %s has AckPolicy %s; jobs are settled one by one, so it needs jetstream.AckExplicitPolicy", name, p)
		}
		w.consumers.Store(info.Stream+"\x00"+info.Name, &consumerEntry{facts: factsOf(info.Config), have: true})
	}

	// Jobs run on a context of their own, cancelled only when the drain
	// time is up, so a job running at shutdown may finish and settle.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	var (
		mu      sync.Mutex
		closed  bool // no job starts after it is set
		stopErr error
		running sync.WaitGroup
	)
	slots := make(chan struct{}, w.cfg.Concurrency)
	handBack := func(msg jetstream.Msg) {
		d := retry("not run: the worker is stopping")
		var last error
		if meta, err := msg.Metadata(); err == nil {
			d, last = w.consumer(work, meta).lastDelivery(meta, d)
		}
		w.report(msg, d, errors.Join(last, w.settle(ctx, msg, d)))
	}
	handler := func(msg jetstream.Msg) {
		// The message is this worker's while it waits for a slot: keep
		// it alive like a running one, or the server delivers it again
		// (spending one of MaxDeliver) while it waits.
		stop := func() {}
		if meta, err := msg.Metadata(); err == nil {
			stop = keepAlive(msg, cmp.Or(w.cfg.Progress, w.consumer(work, meta).progress), w.log)
		}
		select {
		case slots <- struct{}{}:
			stop()
		case <-ctx.Done():
			stop()
			handBack(msg)
			return
		}
		mu.Lock()
		if closed || ctx.Err() != nil {
			mu.Unlock()
			<-slots
			handBack(msg)
			return
		}
		running.Add(1)
		mu.Unlock()
		go func() {
			defer running.Done()
			defer func() { <-slots }()
			d, err := w.Handle(work, msg, fn)
			w.report(msg, d, err)
		}()
	}
	onErr := jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConnectionClosed) || errors.Is(err, jetstream.ErrBadRequest) {
			mu.Lock()
			if stopErr == nil {
				stopErr = err
			}
			mu.Unlock()
		}
		w.log.Warn("natsjs: consumer error", "consumer", name, "err", err)
	})
	all := []jetstream.PullConsumeOpt{onErr}
	if !setsBuffer(opts) {
		// One message at a time: the client pulls the next only when
		// the handler has taken the last, so at most one message waits
		// in this worker beyond those running (kept alive by the
		// handler), and none sits in the client's buffer unseen, its
		// AckWait running.
		all = append(all, jetstream.PullMaxMessages(1))
	}
	cc, err := cons.Consume(handler, append(all, opts...)...)
	if err != nil {
		return fmt.Errorf("natsjs: consuming from %s: %w", name, err)
	}

	// grace is the drain time, counted from when consuming stops.
	var grace context.Context
	select {
	case <-ctx.Done():
		// Messages already buffered go through the handler, which hands
		// them back at once.
		cc.Drain()
		var cancel context.CancelFunc
		grace, cancel = context.WithTimeout(context.Background(), w.cfg.DrainTimeout)
		defer cancel()
		select {
		case <-cc.Closed():
		case <-grace.Done():
			cc.Stop()
		}
	case <-cc.Closed():
		var cancel context.CancelFunc
		grace, cancel = context.WithTimeout(context.Background(), w.cfg.DrainTimeout)
		defer cancel()
	}
	mu.Lock()
	closed = true
	err = stopErr
	mu.Unlock()

	done := make(chan struct{})
	go func() {
		running.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-grace.Done():
		cancelWork()
		<-done
	}
	if ctx.Err() != nil {
		return nil
	}
	if err == nil && w.js.Conn().IsClosed() {
		err = jetstream.ErrConnectionClosed
	}
	if err == nil {
		err = errors.New("the subscription closed")
	}
	return fmt.Errorf("natsjs: %s stopped: %w", name, err)
}

// setsBuffer reports whether opts size the client's buffer themselves.
func setsBuffer(opts []jetstream.PullConsumeOpt) bool {
	for _, o := range opts {
		switch o.(type) {
		case jetstream.PullMaxMessages, jetstream.PullMaxBytes:
			return true
		}
	}
	return false
}

// report hands a settled message to OnSettle, or logs it: the job (its
// stream, sequence and Nats-Msg-Id), the settlement sent (DoubleAck,
// Nak, NakWithDelay, Term or TermWithReason), and once's action and
// reason for it.
func (w *Worker) report(msg jetstream.Msg, d once.Disposition, err error) {
	if w.cfg.OnSettle != nil {
		w.cfg.OnSettle(msg, d, err)
		return
	}
	level := slog.LevelDebug
	switch {
	case errors.Is(err, ErrNotSettled), errors.Is(err, ErrLastDelivery):
		level = slog.LevelWarn
	case err != nil || d.Action != once.JobAck:
		level = slog.LevelInfo
	}
	if !w.log.Enabled(context.Background(), level) {
		return
	}
	attrs := []any{}
	if meta, merr := msg.Metadata(); merr == nil {
		attrs = append(attrs, "job", jobOf(msg, meta), "delivered", meta.NumDelivered)
	}
	attrs = append(attrs, "subject", msg.Subject(), "settled", w.settlement(d), "action", d.Action.String(), "reason", d.Reason)
	if d.After > 0 {
		attrs = append(attrs, "after", d.After)
	}
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	w.log.Log(context.Background(), level, "natsjs: job settled", attrs...)
}
