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
//	over the server's SIZE or LIMITS RCPTMAX      once.Permanent    stores the failure
//	  (after EHLO, before MAIL FROM)
//	MAIL FROM / RCPT TO: 5xx                      once.Permanent    stores the failure
//	RCPT TO: 452 after other recipients were      once.Permanent    stores the failure
//	  taken (too many recipients, RFC 5321:
//	  4.5.3, or no enhanced code)
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
// A server is held to bounds too: Sender.Timeout (or the context) ends a
// reply that never comes, and over 1 MiB of replies on one connection
// ends it, as a lost connection would at that stage.
//
// Recipients, subjects and bodies often come from untrusted text (a form,
// a language model), so Message says what Send refuses and what it
// encodes: no address that is not one bare mailbox, no control
// characters, no CR or LF alone on the wire, no line over 998 bytes, no
// 8-bit byte (such a body goes as quoted-printable), and at most
// Sender.MaxRecipients recipients (100 by default).
//
// A message whose end-of-data marker reached the server may have been
// queued even if no reply came back; only the final reply says. That one
// window is why the Message-ID is derived from the action's key: it is the
// same on every attempt, so a person reviewing the action (or a verifier)
// can search the mailbox or the server's log for it, and a receiver that
// drops duplicate Message-IDs absorbs a second copy. Send notes it
// (once.Attempt.Note) before it dials, so that even when the worker dies
// mid-send the review item names it: "its lease expired; it had noted:
// smtpsend: sending Message-ID <…@once> through …".
package smtpsend

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

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
	// MaxRecipients caps a message's envelope recipients (To, Cc and Bcc,
	// each address once). Zero means DefaultMaxRecipients (100), which
	// RFC 5321 says every server must take; a server may refuse more for
	// good. A server that advertises a lower limit (LIMITS RCPTMAX) is
	// held to it.
	MaxRecipients int
}

// Message is one plain-text email. Its fields may come from untrusted
// text (a form, a language model): whatever would break the envelope or
// the message's framing is refused before anything is dialled, as
// once.Permanent, and long or 8-bit text is encoded as mail clients do.
//
// Every address is one bare mailbox, local@domain, as net/mail parses
// it: no display name, angle brackets, quotes, comments, groups, source
// routes, spaces or control characters, ASCII only, with a local part
// of at most 64 bytes, a domain of at most 255 and 254 bytes in all (a
// path of 256 in angle brackets).
type Message struct {
	// From is the envelope sender and the From header. Required.
	From string
	// To are envelope recipients, named in the To header. At least one.
	To []string
	// Cc are envelope recipients named in the Cc header.
	Cc []string
	// Bcc are envelope recipients no header names.
	Bcc []string
	// Subject is one line of UTF-8 without control characters (TAB is
	// allowed). It is folded, or encoded (RFC 2047) when it is not ASCII
	// or has a run too long to fold.
	Subject string
	// Body is the text/plain body, UTF-8. Every line break (CRLF, or a
	// CR or LF alone) is sent as CRLF; control characters other than TAB
	// are refused. A body with 8-bit text or a line over 998 bytes is
	// sent as quoted-printable, so every server can take it.
	Body []byte
	// Header holds extra header fields (List-Unsubscribe, Reply-To…):
	// printable ASCII (encode other text with mime.QEncoding; decoded,
	// it holds no control characters but TAB either), folded at
	// its whitespace into lines of at most 998 bytes. Fields Send writes
	// itself (Date, From, To, Cc, Subject, Message-ID, MIME-Version,
	// Content-Type, Content-Transfer-Encoding) and Bcc are refused: set
	// recipients through Message's fields.
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
	m, err := s.compose(a, msg)
	if err != nil {
		return "", once.Permanent(err)
	}
	// Should the worker die with the message sent and no reply read,
	// the review item gives this note: what to search the log for.
	note := fmt.Sprintf("smtpsend: sending Message-ID %s through %s; if its outcome is unknown, search the server's log or the recipient's mailbox for it",
		m.id, s.Addr)
	if err := a.Note(ctx, note); errors.Is(err, once.ErrFenced) {
		return "", once.RetryLater(fmt.Errorf("smtpsend: %w; nothing was sent", err))
	}

	d := net.Dialer{Timeout: s.Timeout}
	conn, err := d.DialContext(ctx, "tcp", s.Addr)
	if err != nil {
		return "", once.RetryLater(fmt.Errorf("smtpsend: connect to %s: %w; nothing was sent, the next delivery tries again", s.Addr, err))
	}
	conn = &boundedConn{Conn: conn, left: maxServerBytes}
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

	if err := s.fits(c, m); err != nil {
		return "", once.Permanent(err)
	}
	if err := c.Mail(msg.From, &smtp.MailOptions{Size: int64(len(m.raw))}); err != nil {
		return "", refused(ctx, "MAIL FROM:<"+msg.From+">", err)
	}
	for i, to := range m.rcpts {
		err := c.Rcpt(to, nil)
		var se *smtp.SMTPError
		if i > 0 && errors.As(err, &se) && tooManyRecipients(se) {
			// RFC 5321 4.5.3.1.10: too many recipients. The server will
			// defer the same one on every attempt: a retry would loop.
			return "", once.Permanent(fmt.Errorf("smtpsend: the server took %d recipients and deferred RCPT TO:<%s>: %w; it takes no more in one message, and would stop there on every attempt: send fewer recipients per message (set Sender.MaxRecipients to %d or less) under keys of their own", i, to, err, i))
		}
		if err != nil {
			return "", refused(ctx, "RCPT TO:<"+to+">", err)
		}
	}
	w, err := c.Data()
	if err != nil {
		return "", refused(ctx, "DATA", err)
	}
	// Until the end-of-data marker is written the server cannot accept
	// the message: a body that fails to go out half way did not happen.
	if _, err := w.Write(m.raw); err != nil {
		return "", once.RetryLater(fmt.Errorf("smtpsend: %s: writing the message: %w; the end of the message was not sent, so the server did not take it; the next delivery tries again", s.Addr, withCause(ctx, err)))
	}
	resp, err := w.CloseWithResponse()
	if err != nil {
		var se *smtp.SMTPError
		if errors.As(err, &se) && (se.Code/100 == 4 || se.Code/100 == 5) {
			return "", refused(ctx, "end of data", err)
		}
		return "", fmt.Errorf("smtpsend: %s: the message was sent but no final reply came back: %w; the server may have queued it: search the recipient's mailbox or the server's log for Message-ID %s before sending it again",
			s.Addr, withCause(ctx, err), m.id)
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

// fits refuses a message the server said it would not take: larger than
// its SIZE (RFC 1870), or with more recipients than its LIMITS RCPTMAX
// (RFC 9422). It would be refused on every attempt.
func (s *Sender) fits(c *smtp.Client, m composed) error {
	if ok, param := c.Extension("SIZE"); ok {
		if max, err := strconv.ParseInt(param, 10, 64); err == nil && max > 0 && int64(len(m.raw)) > max {
			return fmt.Errorf("smtpsend: the message is %d bytes and %s takes at most SIZE %d; nothing was sent: shorten it", len(m.raw), s.Addr, max)
		}
	}
	if ok, param := c.Extension("LIMITS"); ok {
		for _, limit := range strings.Fields(param) {
			v, found := strings.CutPrefix(strings.ToUpper(limit), "RCPTMAX=")
			if max, err := strconv.Atoi(v); found && err == nil && max > 0 && len(m.rcpts) > max {
				return fmt.Errorf("smtpsend: the message has %d recipients and %s takes at most RCPTMAX=%d; nothing was sent: send it as several messages under keys of their own", len(m.rcpts), s.Addr, max)
			}
		}
	}
	return nil
}

// tooManyRecipients reports whether a deferred RCPT TO is the server's
// recipient limit (RFC 5321 4.5.3.1.10): 4.5.3, or a 452 with no
// enhanced code to say otherwise. A 452 with another code (4.2.2, a full
// mailbox; 4.3.1, a server short of storage) may pass later, and stays a
// retry.
func tooManyRecipients(se *smtp.SMTPError) bool {
	return se.EnhancedCode == smtp.EnhancedCode{4, 5, 3} ||
		se.Code == 452 && se.EnhancedCode == smtp.EnhancedCode{}
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

// maxServerBytes bounds what Send reads from the server over one
// connection: its greeting and replies, and a TLS handshake. A server
// says a few kilobytes for one message; one that sends more is refused,
// rather than held in memory until Timeout.
const maxServerBytes = 1 << 20

// boundedConn is a connection whose reads fail once the server has sent
// maxServerBytes.
type boundedConn struct {
	net.Conn
	left int64
}

func (c *boundedConn) Read(p []byte) (int, error) {
	if c.left <= 0 {
		return 0, fmt.Errorf("the server sent over %d bytes of replies on one connection, far more than an SMTP server says for one message", maxServerBytes)
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.Conn.Read(p)
	c.left -= int64(n)
	return n, err
}

// withCause names the context's cause when it is why the connection was
// closed, so a cancellation does not read as a network fault.
func withCause(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); cause != nil {
		return fmt.Errorf("%w (%v)", err, cause)
	}
	return err
}
