package view

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Stored text comes from outside: a kind, a target, a provider's error,
// a note an LLM wrote. Shown to a person, on a terminal or a page, it
// may hold line breaks (which forge lines of a trail), escape sequences
// (which set a window's title, clear the screen or hide what follows, in
// a terminal or in a page's source shown in one), and bidi controls
// (which reorder what follows, so that "exe.pdf" reads "fdp.exe"). Each
// is written as its Go escape (\n, \x1b, \u202e): the text stays there
// to read, and nothing in it acts.

// Terminal makes stored text fit to print on one terminal line. JSON
// output needs none of this; its encoder escapes them.
func Terminal(s string) string {
	if !strings.ContainsFunc(s, acts) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if acts(r) {
			b.WriteString(escape(r))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// EscapeControls returns a page with what acts written as Go escapes,
// but for the line breaks and tabs a page's own markup holds; every
// other byte, invalid UTF-8 included, is kept as it is. The console
// runs each page through it.
func EscapeControls(b []byte) []byte {
	var out []byte
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == '\n' || r == '\t' || !acts(r) || r == utf8.RuneError && n == 1 {
			if out != nil {
				out = append(out, b[i:i+n]...)
			}
			i += n
			continue
		}
		if out == nil {
			out = append(make([]byte, 0, len(b)+16), b[:i]...)
		}
		out = append(out, escape(r)...)
		i += n
	}
	if out == nil {
		return b
	}
	return out
}

// escape is r's Go escape, without the quotes: \n, \x1b, \u202e.
func escape(r rune) string {
	q := strconv.QuoteRune(r)
	return q[1 : len(q)-1]
}

// acts reports whether a terminal or a browser does something with r
// rather than show it: control characters (C0, DEL, C1); format
// characters (Unicode Cf: the bidi controls, zero-width spaces and
// joiners, soft hyphens, tags), which reorder text or draw nothing, so
// that two different kinds print as one name; and the line and
// paragraph separators.
func acts(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029'
}
