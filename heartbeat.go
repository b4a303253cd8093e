package once

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// errNotRenewed is freshen's answer when the lease needed renewing
// before the effect could start, and the renewal failed.
var errNotRenewed = errors.New("too little of the claim's lease was left to start the effect on, and it could not be renewed")

// freshen renews the claim's lease before the effect starts when too
// little of it is left to run on: the claim's reply, a verifier before a
// takeover, or a hook held this process up. It returns when the lease
// now counts from. A claim found lost is a *FencedError; a renewal that
// fails (the database slow or out of reach) is errNotRenewed, and
// nothing runs.
func (c *Client) freshen(ctx context.Context, pol KindPolicy, a Action, sent time.Time) (time.Time, error) {
	if time.Until(sent.Add(pol.Lease-pol.margin())) >= pol.Lease/3 {
		return sent, nil
	}
	renewed := time.Now()
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pol.Lease/3)
	_, held, err := c.store.Heartbeat(hctx, a.Key, a.Attempt, pol.storedLease())
	cancel()
	switch {
	case err != nil:
		return sent, fmt.Errorf("%w: %w", errNotRenewed, err)
	case !held:
		return sent, &FencedError{Key: a.Key, Attempt: a.Attempt, Outcome: StatusInFlight}
	}
	return renewed, nil
}

// heartbeat keeps an attempt's claim while its effect runs: it extends
// the lease every Lease/3. Each call has a deadline of its own, so a
// connection that hangs instead of failing cannot hold it up.
// Independently of the calls, a timer of its own cancels the effect at
// Lease−margin after the last heartbeat that got through was sent (the
// claim's, to begin with): by then recovery may be about to take over, so
// the effect must stop. A claim found lost (a newer attempt took over)
// cancels it at once. The cause is a *FencedError.
//
// Most effects return well within Lease/3, before any heartbeat is due,
// so nothing runs for them but one timer: when it fires (the effect
// outlived the first interval) it arms the effect's stop timer, with the
// deadline counted from sent as always, and starts the loop, whose first
// heartbeat is due then. Until then the stop timer has nothing to do: it
// is due at Lease−margin after sent, later than the first heartbeat, and
// the first timer fires no later than it would.
type heartbeat struct {
	c *Client
	// ctx is the effect's context without its cancellation: the
	// heartbeat outlives the effect's deadline and the caller's context,
	// since an effect that ignores its context may still be running, and
	// its claim must hold until it returns.
	ctx     context.Context
	cancel  context.CancelCauseFunc
	key     Key
	attempt int
	pol     KindPolicy
	sent    time.Time
	// h is the attempt's claim, whose Deadline each heartbeat moves.
	h *held

	mu      sync.Mutex
	stopped bool
	// first starts the loop; expire (nil until then) stops the effect.
	first, expire *time.Timer
	stopLoop      context.CancelFunc
	loop          sync.WaitGroup
}

// startHeartbeat starts keeping a's claim, whose lease counts from sent,
// for an effect that cancel stops. Call stop when the effect returns.
func (c *Client) startHeartbeat(ctx context.Context, cancel context.CancelCauseFunc, h *held, sent time.Time) *heartbeat {
	hb := &heartbeat{c: c, ctx: ctx, cancel: cancel, key: h.a.Key, attempt: h.a.Attempt, pol: h.pol, sent: sent, h: h}
	pol := h.pol
	hb.first = time.AfterFunc(min(pol.Lease/3, hb.stopIn(sent)), hb.begin)
	return hb
}

// stopIn is how long from now the effect may run on a lease renewed by a
// call sent at from.
func (hb *heartbeat) stopIn(from time.Time) time.Duration {
	return time.Until(from.Add(hb.pol.Lease - hb.pol.margin()))
}

// begin runs when the effect outlives the first interval: it arms the
// stop timer and starts the loop.
func (hb *heartbeat) begin() {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	if hb.stopped {
		return
	}
	hb.expire = time.AfterFunc(hb.stopIn(hb.sent), hb.expired)
	ctx, stop := context.WithCancel(context.WithoutCancel(hb.ctx))
	hb.stopLoop = stop
	hb.loop.Go(func() { hb.run(ctx) })
}

// expired stops the effect: no heartbeat got through for a lease.
func (hb *heartbeat) expired() {
	hb.c.log.Warn("once: no heartbeat got through for a lease; stopping the effect", "key", hb.key, "attempt", hb.attempt)
	hb.cancel(&FencedError{Key: hb.key, Attempt: hb.attempt, Outcome: StatusInFlight})
}

// run sends a heartbeat at once (begin ran when the first was due), and
// every Lease/3 after, until ctx ends or the claim is found lost.
func (hb *heartbeat) run(ctx context.Context) {
	every := hb.pol.Lease / 3
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		sentAt := time.Now()
		callCtx, cancelCall := context.WithTimeout(ctx, every)
		_, held, err := hb.c.store.Heartbeat(callCtx, hb.key, hb.attempt, hb.pol.storedLease())
		cancelCall()
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return
			}
			hb.c.log.Warn("once: heartbeat failed; the lease may expire", "key", hb.key, "attempt", hb.attempt, "err", err)
		case held:
			hb.expire.Reset(hb.stopIn(sentAt))
			hb.h.renewedAt(sentAt)
		default:
			hb.c.log.Warn("once: claim lost while the effect ran", "key", hb.key, "attempt", hb.attempt)
			hb.cancel(&FencedError{Key: hb.key, Attempt: hb.attempt, Outcome: StatusInFlight})
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// stop stops the heartbeat: the loop, which it waits for, then the stop
// timer, which the loop's last heartbeat may have reset.
func (hb *heartbeat) stop() {
	hb.mu.Lock()
	hb.stopped = true
	hb.first.Stop()
	expire, stopLoop := hb.expire, hb.stopLoop
	hb.mu.Unlock()
	if expire != nil {
		stopLoop()
		hb.loop.Wait()
		expire.Stop()
	}
}
