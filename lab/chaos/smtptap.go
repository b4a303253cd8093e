package chaos

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// smtpTap stands between the workers and the SMTP server (the harness's
// own loopback mailbox, or --smtp's) and reads the conversation as it
// passes: it counts every message the server accepted (a 250 to the end
// of its data), per intent by its recipient, and carries out the plans
// on an email's first acceptance: it kills the worker before the 250
// reaches it, or holds the 250 back until the worker's timeout, so the
// server has the message and the worker cannot know. The count is the
// server's own answer, seen on the wire, whatever becomes of the worker.
//
// The worker is known by the name it greets with (EHLO w<pid>). The tap
// assumes the client does not pipeline commands, as smtpsend's client
// does not.
type smtpTap struct {
	ln       net.Listener
	upstream string
	t        *tally
	hold     time.Duration
	runTag   string

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// recipient is intent i's address: each intent has its own, so a
// mailbox (or an outside server's log) shows each email's copies.
func recipient(i int, runTag string) string {
	return fmt.Sprintf("intent-%d-%s@chaos.once.localhost", i, runTag)
}

var recipientRE = regexp.MustCompile(`(?i)<intent-(\d+)-([0-9a-z]+)@`)

// intentOf reads the intent out of a recipient of this run.
func intentOf(addr, runTag string) (int, bool) {
	m := recipientRE.FindStringSubmatch("<" + addr)
	if m == nil || !strings.EqualFold(m[2], runTag) {
		return 0, false
	}
	i, err := strconv.Atoi(m[1])
	return i, err == nil
}

func startSMTPTap(upstream string, t *tally, hold time.Duration, runTag string) (*smtpTap, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("chaos: listening for the SMTP tap: %w", err)
	}
	s := &smtpTap{ln: ln, upstream: upstream, t: t, hold: hold, runTag: runTag, conns: map[net.Conn]struct{}{}}
	s.wg.Go(s.accept)
	return s, nil
}

// Addr is where workers send their mail.
func (s *smtpTap) Addr() string { return s.ln.Addr().String() }

func (s *smtpTap) Close() error {
	err := s.ln.Close()
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

func (s *smtpTap) track(cs ...net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	for _, c := range cs {
		s.conns[c] = struct{}{}
	}
	return true
}

func (s *smtpTap) untrack(cs ...net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range cs {
		delete(s.conns, c)
		c.Close()
	}
}

func (s *smtpTap) accept() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.DialTimeout("tcp", s.upstream, 5*time.Second)
		if err != nil {
			// The worker sees the connection close before the greeting:
			// nothing was sent, and smtpsend says so.
			c.Close()
			continue
		}
		if !s.track(c, u) {
			c.Close()
			u.Close()
			return
		}
		x := &tapConn{tap: s, client: c, server: u, intent: -1}
		s.wg.Go(x.fromClient)
		s.wg.Go(x.fromServer)
	}
}

// tapConn is one SMTP connection through the tap.
type tapConn struct {
	tap            *smtpTap
	client, server net.Conn

	mu     sync.Mutex
	pid    int
	intent int
	// data is set while the client sends the message's data; final once
	// the end of data was sent and the server's reply to it is awaited.
	data, final bool
}

func (x *tapConn) end() { x.tap.untrack(x.client, x.server) }

// fromClient forwards what the worker sends. When the worker closes its
// side (or dies), the server is told by a half close and fromServer goes
// on reading its answers: a 250 already on its way is counted even
// though nobody will read it.
func (x *tapConn) fromClient() {
	defer func() {
		if tc, ok := x.server.(*net.TCPConn); ok {
			tc.CloseWrite()
		} else {
			x.server.Close()
		}
	}()
	r := bufio.NewReader(x.client)
	for {
		line, err := r.ReadString('\n')
		if line != "" {
			x.mu.Lock()
			if x.data {
				if line == ".\r\n" {
					x.data, x.final = false, true
				}
			} else {
				cmd := strings.ToUpper(line)
				switch {
				case strings.HasPrefix(cmd, "EHLO W"), strings.HasPrefix(cmd, "HELO W"):
					x.pid, _ = strconv.Atoi(strings.TrimSpace(line[6:]))
				case strings.HasPrefix(cmd, "RCPT TO:"):
					if m := recipientRE.FindStringSubmatch(line); m != nil && strings.EqualFold(m[2], x.tap.runTag) {
						x.intent, _ = strconv.Atoi(m[1])
					} else {
						x.intent = -1
					}
				case cmd == "DATA\r\n":
					x.data = true
				case strings.HasPrefix(cmd, "MAIL FROM:"), strings.HasPrefix(cmd, "RSET"):
					x.intent = -1
				}
			}
			x.mu.Unlock()
			if _, werr := x.server.Write([]byte(line)); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// fromServer forwards the server's replies and counts each 250 to the
// end of a message's data. It reads until the server closes, whether or
// not the worker still listens.
func (x *tapConn) fromServer() {
	defer x.end()
	r := bufio.NewReader(x.server)
	listening := true
	for {
		line, err := r.ReadString('\n')
		if line != "" {
			x.mu.Lock()
			final := x.final && len(line) >= 4 && line[3] != '-'
			pid, intent := x.pid, x.intent
			if final {
				x.final = false
			}
			x.mu.Unlock()
			if final && strings.HasPrefix(line, "250") && intent >= 0 && intent < len(x.tap.t.used) {
				// The server has the message: from here on it happened,
				// whatever the worker hears.
				switch p := x.tap.t.apply(kindEmail, intent); p {
				case planKill, planTimeout:
					x.withheld(p, pid)
					return
				}
			}
			if listening {
				if _, werr := x.client.Write([]byte(line)); werr != nil {
					listening = false
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// withheld carries out a plan on an accepted message: the 250 never
// reaches the worker. A held reply waits out the worker's timeout; the
// connection is closed after it.
func (x *tapConn) withheld(p plan, pid int) {
	x.tap.t.afterApply(context.Background(), p, pid, x.tap.hold)
}
