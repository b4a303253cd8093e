// Package smtpsend sends one email as a once effect, over SMTP, and tells
// once what became of it.
//
// Email has no idempotency key a server honours, so the only safe retry
// is one made when the server has said it did not take the message.
// Sender.Send classifies every failure by the stage it happened at, so
// once.Do releases the claim only when the message certainly was not
// accepted, stores a permanent failure when the server refused it for
// good, and hands everything else to the kind's recovery (by default a
// person reviews it) instead of sending a second copy:
//
//	stage                                         error             once does
//	--------------------------------------------  ----------------  -------------------------
//	bad Message or Sender (before dialling)       once.Permanent    stores the failure
//	dial, greeting, EHLO, STARTTLS, AUTH (*)      once.RetryLater   releases the claim
//	MAIL FROM / RCPT TO: 5xx                      once.Permanent    stores the failure
//	MAIL FROM / RCPT TO: 4xx or connection lost   once.RetryLater   releases the claim
//	DATA command: 5xx                             once.Permanent    stores the failure
//	DATA command: 4xx or connection lost          once.RetryLater   releases the claim
//	writing the message, before its final dot     once.RetryLater   releases the claim
//	final reply: 250                              nil               stores the reply text
//	final reply: 5xx                              once.Permanent    stores the failure
//	final reply: 4xx                              once.RetryLater   releases the claim
//	final dot or reply lost (connection dropped,  plain error       outcome unknown: recovery
//	  timed out, context cancelled)
//	QUIT after a 250 final reply fails            ignored           the message was accepted
//
// (*) Nothing was sent, whatever the reason, so the job may come back. A
// refused login or a server without STARTTLS (when Sender.TLS is set)
// keeps refusing until the configuration is fixed; the error says which.
//
// A message whose end-of-data marker reached the server may have been
// queued even if no reply came back; only the final reply says. That one
// window is why the Message-ID is derived from the action's key: it is the
// same on every attempt, so a person reviewing the action (or a verifier)
// can search the mailbox or the server's log for it, and a receiver that
// drops duplicate Message-IDs absorbs a second copy.
package smtpsend

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"mime"
	"net"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
	"github.com/oncehq/once"
)

// DefaultMessageIDDomain is the right-hand side of the Message-ID when
// Sender.MessageIDDomain is empty.
const DefaultMessageIDDomain = "once"

// Sender sends messages through one SMTP server (a submission server or
// a relay). The zero value is not usable: Addr is required. A Sender
// holds no connection between calls and is safe for concurrent use.
type Sender struct {
	// Addr is the server's host:port. Required.
	Addr string
	// Auth authenticates after the greeting (and after STARTTLS, when TLS
	// is set). Optional.
	Auth sasl.Client
	// TLS, when set, makes STARTTLS required: a server that does not offer
	// it is refused rather than sent the message (and credentials) in
	// clear. Nil sends without TLS.
	TLS *tls.Config
	// Timeout bounds the dial and each command's reply, the final reply
	// after the message data included. Zero keeps the SMTP client's
	// defaults (RFC 5321's: minutes, since a server may scan a message
	// before it answers); the context given to Send bounds the whole
	// exchange either way.
	Timeout time.Duration
	// Hello is the name sent with EHLO. Empty sends "localhost". It cannot
	// be combined with TLS, where the SMTP client introduces itself as
	// "localhost".
	Hello string
	// MessageIDDomain is the right-hand side of every Message-ID, so
	// messages from different systems sharing a key space stay apart.
	// Empty means DefaultMessageIDDomain.
	MessageIDDomain string
}

// Message is one plain-text email.
type Message struct {
	// From is the envelope sender and the From header: a bare address
	// ("ada@example.com"). Required.
	From string
	// To are the envelope recipients and the To header. At least one.
	To []string
	// Subject may hold any UTF-8; it is encoded for the header as needed.
	Subject string
	// Body is the text/plain body, UTF-8. Line endings are sent as CRLF.
	Body []byte
	// Header holds extra header fields (List-Unsubscribe, Reply-To…).
	// Fields Send writes itself (Date, From, To, Subject, Message-ID,
	// MIME-Version, Content-Type, Content-Transfer-Encoding) are refused.
	Header map[string]string
}

// MessageID is the Message-ID Send writes for the action key under domain
// (DefaultMessageIDDomain when empty), angle brackets included: search a
// mailbox or a server log for it to learn whether a message whose outcome
// is unknown arrived.
func MessageID(key once.Key, domain string) string {
	if domain == "" {
		domain = DefaultMessageIDDomain
	}
	return "<" + string(key) + "@" + domain + ">"
}

// Send sends msg once for the attempt a and returns the server's final
// reply ("250 2.0.0 queued as 4F2A"), the value once.Do stores. Call it
// from the effect function once.Do runs, and return its error unchanged:
// it is already classified (see the package documentation).
func (s *Sender) Send(ctx context.Context, a once.Attempt, msg Message) (string, error) {
	raw, err := s.compose(a, msg)
	if err != nil {
		return "", once.Permanent(err)
	}

	d := net.Dialer{Timeout: s.Timeout}
	conn, err := d.DialContext(ctx, "tcp", s.Addr)
	if err != nil {
		return "", once.RetryLater(fmt.Errorf("smtpsend: connect to %s: %w; nothing was sent, the next delivery tries again", s.Addr, err))
	}
	// Closing the connection is the only way to interrupt a reply the
	// client is waiting for. What that means for the message depends on
	// the stage the interruption hits, as for any lost connection.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()

	c, err := s.open(conn)
	if err != nil {
		conn.Close()
		return "", once.RetryLater(fmt.Errorf("smtpsend: %s: %w; nothing was sent, the next delivery tries again", s.Addr, withCause(ctx, err)))
	}
	defer c.Close()

	if err := c.Mail(msg.From, nil); err != nil {
		return "", refused(ctx, "MAIL FROM:<"+msg.From+">", err)
	}
	for _, to := range msg.To {
		if err := c.Rcpt(to, nil); err != nil {
			return "", refused(ctx, "RCPT TO:<"+to+">", err)
		}
	}
	w, err := c.Data()
	if err != nil {
		return "", refused(ctx, "DATA", err)
	}
	// Until the end-of-data marker is written the server cannot accept
	// the message: a body that fails to go out half way did not happen.
	if _, err := w.Write(raw); err != nil {
		return "", once.RetryLater(fmt.Errorf("smtpsend: %s: writing the message: %w; the end of the message was not sent, so the server did not take it; the next delivery tries again", s.Addr, withCause(ctx, err)))
	}
	resp, err := w.CloseWithResponse()
	if err != nil {
		var se *smtp.SMTPError
		if errors.As(err, &se) && (se.Code/100 == 4 || se.Code/100 == 5) {
			return "", refused(ctx, "end of data", err)
		}
		return "", fmt.Errorf("smtpsend: %s: the message was sent but no final reply came back: %w; the server may have queued it: search the recipient's mailbox or the server's log for Message-ID %s before sending it again",
			s.Addr, withCause(ctx, err), MessageID(a.Key, s.MessageIDDomain))
	}
	// The server took the message; a failed QUIT changes nothing.
	_ = c.Quit()
	return "250 " + resp.StatusText, nil
}

// open greets the server, starts TLS and authenticates: everything before
// MAIL FROM, where a failure means nothing was sent.
func (s *Sender) open(conn net.Conn) (*smtp.Client, error) {
	var c *smtp.Client
	if s.TLS != nil {
		// The client greets and starts TLS before its timeouts can be
		// set; bound that exchange by Timeout all the same.
		if s.Timeout > 0 {
			t := time.AfterFunc(s.Timeout, func() { conn.Close() })
			defer t.Stop()
		}
		var err error
		if c, err = smtp.NewClientStartTLS(conn, s.TLS); err != nil {
			return nil, fmt.Errorf("STARTTLS: %w (Sender.TLS is set, so the message is sent only over TLS; clear it to send in clear)", err)
		}
	} else {
		c = smtp.NewClient(conn)
	}
	if s.Timeout > 0 {
		c.CommandTimeout = s.Timeout
		c.SubmissionTimeout = s.Timeout
	}
	if s.TLS == nil {
		name := s.Hello
		if name == "" {
			name = "localhost"
		}
		if err := c.Hello(name); err != nil {
			c.Close()
			return nil, fmt.Errorf("greeting: %w", err)
		}
	}
	if s.Auth != nil {
		if err := c.Auth(s.Auth); err != nil {
			c.Close()
			return nil, fmt.Errorf("AUTH: %w (check the credentials in Sender.Auth)", err)
		}
	}
	return c, nil
}

// refused classifies a failed MAIL, RCPT or DATA command, or a 4xx/5xx
// final reply: the server has not taken the message. A 5xx reply is its
// last word; a 4xx reply or a lost connection means try again later.
func refused(ctx context.Context, stage string, err error) error {
	var se *smtp.SMTPError
	if errors.As(err, &se) && se.Code/100 == 5 {
		return once.Permanent(fmt.Errorf("smtpsend: the server refused %s: %w; it will refuse it again: fix the message or the address, then send it under a new key", stage, err))
	}
	if se != nil {
		return once.RetryLater(fmt.Errorf("smtpsend: the server deferred %s: %w; it did not take the message, the next delivery tries again", stage, err))
	}
	return once.RetryLater(fmt.Errorf("smtpsend: %s: %w; the message was not sent, the next delivery tries again", stage, withCause(ctx, err)))
}

// withCause names the context's cause when it is why the connection was
// closed, so a cancellation does not read as a network fault.
func withCause(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); cause != nil {
		return fmt.Errorf("%w (%v)", err, cause)
	}
	return err
}

// reserved are the header fields compose writes itself.
var reserved = map[string]bool{
	"date": true, "from": true, "to": true, "subject": true, "message-id": true,
	"mime-version": true, "content-type": true, "content-transfer-encoding": true,
}

// compose checks the sender and the message, and renders it as RFC 5322
// text. Everything it refuses would be refused on every attempt, so it is
// checked before anything is dialled.
func (s *Sender) compose(a once.Attempt, msg Message) ([]byte, error) {
	switch {
	case s.Addr == "":
		return nil, errors.New("smtpsend: Sender.Addr is empty; set it to the SMTP server's host:port")
	case s.TLS != nil && s.Hello != "":
		return nil, errors.New("smtpsend: Sender.Hello cannot be combined with Sender.TLS (the SMTP client introduces itself as localhost when it starts TLS); clear Hello")
	case a.Key == "":
		return nil, errors.New("smtpsend: the attempt has no key; call Send from the effect function once.Do runs, with the Attempt it is given")
	case !isAtext(string(a.Key)):
		return nil, fmt.Errorf("smtpsend: the attempt's key %q cannot be part of a Message-ID; pass the Attempt once.Do gives the effect", a.Key)
	case s.MessageIDDomain != "" && !isAtext(s.MessageIDDomain):
		return nil, fmt.Errorf("smtpsend: Sender.MessageIDDomain %q is not a dot-atom; use a domain name such as mail.example.com", s.MessageIDDomain)
	case msg.From == "":
		return nil, errors.New("smtpsend: Message.From is empty; set the sender's address")
	case len(msg.To) == 0:
		return nil, errors.New("smtpsend: Message.To is empty; name at least one recipient")
	case !utf8.Valid(msg.Body):
		return nil, errors.New("smtpsend: Message.Body is not valid UTF-8; the message is sent as text/plain; charset=utf-8")
	}
	if err := checkAddr("Message.From", msg.From); err != nil {
		return nil, err
	}
	for i, to := range msg.To {
		if err := checkAddr(fmt.Sprintf("Message.To[%d]", i), to); err != nil {
			return nil, err
		}
	}
	if !utf8.ValidString(msg.Subject) || strings.ContainsAny(msg.Subject, "\r\n") {
		return nil, errors.New("smtpsend: Message.Subject holds a line break or invalid UTF-8; a subject is one line of text")
	}
	names := make([]string, 0, len(msg.Header))
	for name, value := range msg.Header {
		switch {
		case name == "" || strings.IndexFunc(name, func(r rune) bool { return r <= ' ' || r > '~' || r == ':' }) >= 0:
			return nil, fmt.Errorf("smtpsend: Message.Header name %q is not a header field name (printable ASCII, no spaces or colons)", name)
		case reserved[strings.ToLower(name)]:
			return nil, fmt.Errorf("smtpsend: Message.Header sets %s, which Send writes itself; set it through Message's fields or drop it", name)
		case strings.ContainsAny(value, "\r\n") || !isASCII(value):
			return nil, fmt.Errorf("smtpsend: Message.Header %s holds a line break or non-ASCII text; encode it (mime.QEncoding) as one line", name)
		}
		names = append(names, name)
	}
	sort.Strings(names)

	var b bytes.Buffer
	field := func(name, value string) { b.WriteString(name + ": " + value + "\r\n") }
	field("Date", time.Now().Format(time.RFC1123Z))
	field("From", msg.From)
	field("To", strings.Join(msg.To, ", "))
	field("Subject", mime.QEncoding.Encode("utf-8", msg.Subject))
	field("Message-ID", MessageID(a.Key, s.MessageIDDomain))
	for _, name := range names {
		field(name, msg.Header[name])
	}
	field("MIME-Version", "1.0")
	field("Content-Type", "text/plain; charset=utf-8")
	if !isASCII(string(msg.Body)) {
		field("Content-Transfer-Encoding", "8bit")
	}
	b.WriteString("\r\n")
	// The data writer turns a bare LF into CRLF and dot-stuffs lines.
	b.Write(msg.Body)
	return b.Bytes(), nil
}

// checkAddr refuses an address that would break the envelope command or
// the header it is written into.
func checkAddr(field, addr string) error {
	if addr == "" || strings.ContainsAny(addr, "\r\n<>,\" ") || !strings.Contains(addr, "@") {
		return fmt.Errorf("smtpsend: %s %q is not a bare address; write it as local@domain, without a display name or angle brackets", field, addr)
	}
	if !isASCII(addr) {
		// It would need SMTPUTF8, which a server may not offer: that
		// refusal would come back on every attempt.
		return fmt.Errorf("smtpsend: %s %q is not ASCII; internationalised addresses are not supported, write the domain in its xn-- form", field, addr)
	}
	return nil
}

// isAtext reports whether s can stand on either side of a Message-ID's @
// as a dot-atom (RFC 5322 3.2.3), restricted to letters, digits, - . _.
func isAtext(s string) bool {
	if s == "" || s[0] == '.' || s[len(s)-1] == '.' || strings.Contains(s, "..") {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' || r == '_') {
			return false
		}
	}
	return true
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}
