// Package faultproxy is a loopback TCP proxy that fails the way networks
// fail, for tests of what a client does when a database's reply is lost
// or its connection hangs instead of failing.
//
// It sits between a client and a server on 127.0.0.1 and, on command:
//   - black-holes every connection: bytes are read and dropped, nothing is
//     forwarded and nothing is reset, as in a half-open partition;
//   - cuts a connection right after the server has answered a marked
//     request: the server has done the work (committed, for a database in
//     autocommit) and the client never hears of it;
//   - refuses new connections (they are accepted and closed at once).
//
// Every fault is real: the client's driver sees a real socket that stops
// answering, or closes, at a real moment.
package faultproxy

import (
	"bytes"
	"net"
	"sync"
	"time"
)

// Proxy forwards connections from its own address to a target.
type Proxy struct {
	ln     net.Listener
	target string

	mu       sync.Mutex
	conns    map[*link]struct{}
	blackout bool
	refuse   bool
	cut      []byte // the marker of the request whose reply is lost
	cutEnd   []byte // what ends the server's reply to it
	cutDone  chan struct{}
	cutHang  bool // hang the connection instead of closing it
	closed   bool
	spare    func(first []byte) bool
	wg       sync.WaitGroup
}

// link is one proxied connection.
type link struct {
	client, server net.Conn
	// marked is set when the client sent the cut marker: the server's
	// next reply is dropped and both ends closed (or hung, with hang).
	// end, done and hang are the cut's own, taken when it was marked, so a
	// cut armed meanwhile does not take them over.
	marked bool
	end    []byte
	done   chan struct{}
	hang   bool
	// hung drops everything from then on, in both directions.
	hung bool
	// seen is set once the client's first bytes were read; spared, if
	// they were ones the proxy spares (see Spare).
	seen, spared bool
}

// Start listens on 127.0.0.1 at a free port and forwards to target.
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[*link]struct{}{}}
	p.wg.Go(p.accept)
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Port is the proxy's port.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// Blackout starts or ends a black hole over every connection, open and
// new: what either side sends is dropped, and neither side is told. The
// streams of connections open during a blackout have gaps; end it with
// Reset so clients reconnect.
func (p *Proxy) Blackout(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blackout = on
}

// Refuse makes new connections close as soon as they are accepted (on)
// or be forwarded again (off). Open connections are not touched.
func (p *Proxy) Refuse(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse = on
}

// PostgresReady ends every reply of PostgreSQL's protocol: ReadyForQuery,
// sent once the request's implicit transaction has committed.
var PostgresReady = []byte{'Z', 0, 0, 0, 5}

// CutAfter arms a cut: the next request from a client whose bytes
// contain marker is forwarded, the server's reply to it is dropped once
// it contains replyEnd (any reply at all if replyEnd is empty), and that
// connection is closed on both sides. The returned channel is closed
// when the cut has happened.
func (p *Proxy) CutAfter(marker, replyEnd []byte) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut, p.cutEnd = bytes.Clone(marker), bytes.Clone(replyEnd)
	p.cutDone = make(chan struct{})
	p.cutHang = false
	return p.cutDone
}

// HangAfter is CutAfter that leaves the connection open and silent
// instead of closing it: the client waits for a reply that never comes,
// until its own deadline.
func (p *Proxy) HangAfter(marker, replyEnd []byte) <-chan struct{} {
	done := p.CutAfter(marker, replyEnd)
	p.mu.Lock()
	p.cutHang = true
	p.mu.Unlock()
	return done
}

// PostgresCancel tells a PostgreSQL cancel request from the first bytes
// of a connection: a 16-byte message with code 80877102. A driver sends
// one on a connection of its own when it gives up on a statement.
func PostgresCancel(first []byte) bool {
	return len(first) >= 8 && bytes.Equal(first[:8], []byte{0, 0, 0, 16, 0x04, 0xd2, 0x16, 0x2e})
}

// Spare exempts from Reset and Close the connections whose first bytes
// from the client match: they end when their own ends close them. Set it
// before the first connection.
//
// It exists for PostgresCancel in front of PgBouncer 1.18 (Debian 12's),
// which exits when a cancel request's client leaves while PgBouncer is
// still forwarding it (PgBouncer issue 801, fixed in 1.20). A test of a
// store cut off from its pooler means the store's connections, not the
// one its driver opens on the side to cancel a statement. A connection
// cut before its first bytes were forwarded is cut as any other: the
// server has seen nothing of it.
func (p *Proxy) Spare(first func([]byte) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.spare = first
}

// Reset closes every open connection at once, as a restarted server or a
// firewall's reset would.
func (p *Proxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.conns {
		if !l.spared {
			l.client.Close()
			l.server.Close()
		}
	}
}

// spareWait bounds how long Close leaves a spared connection to end by
// itself: a cancel request is answered in milliseconds.
const spareWait = 5 * time.Second

// Close stops the proxy and closes every connection, a spared one once it
// ends or spareWait has passed.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	spared := 0
	for l := range p.conns {
		if l.spared {
			spared++
			continue
		}
		l.client.Close()
		l.server.Close()
	}
	p.mu.Unlock()
	err := p.ln.Close()
	if spared > 0 {
		stop := time.AfterFunc(spareWait, func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			for l := range p.conns {
				l.client.Close()
				l.server.Close()
			}
		})
		defer stop.Stop()
	}
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refuse, closed := p.refuse, p.closed
		p.mu.Unlock()
		if refuse || closed {
			c.Close()
			continue
		}
		s, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		l := &link{client: c, server: s}
		p.mu.Lock()
		p.conns[l] = struct{}{}
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(l, c, s, true) })
		p.wg.Go(func() { p.pipe(l, s, c, false) })
	}
}

// pipe copies from src to dst, applying the faults in force.
func (p *Proxy) pipe(l *link, src, dst net.Conn, fromClient bool) {
	defer func() {
		src.Close()
		dst.Close()
		p.mu.Lock()
		delete(p.conns, l)
		p.mu.Unlock()
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			p.mu.Lock()
			if fromClient && !l.seen {
				// Decided before the bytes go on, so that a Reset
				// after them spares the connection.
				l.seen = true
				l.spared = p.spare != nil && p.spare(chunk)
			}
			blackout := p.blackout
			var cutNow chan struct{}
			if fromClient && p.cut != nil && !l.marked && bytes.Contains(chunk, p.cut) {
				l.marked, l.end, l.done, l.hang = true, p.cutEnd, p.cutDone, p.cutHang
				p.cut = nil
			} else if !fromClient && l.marked && bytes.Contains(chunk, l.end) {
				l.marked = false
				cutNow = l.done
			}
			// While the server is still answering the marked request,
			// the client hears none of it.
			answering := !fromClient && l.marked
			hang := l.hang
			if cutNow != nil && hang {
				l.hung = true
			}
			hung := l.hung
			p.mu.Unlock()
			switch {
			case answering, hung && cutNow == nil:
			case cutNow != nil && hang:
				close(cutNow)
			case cutNow != nil:
				// The server answered the marked request: drop the
				// answer and cut both ends.
				l.client.Close()
				l.server.Close()
				close(cutNow)
				return
			case blackout:
				// Dropped: read and forgotten, like a packet into a
				// partition.
			default:
				if _, werr := dst.Write(chunk); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}
