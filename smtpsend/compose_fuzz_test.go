package smtpsend

import (
	"bytes"
	"io"
	"mime"
	"mime/quotedprintable"
	"net/mail"
	"strings"
	"testing"

	"github.com/oncehq/once"
)

// FuzzCompose holds compose to what the wire needs whatever the text:
// a message it does not refuse has only CRLF line breaks, no line over
// 998 bytes and no 8-bit byte, and reads back as what was given, line
// breaks written as CRLF.
func FuzzCompose(f *testing.F) {
	f.Add("Welcome, Ada — ünïcode", "Hello\r.\rMAIL FROM:<e@x>\n", "v", "a@example.com")
	f.Add(strings.Repeat("x", 3009), strings.Repeat("é", 3000), strings.Repeat("w ", 700), "b@example.com")
	f.Add("=?utf-8?b?SGk=?=", "\x00", "\x1b[2J", "user@example.com\tNOTIFY=SUCCESS")
	s := &Sender{Addr: "127.0.0.1:25"}
	a := once.Attempt{Key: "k"}
	f.Fuzz(func(t *testing.T, subject, body, value, to string) {
		m, err := s.compose(a, Message{From: "f@example.com", To: []string{to}, Subject: subject, Body: []byte(body), Header: map[string]string{"X-A": value}})
		if err != nil {
			return
		}
		raw := m.raw
		for i, b := range raw {
			switch {
			case b >= 0x80:
				t.Fatalf("8-bit byte at %d", i)
			case b == '\r' && (i+1 == len(raw) || raw[i+1] != '\n'), b == '\n' && (i == 0 || raw[i-1] != '\r'):
				t.Fatalf("bare CR or LF at %d: %q", i, raw)
			}
		}
		for line := range bytes.SplitSeq(raw, []byte("\r\n")) {
			if len(line) > maxLine {
				t.Fatalf("a line of %d bytes", len(line))
			}
		}
		msg, err := mail.ReadMessage(bytes.NewReader(raw))
		if err != nil {
			t.Fatalf("the message does not parse: %v\n%q", err, raw)
		}
		// net/textproto joins a folded line with one space, where RFC
		// 5322 only drops the CRLF: compare the words.
		got, err := new(mime.WordDecoder).DecodeHeader(msg.Header.Get("Subject"))
		if err != nil || strings.Join(strings.Fields(got), " ") != strings.Join(strings.Fields(subject), " ") {
			t.Fatalf("Subject reads back as %q (%v), want %q", got, err, subject)
		}
		var r io.Reader = msg.Body
		if msg.Header.Get("Content-Transfer-Encoding") == "quoted-printable" {
			r = quotedprintable.NewReader(r)
		}
		text, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		want := strings.NewReplacer("\r\n", "\r\n", "\r", "\r\n", "\n", "\r\n").Replace(body)
		if want != "" && !strings.HasSuffix(want, "\r\n") {
			want += "\r\n"
		}
		if string(text) != want {
			t.Fatalf("body reads back as %q, want %q", text, want)
		}
	})
}
