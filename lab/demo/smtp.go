package demo

import (
	"fmt"
	"io"
	"log"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/emersion/go-smtp"
)

// mailServer is a real SMTP server on loopback that accepts everything
// and counts, per recipient, the messages it accepted.
type mailServer struct {
	srv    *smtp.Server
	ln     net.Listener
	mu     sync.Mutex
	counts map[string]int
}

func startMailServer() (*mailServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	m := &mailServer{ln: ln, counts: map[string]int{}}
	m.srv = smtp.NewServer(m)
	m.srv.Domain = "localhost"
	m.srv.AllowInsecureAuth = true
	m.srv.ErrorLog = log.New(io.Discard, "", 0)
	go m.srv.Serve(ln)
	return m, nil
}

func (m *mailServer) addr() string { return m.ln.Addr().String() }
func (m *mailServer) close()       { m.srv.Close() }

func (m *mailServer) count(rcpt string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.counts[strings.ToLower(rcpt)]
}

// NewSession implements smtp.Backend.
func (m *mailServer) NewSession(*smtp.Conn) (smtp.Session, error) { return &session{m: m}, nil }

type session struct {
	m    *mailServer
	rcpt []string
}

func (s *session) Reset()        { s.rcpt = nil }
func (s *session) Logout() error { return nil }
func (s *session) Mail(string, *smtp.MailOptions) error {
	return nil
}
func (s *session) Rcpt(to string, _ *smtp.RcptOptions) error {
	s.rcpt = append(s.rcpt, to)
	return nil
}

// Data counts a message as delivered once it has been read whole: from
// here on the server has it, whatever happens to the sender.
func (s *session) Data(r io.Reader) error {
	if _, err := io.Copy(io.Discard, r); err != nil {
		return err
	}
	s.m.mu.Lock()
	for _, to := range s.rcpt {
		s.m.counts[strings.ToLower(to)]++
	}
	s.m.mu.Unlock()
	return nil
}

// checkSMTP makes sure an SMTP server answers at addr before the demo
// starts: without one, the naive workers would retry their sends until
// the half timed out.
func checkSMTP(addr string) error {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("--smtp %q is not HOST:PORT (%v)", addr, err)
	}
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return fmt.Errorf("--smtp %s: nothing answers there (%v); start an SMTP server, or leave --smtp out to use the demo's own", addr, err)
	}
	c := smtp.NewClient(conn)
	c.CommandTimeout = 5 * time.Second
	defer c.Close()
	if err := c.Noop(); err != nil {
		return fmt.Errorf("--smtp %s: the server there does not speak SMTP as the demo needs (%v); the demo sends plain SMTP, without TLS or authentication", addr, err)
	}
	c.Quit()
	return nil
}
