package smtptest_test

import (
	"testing"

	"github.com/emersion/go-smtp"

	"github.com/oncehq/once/internal/smtptest"
)

// send submits raw over plain SMTP, as a relay on loopback is spoken to.
func send(addr, raw string) error {
	c, err := smtp.Dial(addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.Mail("shop@example.com", nil); err != nil {
		return err
	}
	if err := c.Rcpt("ada@example.com", nil); err != nil {
		return err
	}
	w, err := c.Data()
	if err != nil {
		return err
	}
	if _, err := w.Write([]byte(raw)); err != nil {
		return err
	}
	if err := w.Close(); err != nil {
		return err
	}
	return c.Quit()
}

func TestServerKeepsMessages(t *testing.T) {
	s := smtptest.Start(t)
	msg := "From: shop@example.com\r\nTo: ada@example.com\r\nSubject: Order 1\r\n\r\nThank you.\r\n"
	if err := send(s.Addr(), msg); err != nil {
		t.Fatal(err)
	}
	got := s.Messages()
	if len(got) != 1 {
		t.Fatalf("%d messages; want 1", len(got))
	}
	m := got[0]
	if m.From != "shop@example.com" || len(m.To) != 1 || m.To[0] != "ada@example.com" || m.Header.Get("Subject") != "Order 1" || string(m.Body) != "Thank you.\r\n" {
		t.Fatalf("kept %+v", m)
	}
	// An unparsable message is refused, not kept.
	if err := send(s.Addr(), "no header\r\n"); err == nil {
		t.Error("an unparsable message was accepted")
	}
	if n := len(s.Messages()); n != 1 {
		t.Errorf("%d messages after a refused one; want 1", n)
	}
}
