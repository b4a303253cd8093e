package smtpsend

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"mime"
	"mime/quotedprintable"
	"net/mail"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/oncehq/once"
)

// DefaultMaxRecipients is how many envelope recipients a message may
// have when Sender.MaxRecipients is zero: the number RFC 5321 (4.5.3.1.8)
// says every server must accept in one message.
const DefaultMaxRecipients = 100

// Limits of RFC 5321 4.5.3.1 on an address in the envelope: a path is
// the address in angle brackets, so the address itself is two bytes
// shorter.
const (
	maxLocalPart = 64
	maxDomain    = 255
	maxPath      = 256
)

// Line lengths of RFC 5322 2.1.1: a line must not pass 998 bytes, and
// should not pass 78; header fields are folded to the second.
const (
	maxLine  = 998
	foldLine = 78
)

// reserved are the header fields compose writes itself.
var reserved = map[string]bool{
	"date": true, "from": true, "to": true, "subject": true, "message-id": true,
	"mime-version": true, "content-type": true, "content-transfer-encoding": true,
	"cc": true, "bcc": true,
}

// composed is a message ready to send: its text, CRLF throughout, its
// envelope recipients and its Message-ID.
type composed struct {
	raw   []byte
	rcpts []string
	id    string
}

// compose checks the sender and the message, and renders it as RFC 5322
// text. Everything it refuses would be refused on every attempt, so it is
// checked before anything is dialled.
func (s *Sender) compose(a once.Attempt, msg Message) (composed, error) {
	switch {
	case s.Addr == "":
		return composed{}, errors.New("smtpsend: Sender.Addr is empty; set it to the SMTP server's host:port")
	case s.TLS != nil && s.Hello != "":
		return composed{}, errors.New("smtpsend: Sender.Hello cannot be combined with Sender.TLS (the SMTP client introduces itself as localhost when it starts TLS); clear Hello")
	case s.MaxRecipients < 0:
		return composed{}, fmt.Errorf("smtpsend: Sender.MaxRecipients is %d; zero means DefaultMaxRecipients (%d)", s.MaxRecipients, DefaultMaxRecipients)
	case a.Key == "":
		return composed{}, errors.New("smtpsend: the attempt has no key; call Send from the effect function once.Do runs, with the Attempt it is given")
	case !isAtext(string(a.Key)):
		return composed{}, fmt.Errorf("smtpsend: the attempt's key %q cannot be part of a Message-ID; pass the Attempt once.Do gives the effect", a.Key)
	case s.MessageIDDomain != "" && !isAtext(s.MessageIDDomain):
		return composed{}, fmt.Errorf("smtpsend: Sender.MessageIDDomain %q is not a dot-atom; use a domain name such as mail.example.com", s.MessageIDDomain)
	case msg.From == "":
		return composed{}, errors.New("smtpsend: Message.From is empty; set the sender's address")
	case len(msg.To) == 0:
		return composed{}, errors.New("smtpsend: Message.To is empty; name at least one recipient")
	}
	if err := checkAddr("Message.From", msg.From); err != nil {
		return composed{}, err
	}
	rcpts, err := s.recipients(msg)
	if err != nil {
		return composed{}, err
	}
	if err := checkText("Message.Subject", msg.Subject); err != nil {
		return composed{}, err
	}
	body, err := normalise(msg.Body)
	if err != nil {
		return composed{}, err
	}

	id := MessageID(a.Key, s.MessageIDDomain)
	var b bytes.Buffer
	b.WriteString("Date: " + time.Now().Format(time.RFC1123Z) + "\r\n")
	b.WriteString("From: " + msg.From + "\r\n")
	// Addresses hold no whitespace and are at most 254 bytes, so a list
	// always folds after its commas.
	b.WriteString(mustFold("To: " + strings.Join(msg.To, ", ")))
	if len(msg.Cc) > 0 {
		b.WriteString(mustFold("Cc: " + strings.Join(msg.Cc, ", ")))
	}
	b.WriteString(subject(msg.Subject))
	b.WriteString("Message-ID: " + id + "\r\n")
	names := make([]string, 0, len(msg.Header))
	for name := range msg.Header {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		field, err := header(name, msg.Header[name])
		if err != nil {
			return composed{}, err
		}
		b.WriteString(field)
	}
	b.WriteString("MIME-Version: 1.0\r\n")
	b.WriteString("Content-Type: text/plain; charset=utf-8\r\n")
	if !sevenBit(body) {
		// What mail clients do with text a server may not take as it is:
		// quoted-printable keeps every line under 77 bytes and every byte
		// 7-bit, so the message needs neither 8BITMIME nor long lines.
		b.WriteString("Content-Transfer-Encoding: quoted-printable\r\n\r\n")
		w := quotedprintable.NewWriter(&b)
		w.Write(body)
		w.Close()
		if !bytes.HasSuffix(b.Bytes(), []byte("\r\n")) {
			b.WriteString("\r\n")
		}
	} else {
		b.WriteString("\r\n")
		b.Write(body)
	}
	return composed{raw: b.Bytes(), rcpts: rcpts, id: id}, nil
}

// recipients checks To, Cc and Bcc and returns the envelope's
// recipients: each address once, however often and in whatever case it
// is named, in the order first named.
func (s *Sender) recipients(msg Message) ([]string, error) {
	var rcpts []string
	seen := make(map[string]bool)
	for _, list := range []struct {
		field string
		addrs []string
	}{{"Message.To", msg.To}, {"Message.Cc", msg.Cc}, {"Message.Bcc", msg.Bcc}} {
		for i, addr := range list.addrs {
			if err := checkAddr(fmt.Sprintf("%s[%d]", list.field, i), addr); err != nil {
				return nil, err
			}
			if low := strings.ToLower(addr); !seen[low] {
				seen[low] = true
				rcpts = append(rcpts, addr)
			}
		}
	}
	if max := s.maxRecipients(); len(rcpts) > max {
		return nil, fmt.Errorf("smtpsend: the message has %d recipients (To, Cc and Bcc), over the limit of %d (Sender.MaxRecipients; a server must take 100, and may refuse more for good); send it as several messages under keys of their own", len(rcpts), max)
	}
	return rcpts, nil
}

func (s *Sender) maxRecipients() int {
	if s.MaxRecipients == 0 {
		return DefaultMaxRecipients
	}
	return s.MaxRecipients
}

// checkAddr refuses what is not exactly one mailbox written as a bare
// address (local@domain), or that would not fit the envelope: a DSN
// parameter after a tab, a source route, a group, a display name, a
// quoted or commented form.
func checkAddr(field, addr string) error {
	if i := strings.IndexFunc(addr, func(r rune) bool { return r < ' ' || r == 0x7f }); i >= 0 {
		return fmt.Errorf("smtpsend: %s %q holds a control character (%U at byte %d); an address is local@domain and nothing else", field, addr, addr[i], i)
	}
	if i := strings.IndexByte(addr, ' '); i >= 0 {
		return fmt.Errorf("smtpsend: %s %q holds a space (at byte %d); an address is local@domain and nothing else", field, addr, i)
	}
	if !isASCII(addr) {
		// It would need SMTPUTF8, which a server may not offer: that
		// refusal would come back on every attempt.
		return fmt.Errorf("smtpsend: %s %q is not ASCII; internationalised addresses are not supported, write the domain in its xn-- form", field, addr)
	}
	if p, err := mail.ParseAddress(addr); err != nil || p.Name != "" || p.Address != addr {
		return fmt.Errorf("smtpsend: %s %q is not one mailbox written as local@domain (no display name, angle brackets, quotes, comments, groups or source routes)", field, addr)
	}
	at := strings.LastIndexByte(addr, '@')
	switch {
	case at > maxLocalPart:
		return fmt.Errorf("smtpsend: %s %.40q… has a local part of %d bytes, over RFC 5321's 64", field, addr, at)
	case len(addr)-at-1 > maxDomain:
		return fmt.Errorf("smtpsend: %s %.40q… has a domain of %d bytes, over RFC 5321's 255", field, addr, len(addr)-at-1)
	case len(addr)+2 > maxPath:
		return fmt.Errorf("smtpsend: %s %.40q… is %d bytes, %d in angle brackets, over RFC 5321's path of 256", field, addr, len(addr), len(addr)+2)
	}
	return nil
}

// control reports the first character text may not hold: a C0 control
// other than TAB, DEL, or a C1 control. A terminal or a mail reader may
// act on them, and a CR or LF alone would end a line or the message.
func control(s string) (r rune, at int) {
	for i, r := range s {
		if r < ' ' && r != '\t' || r >= 0x7f && r <= 0x9f {
			return r, i
		}
	}
	return 0, -1
}

// checkText refuses a header's text that is not one line of UTF-8
// without control characters.
func checkText(field, s string) error {
	if !utf8.ValidString(s) {
		return fmt.Errorf("smtpsend: %s is not valid UTF-8", field)
	}
	if r, i := control(s); i >= 0 {
		return fmt.Errorf("smtpsend: %s holds control character %U at byte %d; a header is one line of text (TAB is allowed): remove it", field, r, i)
	}
	return nil
}

// normalise returns body with every line break (CRLF, CR or LF alone)
// written as CRLF, ending in one, or refuses it. RFC 5321 2.3.8: a CR
// or LF alone must not be sent, and a server that took one as a line end
// could read a dot after it as the end of the message, and the rest as
// commands.
func normalise(body []byte) ([]byte, error) {
	if !utf8.Valid(body) {
		return nil, errors.New("smtpsend: Message.Body is not valid UTF-8; the message is sent as text/plain; charset=utf-8")
	}
	out := make([]byte, 0, len(body)+len(body)/32+2)
	for i := 0; i < len(body); {
		r, n := utf8.DecodeRune(body[i:])
		switch {
		case r == '\r':
			if i+1 < len(body) && body[i+1] == '\n' {
				n = 2
			}
			out = append(out, '\r', '\n')
		case r == '\n':
			out = append(out, '\r', '\n')
		case r < ' ' && r != '\t' || r >= 0x7f && r <= 0x9f:
			return nil, fmt.Errorf("smtpsend: Message.Body holds control character %U at byte %d; text may hold TAB and line breaks, no other control characters: remove it", r, i)
		default:
			out = append(out, body[i:i+n]...)
		}
		i += n
	}
	if len(out) > 0 && !bytes.HasSuffix(out, []byte("\r\n")) {
		out = append(out, '\r', '\n')
	}
	return out, nil
}

// sevenBit reports whether a normalised body can go as it is: ASCII,
// with no line over 998 bytes.
func sevenBit(body []byte) bool {
	for line := range bytes.SplitSeq(body, []byte("\r\n")) {
		if len(line) > maxLine || !isASCII(string(line)) {
			return false
		}
	}
	return true
}

// subject renders the Subject field: folded at its spaces when it is
// ASCII and can be, else as RFC 2047 encoded-words, one to a line. Text
// that looks like an encoded-word is encoded too, so it reads as typed.
func subject(s string) string {
	if isASCII(s) && !strings.Contains(s, "=?") {
		if f, ok := fold("Subject: " + s); ok {
			return f
		}
	}
	return mustFold("Subject: " + encodedWords(s))
}

// encodedWords encodes s as base64 encoded-words of at most 75 bytes
// (RFC 2047 2), split at rune boundaries and separated by spaces, which
// a reader drops between encoded-words.
func encodedWords(s string) string {
	var words []string
	for len(s) > 0 {
		n := min(45, len(s)) // 45 bytes are 60 in base64, 72 with the markers
		for n < len(s) && !utf8.RuneStart(s[n]) {
			n--
		}
		words = append(words, "=?utf-8?b?"+base64.StdEncoding.EncodeToString([]byte(s[:n]))+"?=")
		s = s[n:]
	}
	return strings.Join(words, " ")
}

// header renders an extra header field, folded, or refuses it. Its value
// may be structured (an address, a list of URLs), so it is not encoded:
// it must be ASCII, and fold at its whitespace into lines of at most 998
// bytes.
func header(name, value string) (string, error) {
	switch {
	case name == "" || strings.IndexFunc(name, func(r rune) bool { return r <= ' ' || r > '~' || r == ':' }) >= 0:
		return "", fmt.Errorf("smtpsend: Message.Header name %q is not a header field name (printable ASCII, no spaces or colons)", name)
	case strings.EqualFold(name, "cc") || strings.EqualFold(name, "bcc"):
		return "", fmt.Errorf("smtpsend: Message.Header sets %s, which would not reach the envelope; use Message.Cc or Message.Bcc", name)
	case reserved[strings.ToLower(name)]:
		return "", fmt.Errorf("smtpsend: Message.Header sets %s, which Send writes itself; set it through Message's fields or drop it", name)
	}
	if err := checkText("Message.Header "+name, value); err != nil {
		return "", err
	}
	if !isASCII(value) {
		return "", fmt.Errorf("smtpsend: Message.Header %s holds non-ASCII text; encode it (mime.QEncoding) as one line", name)
	}
	// A reader shows the text of encoded-words decoded: it is held to
	// the same rules, so a line break or an escape cannot come in
	// encoded.
	decoded, err := new(mime.WordDecoder).DecodeHeader(value)
	if err != nil {
		return "", fmt.Errorf("smtpsend: Message.Header %s holds an encoded-word that cannot be read (%v); encode its text as utf-8 (mime.QEncoding)", name, err)
	}
	if err := checkText("Message.Header "+name+", decoded,", decoded); err != nil {
		return "", err
	}
	f, ok := fold(name + ": " + value)
	if !ok {
		return "", fmt.Errorf("smtpsend: Message.Header %s has a run of over %d bytes with no space or tab to fold it at; shorten it", name, maxLine)
	}
	return f, nil
}

// fold breaks a header field of one line into lines of at most 78 bytes
// where it can, before a space or tab (RFC 5322 2.2.3), and ends it with
// CRLF. Unfolding gives the field back as it was. It reports false when
// a line is still over 998 bytes.
func fold(field string) (folded string, ok bool) {
	var b strings.Builder
	ok = true
	line, name := 0, -1
	for field != "" {
		// The next piece: a run of whitespace, then a word.
		i := 0
		for i < len(field) && (field[i] == ' ' || field[i] == '\t') {
			i++
		}
		j := i
		for j < len(field) && field[j] != ' ' && field[j] != '\t' {
			j++
		}
		piece := field[:j]
		field = field[j:]
		// Fold only before whitespace with a word after it (a line of
		// whitespace alone is not allowed), and not right after the
		// field's name, which would leave it alone on its line.
		if name < 0 {
			name = len(piece)
		} else if line > name && i > 0 && j > i && line+len(piece) > foldLine {
			b.WriteString("\r\n")
			line = 0
		}
		b.WriteString(piece)
		if line += len(piece); line > maxLine {
			ok = false
		}
	}
	b.WriteString("\r\n")
	return b.String(), ok
}

// mustFold folds a field built to fold: a list of addresses, each at
// most 254 bytes, or of encoded-words.
func mustFold(field string) string {
	f, _ := fold(field)
	return f
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
