// Package smtptest runs a real SMTP server (emersion/go-smtp's) on
// loopback for tests, and keeps every message it accepted, so a test
// counts what arrived instead of trusting a stub.
package smtptest

import (
	"bytes"
	"io"
	"log"
	"net"
	"net/mail"
	"sync"
	"testing"

	"github.com/emersion/go-smtp"
)

// Message is one message the server accepted.
type Message struct {
	// From and To are the envelope sender and recipients.
	From string
	To   []string
	// Header and Body are the parsed message.
	Header mail.Header
	Body   []byte
}

// Server is an SMTP server on a free loopback port that accepts every
// message. It is safe for concurrent use.
type Server struct {
	srv  *smtp.Server
	ln   net.Listener
	done chan struct{}

	mu       sync.Mutex
	messages []Message
}

// Start starts a server for the test, closed when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// New starts a server; Close stops it.
func New() (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{ln: ln, done: make(chan struct{})}
	s.srv = smtp.NewServer(backend{s})
	s.srv.Domain = "localhost"
	s.srv.AllowInsecureAuth = true
	s.srv.ErrorLog = log.New(io.Discard, "", 0)
	go func() {
		defer close(s.done)
		s.srv.Serve(ln)
	}()
	return s, nil
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops the server and waits for it to stop serving.
func (s *Server) Close() {
	s.srv.Close()
	// Serve may not have registered the listener with the server yet, so
	// Close alone can leave it waiting in Accept.
	s.ln.Close()
	<-s.done
}

// Messages returns the messages accepted so far, in order.
func (s *Server) Messages() []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Message(nil), s.messages...)
}

type backend struct{ s *Server }

// NewSession implements smtp.Backend.
func (b backend) NewSession(*smtp.Conn) (smtp.Session, error) { return &session{s: b.s}, nil }

type session struct {
	s    *Server
	from string
	to   []string
}

func (x *session) Reset()        { x.from, x.to = "", nil }
func (x *session) Logout() error { return nil }

func (x *session) Mail(from string, _ *smtp.MailOptions) error {
	x.from = from
	return nil
}

func (x *session) Rcpt(to string, _ *smtp.RcptOptions) error {
	x.to = append(x.to, to)
	return nil
}

// Data accepts a message once it was read whole and parses.
func (x *session) Data(r io.Reader) error {
	raw, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	m, err := mail.ReadMessage(bytes.NewReader(raw))
	if err != nil {
		return &smtp.SMTPError{Code: 554, EnhancedCode: smtp.EnhancedCode{5, 6, 0}, Message: "unparsable message: " + err.Error()}
	}
	body, err := io.ReadAll(m.Body)
	if err != nil {
		return err
	}
	x.s.mu.Lock()
	x.s.messages = append(x.s.messages, Message{From: x.from, To: append([]string(nil), x.to...), Header: m.Header, Body: body})
	x.s.mu.Unlock()
	return nil
}
