package view

import (
	"strconv"
	"unicode"
	"unicode/utf8"
)

// Escaped reports whether r is written as a Go escape wherever stored text
// is shown to a person: a control character other than a line break or a
// tab (an ESC drives a terminal, a BEL rings it, a C1 control does either
// in some), and the bidirectional overrides and isolates, which make text
// read in an order other than the one it is stored in.
func Escaped(r rune) bool {
	switch {
	case r == '\n' || r == '\t':
		return false
	case unicode.IsControl(r):
		return true
	}
	return r >= 0x202a && r <= 0x202e || r >= 0x2066 && r <= 0x2069
}

// EscapeControls returns b with every rune Escaped reports written as its
// Go escape (\x1b, \a, \u202e); every other byte, invalid UTF-8
// included, is kept as it is. The console runs each page through it, so
// a stored ESC never reaches a browser (or a terminal that shows its
// source) raw.
func EscapeControls(b []byte) []byte {
	i := 0
	for i < len(b) {
		r, n := utf8.DecodeRune(b[i:])
		if Escaped(r) && !(r == utf8.RuneError && n == 1) {
			break
		}
		i += n
	}
	if i == len(b) {
		return b
	}
	out := make([]byte, 0, len(b)+16)
	out = append(out, b[:i]...)
	for i < len(b) {
		r, n := utf8.DecodeRune(b[i:])
		if Escaped(r) && !(r == utf8.RuneError && n == 1) {
			q := strconv.QuoteRune(r)
			out = append(out, q[1:len(q)-1]...)
		} else {
			out = append(out, b[i:i+n]...)
		}
		i += n
	}
	return out
}
