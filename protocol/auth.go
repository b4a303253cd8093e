package protocol

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// Guessing tokens is slowed: an address that sent maxFailures wrong or
// missing tokens within failureWindow is answered 429 until the window
// ends, without its tokens being checked. A request with a right token
// from another address is not slowed; one from the same address waits
// out the window too, which a worker whose token is right never meets.
const (
	maxFailures   = 20
	failureWindow = time.Minute
	// maxFailing bounds the addresses remembered: past it the table is
	// begun again, so a flood from many addresses costs the guessers'
	// own slowing, not memory.
	maxFailing = 10000
)

// failures counts the failed authentications of each address.
type failures struct {
	mu sync.Mutex
	by map[string]*failing
}

type failing struct {
	n     int
	since time.Time
}

// host is the address a request came from, without its port.
func host(r *http.Request) string {
	h, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return h
}

// blocked reports how long an address must wait, if it must.
func (f *failures) blocked(addr string, now time.Time) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
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

// failed counts a failed authentication from addr.
func (f *failures) failed(addr string, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.by == nil || len(f.by) >= maxFailing {
		f.by = map[string]*failing{}
	}
	x := f.by[addr]
	if x == nil || now.Sub(x.since) > failureWindow {
		x = &failing{since: now}
		f.by[addr] = x
	}
	x.n++
}
