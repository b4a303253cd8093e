package smtpsend_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"mime"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/smtpsend"
)

var welcome = once.Intent{
	Run:     "signup-4711",
	Kind:    "send_email",
	Target:  "ada@example.com",
	Payload: map[string]string{"subject": "Welcome", "body": "Hello Ada"},
}

func attempt(t *testing.T, number int) once.Attempt {
	t.Helper()
	key, _, err := once.KeyOf(welcome)
	if err != nil {
		t.Fatal(err)
	}
	return once.Attempt{Key: key, Number: number, Intent: welcome}
}

func message() smtpsend.Message {
	return smtpsend.Message{
		From:    "noreply@example.com",
		To:      []string{"ada@example.com"},
		Subject: "Welcome, Ada — ünïcode",
		Body:    []byte("Hello Ada\n.a line that starts with a dot\n"),
		Header:  map[string]string{"X-Campaign": "signup"},
	}
}

// class names the once error class of err, as once.Do will read it.
func class(err error) string {
	switch {
	case err == nil:
		return "nil"
	case errors.Is(err, once.ErrRetryLater) && errors.Is(err, once.ErrPermanent):
		return "both"
	case errors.Is(err, once.ErrRetryLater):
		return "retry-later"
	case errors.Is(err, once.ErrPermanent):
		return "permanent"
	default:
		return "unknown"
	}
}

func TestSendDelivers(t *testing.T) {
	srv := startServer(t)
	s := &smtpsend.Sender{Addr: srv.addr(), Timeout: 10 * time.Second, Hello: "worker.example.com"}
	a := attempt(t, 1)

	got, err := s.Send(context.Background(), a, message())
	if err != nil {
		t.Fatalf("Send: %v", err)
	}
	if got != "250 2.0.0 OK: queued" {
		t.Errorf("result %q, want the server's final reply 250 2.0.0 OK: queued", got)
	}
	msgs := srv.messages()
	if len(msgs) != 1 {
		t.Fatalf("server received %d messages, want 1", len(msgs))
	}
	m := msgs[0]
	want := "<" + string(a.Key) + "@once>"
	if id := m.Header.Get("Message-ID"); id != want || smtpsend.MessageID(a.Key, "") != want {
		t.Errorf("Message-ID %q (MessageID gives %q), want %q", id, smtpsend.MessageID(a.Key, ""), want)
	}
	if date, err := m.Header.Date(); err != nil || date.IsZero() {
		t.Errorf("Date header unreadable: %v", err)
	}
	checks := map[string]string{
		"From":         "noreply@example.com",
		"To":           "ada@example.com",
		"MIME-Version": "1.0",
		"Content-Type": "text/plain; charset=utf-8",
		"X-Campaign":   "signup",
	}
	for name, want := range checks {
		if got := m.Header.Get(name); got != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}
	if dec, err := new(mime.WordDecoder).DecodeHeader(m.Header.Get("Subject")); err != nil || dec != message().Subject {
		t.Errorf("Subject decodes to %q (%v), want %q", dec, err, message().Subject)
	}
	body := new(strings.Builder)
	if _, err := io.Copy(body, m.Body); err != nil {
		t.Fatal(err)
	}
	if body.String() != "Hello Ada\r\n.a line that starts with a dot\r\n" {
		t.Errorf("body %q, want the text with CRLF line endings and its leading dot intact", body.String())
	}

	// A second attempt of the same action carries the same Message-ID, so
	// a receiver or a person can tell the two copies are one message.
	if _, err := s.Send(context.Background(), attempt(t, 2), message()); err != nil {
		t.Fatalf("second Send: %v", err)
	}
	msgs = srv.messages()
	if len(msgs) != 2 {
		t.Fatalf("server received %d messages, want 2", len(msgs))
	}
	if id := msgs[1].Header.Get("Message-ID"); id != want {
		t.Errorf("second attempt's Message-ID %q, want the first's %q", id, want)
	}

	// A configured domain replaces "once".
	s.MessageIDDomain = "mail.example.com"
	if _, err := s.Send(context.Background(), a, message()); err != nil {
		t.Fatalf("Send with MessageIDDomain: %v", err)
	}
	if id, want := srv.messages()[2].Header.Get("Message-ID"), "<"+string(a.Key)+"@mail.example.com>"; id != want {
		t.Errorf("Message-ID %q, want %q", id, want)
	}
}

func TestSendConnectionRefusedIsRetryLater(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now

	s := &smtpsend.Sender{Addr: addr, Timeout: 10 * time.Second}
	_, err = s.Send(context.Background(), attempt(t, 1), message())
	if c := class(err); c != "retry-later" {
		t.Fatalf("connection refused: class %s (%v), want retry-later", c, err)
	}
}

func TestSendClassifiesEachStage(t *testing.T) {
	cases := []struct {
		name string
		fail failure
		// class is what Send's error must match; delivered is how many
		// messages the server read to the end.
		class     string
		delivered int
	}{
		{"MAIL 5xx", failure{mail: reply(550, "sender rejected")}, "permanent", 0},
		{"MAIL 4xx", failure{mail: reply(451, "try later")}, "retry-later", 0},
		{"RCPT 5xx", failure{rcpt: reply(550, "no such user")}, "permanent", 0},
		{"RCPT 4xx", failure{rcpt: reply(450, "mailbox busy")}, "retry-later", 0},
		{"DATA command 5xx", failure{data: reply(554, "no data accepted")}, "permanent", 0},
		{"DATA command 4xx", failure{data: reply(451, "out of spool space")}, "retry-later", 0},
		{"final reply 5xx", failure{final: reply(554, "message rejected as spam")}, "permanent", 1},
		{"final reply 4xx", failure{final: reply(452, "insufficient storage")}, "retry-later", 1},
		{"dropped after data", failure{drop: true}, "unknown", 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := startServer(t)
			srv.setFailure(tc.fail)
			s := &smtpsend.Sender{Addr: srv.addr(), Timeout: 10 * time.Second}
			got, err := s.Send(context.Background(), attempt(t, 1), message())
			if c := class(err); c != tc.class {
				t.Fatalf("class %s (%v), want %s", c, err, tc.class)
			}
			if got != "" {
				t.Errorf("result %q with a failure, want none", got)
			}
			if n := len(srv.messages()); n != tc.delivered {
				t.Errorf("server read %d messages, want %d", n, tc.delivered)
			}
			if tc.class == "unknown" && !strings.Contains(err.Error(), smtpsend.MessageID(attempt(t, 1).Key, "")) {
				t.Errorf("unknown outcome %q does not name the Message-ID to search for", err)
			}
		})
	}
}

// A server that takes the message and then says nothing: the sender
// gives up at Timeout, and the outcome is unknown, not a retry.
func TestSendTimeoutAfterDataIsUnknown(t *testing.T) {
	srv := startServer(t)
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) }) // runs before the server is closed
	srv.setFailure(failure{hang: hang})

	s := &smtpsend.Sender{Addr: srv.addr(), Timeout: 200 * time.Millisecond}
	_, err := s.Send(context.Background(), attempt(t, 1), message())
	if c := class(err); c != "unknown" {
		t.Fatalf("class %s (%v), want unknown", c, err)
	}
	if n := len(srv.messages()); n != 1 {
		t.Errorf("server read %d messages, want 1", n)
	}
}

// Cancelling the context while the final reply is awaited is the same
// unknown outcome; cancelling before anything was sent is a retry.
func TestSendContextCancelled(t *testing.T) {
	srv := startServer(t)
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	read := make(chan struct{}, 1)
	srv.setFailure(failure{hang: hang, read: read})

	ctx, cancel := context.WithCancelCause(context.Background())
	go func() {
		<-read
		cancel(errors.New("worker shutting down"))
	}()
	s := &smtpsend.Sender{Addr: srv.addr(), Timeout: time.Minute}
	_, err := s.Send(ctx, attempt(t, 1), message())
	if c := class(err); c != "unknown" {
		t.Fatalf("cancelled awaiting the final reply: class %s (%v), want unknown", c, err)
	}
	if !strings.Contains(err.Error(), "worker shutting down") {
		t.Errorf("error %q does not name the cancellation's cause", err)
	}

	done, stop := context.WithCancel(context.Background())
	stop()
	_, err = s.Send(done, attempt(t, 1), message())
	if c := class(err); c != "retry-later" {
		t.Fatalf("cancelled before dialling: class %s (%v), want retry-later", c, err)
	}
}

func TestSendRefusesBadInputBeforeDialling(t *testing.T) {
	srv := startServer(t)
	good := func() (smtpsend.Sender, smtpsend.Message) {
		return smtpsend.Sender{Addr: srv.addr(), Timeout: 10 * time.Second}, message()
	}
	cases := []struct {
		name  string
		edit  func(*smtpsend.Sender, *smtpsend.Message, *once.Attempt)
		names string // a word the error must contain
	}{
		{"no addr", func(s *smtpsend.Sender, _ *smtpsend.Message, _ *once.Attempt) { s.Addr = "" }, "Sender.Addr"},
		{"no key", func(_ *smtpsend.Sender, _ *smtpsend.Message, a *once.Attempt) { a.Key = "" }, "key"},
		{"key breaks the Message-ID", func(_ *smtpsend.Sender, _ *smtpsend.Message, a *once.Attempt) { a.Key = "a>b" }, "key"},
		{"bad domain", func(s *smtpsend.Sender, _ *smtpsend.Message, _ *once.Attempt) { s.MessageIDDomain = "a b" }, "MessageIDDomain"},
		{"no from", func(_ *smtpsend.Sender, m *smtpsend.Message, _ *once.Attempt) { m.From = "" }, "Message.From"},
		{"display name", func(_ *smtpsend.Sender, m *smtpsend.Message, _ *once.Attempt) { m.From = "Ada <ada@example.com>" }, "Message.From"},
		{"non-ascii address", func(_ *smtpsend.Sender, m *smtpsend.Message, _ *once.Attempt) { m.To = []string{"ada@exämple.com"} }, "Message.To[0]"},
		{"no to", func(_ *smtpsend.Sender, m *smtpsend.Message, _ *once.Attempt) { m.To = nil }, "Message.To"},
		{"injected rcpt", func(_ *smtpsend.Sender, m *smtpsend.Message, _ *once.Attempt) {
			m.To = []string{"ada@example.com\r\nRCPT TO:<eve@example.com>"}
		}, "Message.To[0]"},
		{"subject line break", func(_ *smtpsend.Sender, m *smtpsend.Message, _ *once.Attempt) {
			m.Subject = "hi\r\nBcc: eve@example.com"
		}, "Subject"},
		{"reserved header", func(_ *smtpsend.Sender, m *smtpsend.Message, _ *once.Attempt) {
			m.Header = map[string]string{"message-id": "<x@y>"}
		}, "message-id"},
		{"header name", func(_ *smtpsend.Sender, m *smtpsend.Message, _ *once.Attempt) {
			m.Header = map[string]string{"X Bad": "v"}
		}, "X Bad"},
		{"header value", func(_ *smtpsend.Sender, m *smtpsend.Message, _ *once.Attempt) {
			m.Header = map[string]string{"X-A": "v\nBcc: e"}
		}, "X-A"},
		{"body not utf-8", func(_ *smtpsend.Sender, m *smtpsend.Message, _ *once.Attempt) { m.Body = []byte{0xff, 0xfe} }, "Body"},
		{"hello with tls", func(s *smtpsend.Sender, _ *smtpsend.Message, _ *once.Attempt) {
			s.Hello = "worker.example.com"
			s.TLS = new(tls.Config)
		}, "Hello"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, m := good()
			a := attempt(t, 1)
			tc.edit(&s, &m, &a)
			_, err := s.Send(context.Background(), a, m)
			if c := class(err); c != "permanent" {
				t.Fatalf("class %s (%v), want permanent", c, err)
			}
			if !strings.Contains(err.Error(), tc.names) {
				t.Errorf("error %q does not name %q", err, tc.names)
			}
		})
	}
	if n := len(srv.messages()); n != 0 {
		t.Errorf("server read %d messages, want none", n)
	}
}

// Through once.Do: a message the server took without answering is put up
// for review and never sent again; a deferred one is released, and the
// next delivery sends it exactly once.
func TestDoDroppedAfterDataGoesToReviewAndIsNotResent(t *testing.T) {
	c, _ := testdb.SQLiteClient(t, once.Config{})
	srv := startServer(t)
	srv.setFailure(failure{drop: true})
	s := &smtpsend.Sender{Addr: srv.addr(), Timeout: 10 * time.Second}
	send := func(ctx context.Context, a once.Attempt) (string, error) { return s.Send(ctx, a, message()) }
	ctx := context.Background()

	_, err := once.Do(ctx, c, welcome, send)
	var unknown *once.UnknownOutcomeError
	if !errors.As(err, &unknown) || unknown.Status != once.StatusReview {
		t.Fatalf("first Do: %v, want an unknown outcome put up for review", err)
	}
	if d := once.Dispose(err); d.Action != once.JobDrop {
		t.Errorf("Dispose: %v, want the job dropped (a person decides)", d.Action)
	}

	srv.setFailure(failure{})
	for i := 0; i < 2; i++ {
		_, err := once.Do(ctx, c, welcome, send)
		if !errors.Is(err, once.ErrReview) {
			t.Fatalf("redelivery %d: %v, want ErrReview", i+1, err)
		}
	}
	if n := len(srv.messages()); n != 1 {
		t.Fatalf("server received %d copies, want 1", n)
	}
}

func TestDoDeferredIsReleasedThenSentOnce(t *testing.T) {
	c, _ := testdb.SQLiteClient(t, once.Config{})
	srv := startServer(t)
	srv.setFailure(failure{mail: reply(421, "service not available, closing channel")})
	s := &smtpsend.Sender{Addr: srv.addr(), Timeout: 10 * time.Second}
	send := func(ctx context.Context, a once.Attempt) (string, error) { return s.Send(ctx, a, message()) }
	ctx := context.Background()

	_, err := once.Do(ctx, c, welcome, send)
	if !errors.Is(err, once.ErrRetryLater) {
		t.Fatalf("first Do: %v, want ErrRetryLater", err)
	}
	if n := len(srv.messages()); n != 0 {
		t.Fatalf("server received %d messages after a 421 on MAIL, want 0", n)
	}

	srv.setFailure(failure{})
	res, err := once.Do(ctx, c, welcome, send)
	if err != nil {
		t.Fatalf("second Do: %v", err)
	}
	if res.Replayed || res.Value != "250 2.0.0 OK: queued" {
		t.Errorf("second Do: %+v, want the server's reply from a fresh send", res)
	}
	res, err = once.Do(ctx, c, welcome, send)
	if err != nil || !res.Replayed || res.Value != "250 2.0.0 OK: queued" {
		t.Fatalf("third Do: %+v, %v, want the stored reply replayed", res, err)
	}
	msgs := srv.messages()
	if len(msgs) != 1 {
		t.Fatalf("server received %d copies, want 1", len(msgs))
	}
	if id, want := msgs[0].Header.Get("Message-ID"), smtpsend.MessageID(res.Key, ""); id != want {
		t.Errorf("Message-ID %q, want %q", id, want)
	}
}
