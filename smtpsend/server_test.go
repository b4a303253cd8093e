package smtpsend_test

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net"
	"net/mail"
	"strings"
	"sync"
	"testing"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
)

// mailServer is a real SMTP server (emersion/go-smtp's) on loopback that
// can be told to fail at each stage of a submission. It records every
// message it read to the end, whatever it then answered.
type mailServer struct {
	srv *smtp.Server
	ln  net.Listener

	mu       sync.Mutex
	fail     failure
	received []*mail.Message
	raw      [][]byte
	logins   []login
	// conns counts the connections accepted, mails the MAIL commands
	// the backend was given, rcpts the recipients it accepted.
	conns int
	mails int
	rcpts []string
	// wire is every byte the clients sent, as the server read it: the
	// commands and the message data, dot-stuffed, before any parsing.
	wire []byte
}

// failure says where the server fails, and with which reply.
type failure struct {
	mail, rcpt, data, final *smtp.SMTPError
	// drop closes the connection after the message was read whole,
	// before the final reply.
	drop bool
	// read, when set, is signalled once the message was read whole.
	read chan<- struct{}
	// hang, when set, holds the final reply until it is closed.
	hang <-chan struct{}
	// rcptLimit, when positive, answers every recipient after that many
	// in one transaction 452 4.5.3, as a server with a lower limit than
	// it advertises does.
	rcptLimit int
	// rcptLimitReply, when set, is the reply to the recipients after
	// rcptLimit instead of 452 4.5.3.
	rcptLimitReply *smtp.SMTPError
	// no8bit hides 8BITMIME from the EHLO reply.
	no8bit bool
}

func reply(code int, msg string) *smtp.SMTPError {
	return &smtp.SMTPError{Code: code, EnhancedCode: smtp.EnhancedCode{code / 100, 0, 0}, Message: msg}
}

func startServer(t *testing.T) *mailServer { return startServerTLS(t, nil) }

// startServerTLS starts a server that offers STARTTLS with config (none
// when nil).
func startServerTLS(t *testing.T, config *tls.Config) *mailServer {
	return startServerWith(t, config, nil)
}

// startServerWith starts a server that offers STARTTLS with config (none
// when nil), with edit applied to it before it serves (when not nil).
func startServerWith(t *testing.T, config *tls.Config, edit func(*smtp.Server)) *mailServer {
	t.Helper()
	m, stop, err := newServerWith(config, edit)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return m
}

// newServer starts a server on a free loopback port, offering STARTTLS
// with config when it is set; stop closes it and
// waits for it to finish serving.
func newServer(config *tls.Config) (m *mailServer, stop func(), err error) {
	return newServerWith(config, nil)
}

func newServerWith(config *tls.Config, edit func(*smtp.Server)) (m *mailServer, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	m = &mailServer{ln: ln}
	m.srv = smtp.NewServer(m)
	m.srv.Domain = "localhost"
	m.srv.TLSConfig = config
	m.srv.AllowInsecureAuth = true
	m.srv.ErrorLog = log.New(io.Discard, "", 0)
	if edit != nil {
		edit(m.srv)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.srv.Serve(dataRefuser{ln, m})
	}()
	stop = func() {
		m.srv.Close()
		// Serve may not have registered the listener with the server
		// yet, so Close alone can leave it waiting in Accept.
		ln.Close()
		<-done
	}
	return m, stop, nil
}

func (m *mailServer) addr() string { return m.ln.Addr().String() }

func (m *mailServer) setFailure(f failure) {
	m.mu.Lock()
	m.fail = f
	m.mu.Unlock()
}

func (m *mailServer) failure() failure {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.fail
}

// messages returns the messages read to the end so far.
func (m *mailServer) messages() []*mail.Message {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]*mail.Message(nil), m.received...)
}

// NewSession implements smtp.Backend.
func (m *mailServer) NewSession(c *smtp.Conn) (smtp.Session, error) {
	return &session{m: m, conn: c}, nil
}

type session struct {
	m    *mailServer
	conn *smtp.Conn
	n    int // recipients accepted in this transaction
}

// AuthMechanisms and Auth implement smtp.AuthSession: PLAIN, for the
// user "ada" with the password "secret". The server records each login
// and whether it came over TLS.
func (s *session) AuthMechanisms() []string { return []string{sasl.Plain} }

func (s *session) Auth(string) (sasl.Server, error) {
	return sasl.NewPlainServer(func(_, user, pass string) error {
		if user != "ada" || pass != "secret" {
			return &smtp.SMTPError{Code: 535, EnhancedCode: smtp.EnhancedCode{5, 7, 8}, Message: "authentication failed"}
		}
		_, secure := s.conn.TLSConnectionState()
		s.m.mu.Lock()
		s.m.logins = append(s.m.logins, login{user: user, tls: secure})
		s.m.mu.Unlock()
		return nil
	}), nil
}

type login struct {
	user string
	tls  bool
}

func (m *mailServer) loggedIn() []login {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]login(nil), m.logins...)
}

func (s *session) Reset()        { s.n = 0 }
func (s *session) Logout() error { return nil }

func (s *session) Mail(string, *smtp.MailOptions) error {
	s.m.mu.Lock()
	s.m.mails++
	s.m.mu.Unlock()
	if f := s.m.failure(); f.mail != nil {
		return f.mail
	}
	return nil
}

func (s *session) Rcpt(to string, _ *smtp.RcptOptions) error {
	f := s.m.failure()
	if f.rcpt != nil {
		return f.rcpt
	}
	if f.rcptLimit > 0 && s.n >= f.rcptLimit {
		if f.rcptLimitReply != nil {
			return f.rcptLimitReply
		}
		return &smtp.SMTPError{Code: 452, EnhancedCode: smtp.EnhancedCode{4, 5, 3}, Message: "too many recipients"}
	}
	s.n++
	s.m.mu.Lock()
	s.m.rcpts = append(s.m.rcpts, to)
	s.m.mu.Unlock()
	return nil
}

// counts returns the connections accepted and the MAIL commands taken.
func (m *mailServer) counts() (conns, mails int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.conns, m.mails
}

// rawMessages returns the messages read to the end so far, as sent.
func (m *mailServer) rawMessages() [][]byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([][]byte(nil), m.raw...)
}

// recipients returns the recipients the server accepted, in order.
func (m *mailServer) recipients() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.rcpts...)
}

// transcript returns every byte the clients sent so far.
func (m *mailServer) transcript() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]byte(nil), m.wire...)
}

func (s *session) Data(r io.Reader) error {
	raw, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	msg, err := mail.ReadMessage(bytes.NewReader(raw))
	if err != nil {
		return reply(554, "unparsable message: "+err.Error())
	}
	s.m.mu.Lock()
	s.m.received = append(s.m.received, msg)
	s.m.raw = append(s.m.raw, raw)
	f := s.m.fail
	s.m.mu.Unlock()
	if f.drop {
		// The message is here; the sender never learns it.
		s.conn.Conn().Close()
		return nil
	}
	if f.read != nil {
		select {
		case f.read <- struct{}{}:
		default:
		}
	}
	if f.hang != nil {
		<-f.hang
	}
	if f.final != nil {
		return f.final
	}
	return nil
}

// dataRefuser wraps the listener so the DATA command itself can be
// refused: go-smtp's server always answers it 354 and leaves the backend
// only the final reply.
type dataRefuser struct {
	net.Listener
	m *mailServer
}

func (l dataRefuser) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.m.mu.Lock()
	l.m.conns++
	l.m.mu.Unlock()
	return &refusingConn{Conn: c, m: l.m, r: bufio.NewReader(c)}, nil
}

// refusingConn hands the server the client's lines one at a time; when
// the server is set to fail the DATA command, it answers that line
// itself and the server never sees it. Line by line is how the server
// reads commands anyway, and the message data never comes: the client
// waits for a 354 that is not sent.
type refusingConn struct {
	net.Conn
	m       *mailServer
	r       *bufio.Reader
	pending []byte
}

func (c *refusingConn) Read(p []byte) (int, error) {
	n, err := c.read(p)
	c.m.mu.Lock()
	c.m.wire = append(c.m.wire, p[:n]...)
	c.m.mu.Unlock()
	return n, err
}

// Write hides 8BITMIME from the EHLO reply when the server is set to.
func (c *refusingConn) Write(p []byte) (int, error) {
	if c.m.failure().no8bit {
		if q := bytes.Replace(p, []byte("250-8BITMIME\r\n"), nil, 1); len(q) < len(p) {
			if _, err := c.Conn.Write(q); err != nil {
				return 0, err
			}
			return len(p), nil
		}
	}
	return c.Conn.Write(p)
}

func (c *refusingConn) read(p []byte) (int, error) {
	if len(c.pending) == 0 && c.m.failure().data == nil {
		// Pass bytes through as they come: after STARTTLS they are TLS
		// records, which need not hold a line break.
		return c.r.Read(p)
	}
	for len(c.pending) == 0 {
		line, err := c.r.ReadBytes('\n')
		if len(line) == 0 && err != nil {
			return 0, err
		}
		if f := c.m.failure(); f.data != nil && strings.EqualFold(strings.TrimSpace(string(line)), "DATA") {
			if _, err := io.WriteString(c.Conn, smtpReply(f.data)+"\r\n"); err != nil {
				return 0, err
			}
			continue
		}
		c.pending = line
	}
	n := copy(p, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}

func smtpReply(e *smtp.SMTPError) string {
	c := e.EnhancedCode
	return fmt.Sprintf("%d %d.%d.%d %s", e.Code, c[0], c[1], c[2], e.Message)
}
