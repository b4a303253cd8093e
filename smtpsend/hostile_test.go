package smtpsend_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/quotedprintable"
	"net/mail"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/smtpsend"
)

// Recipients, subjects and bodies often come from a language model, or
// from whoever wrote to it: these tests send what such input can hold to
// a real server and read the bytes it received.

// checkWire fails t if the bytes a server read hold a CR or LF that is
// not part of a CRLF, or a line over 998 bytes (RFC 5321 4.5.3.1.6: a
// dot doubled for transparency does not count).
func checkWire(t *testing.T, wire []byte) {
	t.Helper()
	for i, b := range wire {
		switch {
		case b == '\r' && (i+1 == len(wire) || wire[i+1] != '\n'):
			t.Fatalf("bare CR at byte %d of the transcript: %q", i, around(wire, i))
		case b == '\n' && (i == 0 || wire[i-1] != '\r'):
			t.Fatalf("bare LF at byte %d of the transcript: %q", i, around(wire, i))
		}
	}
	for n, line := range bytes.Split(wire, []byte("\r\n")) {
		size := len(line)
		if bytes.HasPrefix(line, []byte("..")) {
			size--
		}
		if size > 998 {
			t.Fatalf("line %d of the transcript is %d bytes, over 998: %.60q…", n+1, size, line)
		}
	}
}

func around(b []byte, i int) []byte {
	return b[max(0, i-20):min(len(b), i+20)]
}

// body reads a received message's body, decoded as its
// Content-Transfer-Encoding says.
func body(t *testing.T, m *mail.Message) string {
	t.Helper()
	var r io.Reader = m.Body
	if m.Header.Get("Content-Transfer-Encoding") == "quoted-printable" {
		r = quotedprintable.NewReader(r)
	}
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// refusedBeforeConnecting sends m and wants a permanent failure that
// names want, with no connection made.
func refusedBeforeConnecting(t *testing.T, s *smtpsend.Sender, srv *mailServer, m smtpsend.Message, want string) {
	t.Helper()
	conns, _ := srv.counts()
	_, err := s.Send(context.Background(), attempt(t, 1), m)
	if c := class(err); c != "permanent" {
		t.Fatalf("class %s (%v), want permanent", c, err)
	}
	if !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not name %q", err, want)
	}
	if now, _ := srv.counts(); now != conns {
		t.Errorf("the server was connected to %d times, want the message refused before any connection", now-conns)
	}
}

// The end-of-data form of SMTP smuggling: a bare CR, a dot, a bare CR.
// A server that takes CR alone as a line end would read the message as
// ended and the text after it as commands. Send writes every line break
// of the body as CRLF, so the dot is a line of its own and is doubled.
func TestSendNormalisesBareCRAndLF(t *testing.T) {
	srv := startServer(t)
	s := &smtpsend.Sender{Addr: srv.addr(), Timeout: 10 * time.Second}
	m := message()
	m.Body = []byte("a\r.\rMAIL FROM:<eve@example.com>\rRCPT TO:<eve@example.com>\rDATA\r\nbare LF\nand\r\r\nend")
	if _, err := s.Send(context.Background(), attempt(t, 1), m); err != nil {
		t.Fatalf("Send: %v", err)
	}
	checkWire(t, srv.transcript())
	if _, mails := srv.counts(); mails != 1 {
		t.Errorf("the server took %d MAIL commands, want 1: the body was read as commands", mails)
	}
	if got := srv.recipients(); len(got) != 1 || got[0] != "ada@example.com" {
		t.Errorf("the server accepted recipients %q, want only ada@example.com", got)
	}
	msgs := srv.messages()
	if len(msgs) != 1 {
		t.Fatalf("the server read %d messages, want 1", len(msgs))
	}
	want := "a\r\n.\r\nMAIL FROM:<eve@example.com>\r\nRCPT TO:<eve@example.com>\r\nDATA\r\nbare LF\r\nand\r\n\r\nend\r\n"
	if got := body(t, msgs[0]); got != want {
		t.Errorf("body %q, want %q", got, want)
	}
}

// NUL and other control characters are refused in every header and in
// the body, before anything is dialled. TAB is text.
func TestSendRefusesControlCharacters(t *testing.T) {
	srv := startServer(t)
	s := &smtpsend.Sender{Addr: srv.addr(), Timeout: 10 * time.Second}
	cases := []struct {
		name string
		edit func(*smtpsend.Message)
		want string
	}{
		{"NUL in subject", func(m *smtpsend.Message) { m.Subject = "hi\x00there" }, "Message.Subject"},
		{"ESC in subject", func(m *smtpsend.Message) { m.Subject = "hi\x1b[2J" }, "U+001B"},
		{"bare CR in subject", func(m *smtpsend.Message) { m.Subject = "hi\r.\rMAIL FROM:<e@x>" }, "Message.Subject"},
		{"C1 in subject", func(m *smtpsend.Message) { m.Subject = "hi\u009b2J" }, "U+009B"},
		{"DEL in header", func(m *smtpsend.Message) { m.Header = map[string]string{"X-A": "v\x7f"} }, "X-A"},
		{"BEL in header", func(m *smtpsend.Message) { m.Header = map[string]string{"X-A": "v\x07"} }, "U+0007"},
		{"bare CR in header", func(m *smtpsend.Message) { m.Header = map[string]string{"X-A": "v\r.\rQUIT"} }, "X-A"},
		// Encoded-words a reader decodes: a line break that shows a
		// Bcc the message never had, an escape a terminal acts on.
		{"encoded CR LF in header", func(m *smtpsend.Message) {
			m.Header = map[string]string{"X-A": "=?utf-8?q?a=0D=0ABcc:_evil@example.com?="}
		}, "X-A"},
		{"encoded ESC in header", func(m *smtpsend.Message) {
			m.Header = map[string]string{"X-A": mime.BEncoding.Encode("utf-8", "\x1b[2J")}
		}, "U+001B"},
		{"NUL in body", func(m *smtpsend.Message) { m.Body = []byte("a\x00b") }, "Message.Body"},
		{"ESC in body", func(m *smtpsend.Message) { m.Body = []byte("line\n\x1b]0;owned\x07\n") }, "U+001B"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := message()
			tc.edit(&m)
			refusedBeforeConnecting(t, s, srv, m, tc.want)
		})
	}

	// A tab is kept, in a header and in the body.
	m := message()
	m.Subject = "a\tb"
	m.Header = map[string]string{"X-A": "c\td", "X-B": mime.QEncoding.Encode("utf-8", "Café")}
	m.Body = []byte("e\tf\n")
	if _, err := s.Send(context.Background(), attempt(t, 1), m); err != nil {
		t.Fatalf("Send with tabs: %v", err)
	}
	got := srv.messages()[0]
	if sub := got.Header.Get("Subject"); sub != "a\tb" {
		t.Errorf("Subject %q, want the tab kept", sub)
	}
	if v := got.Header.Get("X-B"); v != mime.QEncoding.Encode("utf-8", "Café") {
		t.Errorf("X-B %q, want the encoded-word kept", v)
	}
	if b := body(t, got); b != "e\tf\r\n" {
		t.Errorf("body %q, want the tab kept", b)
	}
}

// Addresses are parsed as RFC 5322 mailboxes: anything that is not
// exactly one bare address, or that is too long for the envelope, is
// refused before anything is dialled.
func TestSendRefusesAddressesThatAreNotOneMailbox(t *testing.T) {
	srv := startServer(t)
	s := &smtpsend.Sender{Addr: srv.addr(), Timeout: 10 * time.Second}
	label := strings.Repeat("d", 60) + "."
	cases := []struct {
		name, addr, want string
	}{
		{"DSN parameter after a tab", "user@example.com\tNOTIFY=SUCCESS", "control character"},
		{"in angle brackets with a tab", "<user@example.com\tNOTIFY=SUCCESS>", "control character"},
		{"NUL", "user@example.com\x00", "control character"},
		{"space", "user@example.com NOTIFY=SUCCESS", "space"},
		{"source route", "@relay.example.com:user@example.com", "one mailbox"},
		{"group", "undisclosed-recipients:;", "one mailbox"},
		{"group with a member", "friends:user@example.com;", "one mailbox"},
		{"two addresses", "a@example.com,b@example.com", "one mailbox"},
		{"quoted local part", `"user"@example.com`, "one mailbox"},
		{"comment", "user@example.com(hi)", "one mailbox"},
		{"angle brackets", "<user@example.com>", "one mailbox"},
		{"no domain", "user", "one mailbox"},
		{"local part over 64", strings.Repeat("u", 65) + "@example.com", "64"},
		{"domain over 255", "u@" + strings.Repeat(label, 4) + strings.Repeat("d", 12) + ".com", "255"},
		{"path over 256", strings.Repeat("u", 64) + "@" + strings.Repeat(label, 3) + strings.Repeat("d", 5) + ".com", "256"},
	}
	for _, tc := range cases {
		for _, field := range []string{"Message.From", "Message.To[0]", "Message.Cc[0]", "Message.Bcc[0]"} {
			t.Run(tc.name+"/"+field, func(t *testing.T) {
				m := message()
				switch field {
				case "Message.From":
					m.From = tc.addr
				case "Message.To[0]":
					m.To = []string{tc.addr}
				case "Message.Cc[0]":
					m.Cc = []string{tc.addr}
				case "Message.Bcc[0]":
					m.Bcc = []string{tc.addr}
				}
				refusedBeforeConnecting(t, s, srv, m, field)
				_, err := s.Send(context.Background(), attempt(t, 1), m)
				if !strings.Contains(err.Error(), tc.want) {
					t.Errorf("error %q does not say %q", err, tc.want)
				}
			})
		}
	}

	// The longest path that fits: 64 + 1 + 189 bytes, 256 with its
	// angle brackets.
	longest := strings.Repeat("u", 64) + "@" + strings.Repeat(label, 3) + strings.Repeat("d", 2) + ".com"
	if len(longest) != 254 {
		t.Fatalf("the longest address is %d bytes, want 254", len(longest))
	}
	m := message()
	m.To = []string{longest}
	if _, err := s.Send(context.Background(), attempt(t, 1), m); err != nil {
		t.Fatalf("Send to a 254-byte address: %v", err)
	}
	if got := srv.recipients(); len(got) != 1 || got[0] != longest {
		t.Errorf("the server accepted %q, want the 254-byte address", got)
	}
}

// A body with a 5,000-byte line or 8-bit text goes as quoted-printable,
// a 3,009-byte subject as folded encoded-words, and a long extra header
// folded, so the server reads only 7-bit lines of at most 998 bytes,
// even when it does not offer 8BITMIME.
func TestSendEncodesLongLinesAnd8Bit(t *testing.T) {
	srv := startServer(t)
	srv.setFailure(failure{no8bit: true})
	s := &smtpsend.Sender{Addr: srv.addr(), Timeout: 10 * time.Second}
	words := strings.Repeat("word ", 601) + "end" // 3,008 bytes
	unbroken := strings.Repeat("x", 3009)
	cases := []struct {
		name    string
		subject string
		body    string
		header  string
		qp      bool
	}{
		{"long body line", "Welcome", strings.Repeat("a", 5000) + "\n", "", true},
		{"8-bit body", "Welcome", "Grüße, naïve café\n", "", true},
		{"8-bit and long, trailing space", "Welcome", "é " + strings.Repeat("b", 2000) + " \nlast", "", true},
		{"7-bit body stays as it is", "Welcome", "short\n.dot\n", "", false},
		{"long subject with spaces", "S" + words, "x\n", "", false},
		{"long subject without spaces", unbroken, "x\n", "", false},
		{"long non-ASCII subject", strings.Repeat("ü", 1500) + "!", "x\n", "", false},
		{"subject that looks encoded", "=?utf-8?b?SGk=?=", "x\n", "", false},
		{"long header", "Welcome", "x\n", strings.TrimSuffix(strings.Repeat("<https://example.com/unsubscribe/abcdefgh>, ", 50), ", "), false},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := message()
			m.Subject, m.Body = tc.subject, []byte(tc.body)
			if tc.header != "" {
				m.Header = map[string]string{"List-Unsubscribe": tc.header}
			}
			if _, err := s.Send(context.Background(), attempt(t, 1), m); err != nil {
				t.Fatalf("Send: %v", err)
			}
			wire := srv.transcript()
			checkWire(t, wire)
			if i := bytes.IndexFunc(wire, func(r rune) bool { return r >= 0x80 }); i >= 0 {
				t.Fatalf("8-bit byte at %d of the transcript: %q", i, around(wire, i))
			}
			got := srv.messages()[i]
			cte := got.Header.Get("Content-Transfer-Encoding")
			if tc.qp != (cte == "quoted-printable") {
				t.Errorf("Content-Transfer-Encoding %q, want quoted-printable %v", cte, tc.qp)
			}
			want := strings.ReplaceAll(tc.body, "\n", "\r\n")
			if !strings.HasSuffix(want, "\r\n") {
				want += "\r\n"
			}
			if b := body(t, got); b != want {
				t.Errorf("body decodes to %.80q…, want %.80q…", b, want)
			}
			if dec, err := new(mime.WordDecoder).DecodeHeader(got.Header.Get("Subject")); err != nil || dec != tc.subject {
				t.Errorf("Subject decodes to %.80q (%v), want %.80q", dec, err, tc.subject)
			}
			if h := got.Header.Get("List-Unsubscribe"); h != tc.header {
				t.Errorf("List-Unsubscribe unfolds to %.80q, want %.80q", h, tc.header)
			}
		})
	}

	// An extra header with a run no whitespace breaks cannot be folded,
	// nor encoded (it may be structured): it is refused.
	m := message()
	m.Header = map[string]string{"X-Token": strings.Repeat("t", 1200)}
	refusedBeforeConnecting(t, s, srv, m, "X-Token")
}

// A message larger than the SIZE the server advertises is refused
// before MAIL FROM, for good: it would be refused on every attempt.
func TestSendRefusesMessageOverServerSize(t *testing.T) {
	srv := startServerWith(t, nil, func(s *smtp.Server) { s.MaxMessageBytes = 2000 })
	s := &smtpsend.Sender{Addr: srv.addr(), Timeout: 10 * time.Second}
	m := message()
	m.Body = bytes.Repeat([]byte("0123456789\n"), 300)
	_, err := s.Send(context.Background(), attempt(t, 1), m)
	if c := class(err); c != "permanent" {
		t.Fatalf("class %s (%v), want permanent", c, err)
	}
	if !strings.Contains(err.Error(), "SIZE 2000") {
		t.Errorf("error %q does not name the server's SIZE 2000", err)
	}
	if wire := srv.transcript(); bytes.Contains(wire, []byte("MAIL FROM")) || bytes.Contains(wire, []byte("DATA")) {
		t.Errorf("the transcript holds MAIL FROM or DATA, want the message refused after EHLO:\n%s", wire)
	}

	// A message that fits goes, declaring its size.
	m.Body = []byte("short\n")
	if _, err := s.Send(context.Background(), attempt(t, 1), m); err != nil {
		t.Fatalf("Send of a small message: %v", err)
	}
	if !bytes.Contains(srv.transcript(), []byte(" SIZE=")) {
		t.Errorf("MAIL FROM does not declare the message's SIZE:\n%s", srv.transcript())
	}
}

func addrs(prefix string, n int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("%s%d@example.com", prefix, i))
	}
	return out
}

// More recipients than a server must take (100) are refused before
// dialling, unless Sender.MaxRecipients allows more; a server that
// advertises a lower limit, or defers the rest with 452 after taking
// some, is a permanent failure, not a retry that would meet the same
// limit for ever.
func TestSendCapsRecipients(t *testing.T) {
	srv := startServer(t)
	s := &smtpsend.Sender{Addr: srv.addr(), Timeout: 10 * time.Second}
	m := message()
	m.To, m.Cc, m.Bcc = addrs("to", 50), addrs("cc", 30), addrs("bcc", 21)
	refusedBeforeConnecting(t, s, srv, m, "101 recipients")

	// The same address twice is one recipient.
	m.Bcc = append(addrs("bcc", 20), "TO0@example.com")
	if _, err := s.Send(context.Background(), attempt(t, 1), m); err != nil {
		t.Fatalf("Send to 100 recipients: %v", err)
	}
	if n := len(srv.recipients()); n != 100 {
		t.Errorf("the server accepted %d recipients, want 100", n)
	}

	t.Run("server advertises fewer", func(t *testing.T) {
		srv := startServerWith(t, nil, func(s *smtp.Server) { s.MaxRecipients = 20 })
		s := &smtpsend.Sender{Addr: srv.addr(), Timeout: 10 * time.Second}
		m := message()
		m.To = addrs("to", 21)
		_, err := s.Send(context.Background(), attempt(t, 1), m)
		if c := class(err); c != "permanent" || !strings.Contains(err.Error(), "RCPTMAX=20") {
			t.Fatalf("class %s (%v), want permanent naming RCPTMAX=20", c, err)
		}
		if _, mails := srv.counts(); mails != 0 {
			t.Errorf("the server took %d MAIL commands, want none", mails)
		}
	})

	t.Run("server defers the rest", func(t *testing.T) {
		c, _ := testdb.SQLiteClient(t, once.Config{})
		srv := startServer(t)
		srv.setFailure(failure{rcptLimit: 50})
		s := &smtpsend.Sender{Addr: srv.addr(), Timeout: 10 * time.Second, MaxRecipients: 150}
		m := message()
		m.To = addrs("to", 120)
		send := func(ctx context.Context, a once.Attempt) (string, error) { return s.Send(ctx, a, m) }
		for i := range 2 {
			_, err := once.Do(context.Background(), c, welcome, send)
			if !errors.Is(err, once.ErrFailed) || !strings.Contains(err.Error(), "took 50 recipients") {
				t.Fatalf("delivery %d: %v, want a stored permanent failure saying the server took 50", i+1, err)
			}
		}
		if _, mails := srv.counts(); mails != 1 {
			t.Errorf("the server was asked %d times, want once: the failure is stored", mails)
		}
		if n := len(srv.messages()); n != 0 {
			t.Errorf("the server read %d messages, want none", n)
		}
	})

	// A 452 with an enhanced code other than 4.5.3 is not the
	// recipient limit: a full mailbox (4.2.2) or a server short of
	// storage (4.3.1) may take the message later.
	for _, code := range []smtp.EnhancedCode{{4, 2, 2}, {4, 3, 1}} {
		t.Run(fmt.Sprintf("452 %d.%d.%d after other recipients is a retry", code[0], code[1], code[2]), func(t *testing.T) {
			srv := startServer(t)
			srv.setFailure(failure{rcptLimit: 1, rcptLimitReply: &smtp.SMTPError{Code: 452, EnhancedCode: code, Message: "try again later"}})
			s := &smtpsend.Sender{Addr: srv.addr(), Timeout: 10 * time.Second}
			m := message()
			m.To = addrs("to", 2)
			_, err := s.Send(context.Background(), attempt(t, 1), m)
			if c := class(err); c != "retry-later" {
				t.Fatalf("class %s (%v), want retry-later", c, err)
			}
		})
	}

	t.Run("452 on the first recipient is a retry", func(t *testing.T) {
		srv := startServer(t)
		srv.setFailure(failure{rcpt: reply(452, "insufficient system storage")})
		s := &smtpsend.Sender{Addr: srv.addr(), Timeout: 10 * time.Second}
		_, err := s.Send(context.Background(), attempt(t, 1), message())
		if c := class(err); c != "retry-later" {
			t.Fatalf("class %s (%v), want retry-later", c, err)
		}
	})
}

// Cc recipients are in the Cc header and the envelope; Bcc recipients
// only in the envelope. Cc and Bcc set through Message.Header, which
// would never reach the envelope, are refused.
func TestSendCcAndBcc(t *testing.T) {
	srv := startServer(t)
	s := &smtpsend.Sender{Addr: srv.addr(), Timeout: 10 * time.Second}
	m := message()
	m.Cc = []string{"cc1@example.com", "cc2@example.com"}
	m.Bcc = []string{"hidden@example.com"}
	if _, err := s.Send(context.Background(), attempt(t, 1), m); err != nil {
		t.Fatalf("Send: %v", err)
	}
	want := "ada@example.com cc1@example.com cc2@example.com hidden@example.com"
	if got := strings.Join(srv.recipients(), " "); got != want {
		t.Errorf("envelope recipients %q, want %q", got, want)
	}
	got := srv.messages()[0]
	if cc := got.Header.Get("Cc"); cc != "cc1@example.com, cc2@example.com" {
		t.Errorf("Cc header %q, want both Cc recipients", cc)
	}
	if raw := srv.rawMessages()[0]; bytes.Contains(raw, []byte("hidden@")) || got.Header.Get("Bcc") != "" {
		t.Errorf("the message names the Bcc recipient:\n%s", raw)
	}

	for _, name := range []string{"Cc", "bcc", "BCC"} {
		m := message()
		m.Header = map[string]string{name: "eve@example.com"}
		refusedBeforeConnecting(t, s, srv, m, name)
	}
}
