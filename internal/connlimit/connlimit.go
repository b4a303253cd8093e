// Package connlimit bounds what clients can hold of an HTTP server that
// asks for a credential, so that a flood of connections without one
// cannot keep out a request that has it.
//
// A connection counts as a guest until a handler calls Authorized for a
// request it carried. The listener bounds connections in four ways:
//
//   - at most Max are open at once; the next waits in the kernel's
//     backlog until one closes, so the process's file descriptors last
//     (with a reserve, the next is accepted, and waits for room: one
//     more);
//   - one client address may hold at most PerAddr guests; the next is
//     answered 503 and closed at once;
//   - guests may fill only Max-Reserved slots. A guest accepted into the
//     reserve is served one request: unless the handler calls Authorized
//     for it, the answer closes the connection;
//   - with a reserve, when every slot is taken the listener makes room
//     for the next connection by closing the guest that has waited
//     longest, over a second, for its first request to come in (it
//     sent nothing, or sends its headers slowly), so connections that
//     send nothing cannot hold the reserve against one that shows the
//     credential.
//
// A guest left idle after a request is closed after GuestIdle, not the
// server's IdleTimeout, so a /healthz on a keep-alive connection holds
// its slot for seconds, not minutes.
//
// The handler must run under an http.Server whose ConnState and
// ConnContext are the listener's (Listener.Serve sets them).
package connlimit

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
)

// Limits are a Listener's bounds. Zero in a field means no such bound.
type Limits struct {
	// Max is how many connections may be open at once.
	Max int
	// Reserved is how many of Max only an authorized connection keeps.
	Reserved int
	// PerAddr is how many guests one client address may hold. An IPv6
	// address counts by its /64, which one host can rotate through.
	PerAddr int
	// GuestIdle closes a guest that waits this long for its next request.
	GuestIdle time.Duration
}

// Listener is a net.Listener that keeps Limits.
type Listener struct {
	net.Listener
	lim   Limits
	slots chan struct{} // nil: no Max
	done  chan struct{}
	close sync.Once

	mu      sync.Mutex
	guests  int
	perAddr map[string]int
	open    map[*conn]struct{} // the guests, for evict
}

// Listen wraps ln so that it keeps lim.
func Listen(ln net.Listener, lim Limits) *Listener {
	l := &Listener{Listener: ln, lim: lim, done: make(chan struct{}), perAddr: map[string]int{}, open: map[*conn]struct{}{}}
	if lim.Max > 0 {
		l.slots = make(chan struct{}, lim.Max)
	}
	return l
}

// Serve sets srv's ConnState and ConnContext to the listener's, has
// srv's handler (which then sees every request, "OPTIONS *" too) close a
// guest from the reserve after one answer, and serves srv on it.
func (l *Listener) Serve(srv *http.Server) error {
	srv.ConnState = l.connState
	srv.ConnContext = connContext
	srv.Handler = closeReserve(srv.Handler)
	// "OPTIONS *" would be answered without the handler, and so keep a
	// guest in the reserve open.
	srv.DisableGeneralOptionsHandler = true
	return srv.Serve(l)
}

// Accept returns the next connection the limits admit. A guest over its
// address's cap is answered 503 and closed here, and never reaches the
// server.
func (l *Listener) Accept() (net.Conn, error) {
	// With a reserve, a connection is taken from the backlog first and
	// then given a slot, one a guest that sent nothing may have to
	// give up (makeRoom); so one more than Max may be open, waiting.
	evicts := l.slots != nil && l.lim.Reserved > 0
	for {
		if l.slots != nil && !evicts {
			select {
			case l.slots <- struct{}{}:
			case <-l.done:
				return nil, net.ErrClosed
			}
		}
		nc, err := l.Listener.Accept()
		if err != nil {
			if l.slots != nil && !evicts {
				l.release()
			}
			return nil, err
		}
		c := &conn{Conn: nc, l: l, addr: addrKey(nc.RemoteAddr()), state: http.StateNew, since: time.Now()}
		l.mu.Lock()
		over := l.lim.PerAddr > 0 && l.perAddr[c.addr] >= l.lim.PerAddr
		l.mu.Unlock()
		if over {
			refuse(nc, fmt.Sprintf("this address already holds %d connections that have not shown the token; "+
				"close some, or send the token (Authorization: Bearer TOKEN)", l.lim.PerAddr))
			if l.slots != nil && !evicts {
				l.release()
			}
			continue
		}
		if evicts && !l.makeRoom() {
			nc.Close()
			return nil, net.ErrClosed
		}
		// Only Accept adds guests, so the count checked above still
		// holds (it can only have fallen).
		l.mu.Lock()
		c.reserve = l.lim.Reserved > 0 && l.guests >= l.lim.Max-l.lim.Reserved
		l.guests++
		l.perAddr[c.addr]++
		l.open[c] = struct{}{}
		l.mu.Unlock()
		return c, nil
	}
}

// newGrace is how long a new connection may wait for its first request
// before a newcomer may take its slot: more than a client takes to send
// one after connecting.
const newGrace = time.Second

// makeRoom takes a slot for a connection just accepted. When every slot
// is taken, the guest that has waited longest without a request in,
// past newGrace, gives up its own: connections that send nothing must
// not hold the reserve against one that brings the credential
// (TestServeSilentGuestsLeaveRoomForToken). It reports false if the
// listener closed.
func (l *Listener) makeRoom() bool {
	for {
		select {
		case l.slots <- struct{}{}:
			return true
		default:
		}
		l.evict(time.Now().Add(-newGrace))
		select {
		case l.slots <- struct{}{}:
			return true
		case <-l.done:
			return false
		case <-time.After(newGrace / 4):
		}
	}
}

// Close also ends an Accept waiting for a slot, so a server's Shutdown
// does not wait on a full listener.
func (l *Listener) Close() error {
	err := l.Listener.Close()
	l.close.Do(func() { close(l.done) })
	return err
}

// evict closes the guest that has waited longest for its first request
// to come in, if it came before before: http.Server marks a connection
// active only once it has read a request's headers, so until then it
// is new. An idle guest is left to GuestIdle; it holds no slot of the
// reserve, whose guests are closed after one answer.
func (l *Listener) evict(before time.Time) {
	var oldest *conn
	l.mu.Lock()
	for c := range l.open {
		if !c.closed && c.state == http.StateNew && c.since.Before(before) &&
			(oldest == nil || c.since.Before(oldest.since)) {
			oldest = c
		}
	}
	l.mu.Unlock()
	if oldest != nil {
		oldest.Close()
	}
}

func (l *Listener) release() {
	if l.slots != nil {
		<-l.slots
	}
}

// refuse answers a connection the listener will not serve, and closes
// it. The write goes to a fresh socket's empty buffer, so it does not
// wait on the client; the deadline is there in case it would.
func refuse(c net.Conn, why string) {
	body := "once console: " + why + "\n"
	c.SetWriteDeadline(time.Now().Add(time.Second))
	fmt.Fprintf(c, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"+
		"Connection: close\r\nRetry-After: 5\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	c.Close()
}

// addrKey is the client address a connection counts against: the IP,
// or for IPv6 its /64.
func addrKey(a net.Addr) string {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return ""
	}
	if ip4 := ta.IP.To4(); ip4 != nil {
		return ip4.String()
	}
	return ta.IP.Mask(net.CIDRMask(64, 128)).String() + "/64"
}

// AddrKey is the client address a request counts against, as the
// listener counts connections: the IP of remoteAddr (an
// http.Request's RemoteAddr), or for IPv6 its /64.
func AddrKey(remoteAddr string) string {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return host
	}
	return addrKey(&net.TCPAddr{IP: ip})
}

// conn is an admitted connection. Its fields other than Conn are
// guarded by l.mu.
type conn struct {
	net.Conn
	l          *Listener
	addr       string
	authorized bool
	reserve    bool
	closed     bool
	idle       *time.Timer
	state      http.ConnState // as the server last set it
	since      time.Time      // when it took state
}

// Close releases the connection's slot once, however often it is called.
func (c *conn) Close() error {
	err := c.Conn.Close()
	l := c.l
	l.mu.Lock()
	first := !c.closed
	if first {
		c.closed = true
		if c.idle != nil {
			c.idle.Stop()
		}
		if !c.authorized {
			l.forget(c)
		}
	}
	l.mu.Unlock()
	if first {
		l.release()
	}
	return err
}

// forget takes a guest out of the guest counts. l.mu must be held.
func (l *Listener) forget(c *conn) {
	l.guests--
	if l.perAddr[c.addr]--; l.perAddr[c.addr] <= 0 {
		delete(l.perAddr, c.addr)
	}
	delete(l.open, c)
}

// connState closes a guest that stays idle past GuestIdle. An active
// connection is never closed by the timer: going active stops it.
func (l *Listener) connState(nc net.Conn, st http.ConnState) {
	c, ok := nc.(*conn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.idle != nil {
		c.idle.Stop()
		c.idle = nil
	}
	c.state, c.since = st, time.Now()
	if st != http.StateIdle || c.authorized || c.closed || l.lim.GuestIdle <= 0 {
		return
	}
	var t *time.Timer
	t = time.AfterFunc(l.lim.GuestIdle, func() {
		l.mu.Lock()
		still := c.idle == t && !c.authorized
		l.mu.Unlock()
		if still {
			c.Close()
		}
	})
	c.idle = t
}

type ctxKey struct{}

func connContext(ctx context.Context, nc net.Conn) context.Context {
	if c, ok := nc.(*conn); ok {
		return context.WithValue(ctx, ctxKey{}, c)
	}
	return ctx
}

// Authorized marks the connection that carried r as no longer a guest:
// it leaves the guest counts and the reserve, and keeps the server's own
// idle timeout. Call it before writing the answer, which then no longer
// closes a connection from the reserve. Outside a Listener it does
// nothing.
func Authorized(w http.ResponseWriter, r *http.Request) {
	c, ok := r.Context().Value(ctxKey{}).(*conn)
	if !ok {
		return
	}
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	if c.authorized || c.closed {
		return
	}
	if c.reserve {
		w.Header().Del("Connection")
	}
	c.authorized, c.reserve = true, false
	c.l.forget(c)
}

// Shown reports whether the connection that carried r has been
// Authorized by an earlier request: it showed the credential before.
// Outside a Listener it reports false.
func Shown(r *http.Request) bool {
	c, ok := r.Context().Value(ctxKey{}).(*conn)
	if !ok {
		return false
	}
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	return c.authorized
}

// closeReserve makes every answer on a guest from the reserve close its
// connection, unless the handler calls Authorized first: the reserve is
// for requests that carry the credential, and a guest there gets one
// answer.
func closeReserve(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c, ok := r.Context().Value(ctxKey{}).(*conn); ok {
			c.l.mu.Lock()
			reserve := c.reserve
			c.l.mu.Unlock()
			if reserve {
				w.Header().Set("Connection", "close")
			}
		}
		h.ServeHTTP(w, r)
	})
}
