package protocol

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/oncehq/once/internal/connlimit"
)

// Guessing tokens is slowed: an address that sent maxFailures wrong or
// missing tokens within failureWindow has its further wrong or missing
// tokens answered 429 until the window ends. A request with a right
// token is always served, from that address too, and so is a
// connection that showed a right token before (it is answered 401): a
// guesser beside a worker cannot fence it. Since a right token is
// served, a 429 tells a guesser its token was wrong; what slows it is
// that the address's 429s are answered one at a time, each after
// tarpitFor, so it guesses at most once a tarpitFor from an address.
const (
	maxFailures   = 20
	failureWindow = time.Minute
	// maxFailing bounds the addresses remembered. Full, the table
	// keeps what it counts (a flood from many addresses must not wipe
	// a guesser's count), drops the entries whose window ended, at most
	// once a sweepEvery, and counts the addresses it has no room for
	// together, as one (TestFloodOfAddressesDoesNotFreeAGuesser).
	maxFailing = 10000
	sweepEvery = time.Second
	// overflow is the entry of the addresses a full table has no room
	// for; no address is written so.
	overflow  = "overflow"
	tarpitFor = time.Second
)

// failures counts the failed authentications of each address.
type failures struct {
	mu    sync.Mutex
	by    map[string]*failing
	swept time.Time
}

type failing struct {
	n     int
	since time.Time
	// gate is held by the one blocked request of the address being
	// answered, for tarpitFor.
	gate chan struct{}
}

// host is the address a request counts against: its IP, or for IPv6
// its /64, as the connection limit counts it. A host is given a /64 at
// least, 2^64 addresses: counted by whole address, it could send
// maxFailures guesses from each (TestWrongTokensAreCountedByIPv6Prefix).
func host(r *http.Request) string {
	return connlimit.AddrKey(r.RemoteAddr)
}

// slot is the entry addr counts in: its own, or, when the table is full
// and has none for it, the overflow entry. f.mu is held.
func (f *failures) slot(addr string, now time.Time) string {
	if f.by == nil {
		f.by = map[string]*failing{}
	}
	if _, ok := f.by[addr]; ok {
		return addr
	}
	full := func() bool {
		n := len(f.by)
		if _, ok := f.by[overflow]; ok {
			n--
		}
		return n >= maxFailing
	}
	if full() && now.Sub(f.swept) >= sweepEvery {
		f.swept = now
		for k, x := range f.by {
			if now.Sub(x.since) > failureWindow {
				delete(f.by, k)
			}
		}
	}
	if full() {
		return overflow
	}
	return addr
}

// blocked reports how long an address must wait, if it must.
func (f *failures) blocked(addr string, now time.Time) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	addr = f.slot(addr, now)
	x := f.by[addr]
	if x == nil || x.n < maxFailures {
		return 0
	}
	if left := x.since.Add(failureWindow).Sub(now); left > 0 {
		return left
	}
	delete(f.by, addr)
	return 0
}

// tarpit holds a blocked request of addr for tarpitFor, one at a
// time per address, or until ctx ends.
func (f *failures) tarpit(ctx context.Context, addr string) {
	f.mu.Lock()
	x := f.by[f.slot(addr, time.Now())]
	if x == nil {
		f.mu.Unlock()
		return
	}
	if x.gate == nil {
		x.gate = make(chan struct{}, 1)
	}
	gate := x.gate
	f.mu.Unlock()
	select {
	case gate <- struct{}{}:
	case <-ctx.Done():
		return
	}
	defer func() { <-gate }()
	t := time.NewTimer(tarpitFor)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// failed counts a failed authentication from addr.
func (f *failures) failed(addr string, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	addr = f.slot(addr, now)
	x := f.by[addr]
	if x == nil || now.Sub(x.since) > failureWindow {
		x = &failing{since: now}
		f.by[addr] = x
	}
	x.n++
}
