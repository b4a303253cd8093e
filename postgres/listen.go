package postgres

import (
	"context"
	crand "crypto/rand"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncehq/once"
)

// listener is a store's one listening connection and the waiters it
// wakes, by key.
type listener struct {
	cfg *pgx.ConnConfig
	// tag starts the payload of every notification about this store's
	// actions: "schema.prefixaction:".
	tag string
	// notify sends a notification through the pool, the way the store's
	// statements send theirs: the self-check at every connect.
	notify func(ctx context.Context, payload string) error
	// Timings, unexported knobs for the tests.
	probeWait   time.Duration // how long the self-check waits for its notification
	idle        time.Duration // how long without a notification before the connection is pinged
	backoffMin  time.Duration // the first wait before connecting again
	backoffMax  time.Duration
	unavailable time.Duration // how long after a failed self-check to try again
	callWait    time.Duration // how long LISTEN may take

	// state is one of listen*.
	state atomic.Int32

	mu      sync.Mutex
	subs    map[once.Key]map[chan struct{}]struct{}
	started bool
	closed  bool
	cancel  context.CancelFunc
	done    chan struct{}
	pid     uint32
}

// The listener's states. Waiters mark their rows unless it is
// unavailable.
const (
	// listenConnecting: not yet listening, or listening while its
	// self-check is under way.
	listenConnecting int32 = iota
	// listenReady: listening, and its own notification came back.
	listenReady
	// listenUnavailable: its own notification did not come back; waiters
	// poll only until the next try.
	listenUnavailable
)

func newListener(cfg *pgx.ConnConfig, tag string, notify func(context.Context, string) error) *listener {
	return &listener{
		cfg:         cfg.Copy(),
		tag:         tag + ":",
		notify:      notify,
		probeWait:   time.Second,
		idle:        time.Minute,
		backoffMin:  100 * time.Millisecond,
		backoffMax:  30 * time.Second,
		unavailable: time.Minute,
		callWait:    10 * time.Second,
		subs:        make(map[once.Key]map[chan struct{}]struct{}),
	}
}

// subscribe returns a channel that receives when a notification about
// key arrives, or when the connection was (re)opened and notifications
// may have been missed; and a func to unsubscribe. The first subscriber
// opens the connection. After close the channel never receives.
func (l *listener) subscribe(key once.Key) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, func() {}
	}
	if !l.started {
		l.started = true
		ctx, cancel := context.WithCancel(context.Background())
		l.cancel, l.done = cancel, make(chan struct{})
		go l.run(ctx)
	}
	set := l.subs[key]
	if set == nil {
		set = make(map[chan struct{}]struct{})
		l.subs[key] = set
	}
	set[ch] = struct{}{}
	return ch, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		// While ch is in it, set is l.subs[key].
		delete(set, ch)
		if len(set) == 0 {
			delete(l.subs, key)
		}
	}
}

// usable reports whether notifications are worth asking for: not known
// to be lost.
func (l *listener) usable() bool { return l.state.Load() != listenUnavailable }

// close stops the listener and waits for its connection to close.
func (l *listener) close() {
	l.mu.Lock()
	l.closed = true
	started := l.started
	l.mu.Unlock()
	if started {
		l.cancel()
		<-l.done
	}
}

// dispatch wakes the waiters of the action a payload names.
func (l *listener) dispatch(payload string) {
	key, ok := strings.CutPrefix(payload, l.tag)
	if !ok {
		return // another store's table, or a self-check
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for ch := range l.subs[once.Key(key)] {
		wake(ch)
	}
}

// wakeAll wakes every waiter: notifications may have been missed while
// the connection was down. Each reads its row again.
func (l *listener) wakeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, set := range l.subs {
		for ch := range set {
			wake(ch)
		}
	}
}

func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default: // already woken
	}
}

// run keeps a listening connection open until ctx ends, reopening it
// with backoff.
func (l *listener) run(ctx context.Context) {
	defer close(l.done)
	backoff := l.backoffMin
	for {
		ready, lost := l.session(ctx)
		if ctx.Err() != nil {
			return
		}
		wait := backoff
		switch {
		case lost:
			l.state.Store(listenUnavailable)
			wait = l.unavailable
		case ready:
			// It was listening: open it again soon.
			l.state.Store(listenConnecting)
			backoff, wait = l.backoffMin, l.backoffMin
		default:
			if l.state.Load() != listenUnavailable {
				l.state.Store(listenConnecting)
			}
			backoff = min(backoff*2, l.backoffMax)
		}
		// Jitter, so the processes that lost the server together do not
		// all come back in the same instant.
		wait += rand.N(wait/4 + 1)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// session opens the connection, listens, checks that its own
// notification comes back, and dispatches notifications until the
// connection fails or ctx ends. It reports whether the check passed
// (ready), and lost when the connection worked but the notification did
// not come back.
func (l *listener) session(ctx context.Context) (ready, lost bool) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	conn, err := pgx.ConnectConfig(cctx, l.cfg.Copy())
	cancel()
	if err != nil {
		return false, false
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn.Close(cctx)
		cancel()
		l.mu.Lock()
		l.pid = 0
		l.mu.Unlock()
	}()
	l.mu.Lock()
	l.pid = conn.PgConn().PID()
	l.mu.Unlock()
	// Every exchange on the connection has a deadline: a connection
	// that hangs instead of failing (a half-open partition) would
	// otherwise hold the listener for good.
	lctx, cancel := context.WithTimeout(ctx, l.callWait)
	_, err = conn.Exec(lctx, `LISTEN `+notifyChannel)
	cancel()
	if err != nil {
		return false, false
	}
	// Listening now: whatever changed while it was not is read again.
	l.wakeAll()
	probe := "probe:" + crand.Text()
	// Sending waits for a connection of the pool, which may all be busy
	// for a while; only the notification's way back is timed by
	// probeWait.
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = l.notify(pctx, probe)
	cancel()
	if err != nil {
		return false, false
	}
	deadline := time.Now().Add(l.probeWait)
	for {
		next := deadline
		if ready {
			next = time.Now().Add(l.idle)
		}
		wctx, cancel := context.WithDeadline(ctx, next)
		n, err := conn.WaitForNotification(wctx)
		timedOut := wctx.Err() != nil
		cancel()
		switch {
		case ctx.Err() != nil:
			return ready, false
		case err != nil && (!timedOut || conn.IsClosed()):
			return ready, false // the connection dropped
		case err != nil && !ready:
			return false, true // the self-check did not come back
		case err != nil:
			// Quiet for a while: make sure the connection is alive, since
			// one a network dropped silently would never say so.
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := conn.Ping(pctx)
			cancel()
			if err != nil {
				return ready, false
			}
		case n.Payload == probe:
			ready = true
			l.state.Store(listenReady)
		default:
			l.dispatch(n.Payload)
		}
	}
}

// listenerPID is the backend of the listening connection, 0 when none
// is open: for tests that terminate it.
func (l *listener) listenerPID() uint32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pid
}
