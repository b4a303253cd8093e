// Package mailbox is a real SMTP server (emersion/go-smtp's) on loopback
// that keeps every message it accepted, for tests and sandboxes that must
// show an email was delivered exactly once.
//
// Messages are looked up by Message-ID, the way a person or a verifier
// searches a mailbox for a message whose outcome is unknown
// (smtpsend.MessageID derives it from the action's key), and counted per
// Message-ID, so a second copy of one message is seen as a second copy,
// not as another message. BeforeReply runs after a message was read whole
// and before the server answers the final dot: a test blocks in it to
// stop the sender in the one window smtpsend cannot classify.
//
// It is part of the lab module (github.com/oncehq/once/lab): the project's
// harnesses and tools, not a stable API; it may change in any release.
package mailbox

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/mail"
	"strings"
	"sync"
	"time"

	"github.com/emersion/go-smtp"
)

// Config configures a Server. The zero value listens on a free loopback
// port and accepts every message.
type Config struct {
	// Addr is the host:port to listen on. Empty means 127.0.0.1:0, a free
	// loopback port (Server.Addr says which).
	Addr string
	// BeforeReply, if set, is called with each message once it has been
	// read whole and kept, before the server replies to its final dot.
	// The reply waits for it to return: block in it to hold the sender in
	// the window where the message has arrived but the sender cannot know.
	// It runs on the connection's goroutine; return to let the reply go.
	BeforeReply func(Message)
}

// Message is one message the server accepted.
type Message struct {
	// From and To are the envelope's sender and recipients.
	From string
	To   []string
	// MessageID is the Message-ID header, angle brackets included, as
	// smtpsend.MessageID writes it. Empty when the message has none.
	MessageID string
	// Subject is the Subject header as it was sent (encoded words are not
	// decoded).
	Subject string
	// Header holds every header field.
	Header mail.Header
	// Body is the message body, as received (CRLF line endings).
	Body []byte
	// At is when the server finished reading it.
	At time.Time
}

// Server is an SMTP server on loopback that keeps the messages it
// accepted. It is safe for concurrent use.
type Server struct {
	cfg  Config
	srv  *smtp.Server
	ln   net.Listener
	done chan struct{}
	open sync.WaitGroup // connections not yet closed

	mu       sync.Mutex
	messages []Message
	changed  chan struct{} // closed and replaced whenever a message is kept
}

// Start listens on cfg.Addr and serves until Close.
func Start(cfg Config) (*Server, error) {
	addr := cfg.Addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("mailbox: listen on %s: %w; pick a free port or leave Config.Addr empty", addr, err)
	}
	s := &Server{cfg: cfg, ln: ln, done: make(chan struct{}), changed: make(chan struct{})}
	s.srv = smtp.NewServer(backend{s})
	s.srv.Domain = "localhost"
	s.srv.AllowInsecureAuth = true
	s.srv.ErrorLog = log.New(io.Discard, "", 0)
	go func() {
		defer close(s.done)
		s.srv.Serve(tracked{ln, s})
	}()
	return s, nil
}

// Addr is the host:port the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops the server, closes its connections and waits until each is
// closed. A BeforeReply that still blocks keeps its connection's
// goroutine until it returns: release it before Close.
func (s *Server) Close() error {
	err := s.srv.Close()
	// Serve may not have registered the listener yet, so Close alone can
	// leave it waiting in Accept.
	s.ln.Close()
	<-s.done
	s.open.Wait()
	if errors.Is(err, smtp.ErrServerClosed) || errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// Messages returns every message accepted so far, in order.
func (s *Server) Messages() []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Message(nil), s.messages...)
}

// Count returns how many messages with this Message-ID were accepted:
// more than one is a duplicate delivery.
func (s *Server) Count(messageID string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, m := range s.messages {
		if m.MessageID == messageID {
			n++
		}
	}
	return n
}

// Find returns the first message with this Message-ID: the search a
// person (or a verifier) makes to learn whether a message whose sender
// never got the final reply arrived.
func (s *Server) Find(messageID string) (Message, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range s.messages {
		if m.MessageID == messageID {
			return m, true
		}
	}
	return Message{}, false
}

// Wait blocks until at least n messages were accepted, or until the
// timeout, and reports whether they were. Tests wait on it instead of
// sleeping.
func (s *Server) Wait(n int, timeout time.Duration) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		got, changed := len(s.messages), s.changed
		s.mu.Unlock()
		if got >= n {
			return true
		}
		select {
		case <-changed:
		case <-deadline.C:
			return false
		}
	}
}

func (s *Server) keep(m Message) {
	s.mu.Lock()
	s.messages = append(s.messages, m)
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

// tracked counts the connections it hands out, so Close can wait for
// each to be closed.
type tracked struct {
	net.Listener
	s *Server
}

func (l tracked) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.s.open.Add(1)
	return &trackedConn{Conn: c, wg: &l.s.open}, nil
}

type trackedConn struct {
	net.Conn
	wg   *sync.WaitGroup
	once sync.Once
}

func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.wg.Done)
	return err
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

// Data keeps the message once it has been read whole: from here on the
// server has it, whatever happens to the sender.
func (x *session) Data(r io.Reader) error {
	raw, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	parsed, err := mail.ReadMessage(bytes.NewReader(raw))
	if err != nil {
		return &smtp.SMTPError{Code: 554, EnhancedCode: smtp.EnhancedCode{5, 6, 0}, Message: "unparsable message: " + err.Error()}
	}
	body, err := io.ReadAll(parsed.Body)
	if err != nil {
		return err
	}
	m := Message{
		From:      x.from,
		To:        append([]string(nil), x.to...),
		MessageID: strings.TrimSpace(parsed.Header.Get("Message-ID")),
		Subject:   parsed.Header.Get("Subject"),
		Header:    parsed.Header,
		Body:      body,
		At:        time.Now(),
	}
	x.s.keep(m)
	if x.s.cfg.BeforeReply != nil {
		x.s.cfg.BeforeReply(m)
	}
	return nil
}
