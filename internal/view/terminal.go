package view

import (
	"strconv"
	"strings"
	"unicode"
)

// Terminal makes stored text fit to print on a terminal line. A kind, a
// target, a provider's error or a note comes from outside, and may hold
// line breaks and tabs (which would forge lines of a trail), escape
// sequences (which set the window's title, clear the screen or hide
// what follows), bidi controls (which reorder what follows, so that
// "exe.pdf" reads "fdp.exe"), and characters drawn as nothing (which
// make one kind read as another). Each of those is written as a Go escape
// (\n, \x1b, \u202e): the text stays there to read, and nothing in it
// acts. JSON output needs none of this; its encoder escapes them.
func Terminal(s string) string {
	if !strings.ContainsFunc(s, acts) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if acts(r) {
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// acts reports whether a terminal does something with r rather than
// show it: control characters (C0, DEL, C1), format characters (the
// bidi controls U+061C, U+200E, U+200F, U+202A–U+202E, U+2066–U+2069,
// and those drawn as nothing, so that "charge\u200b" would read as
// "charge": zero-width spaces and joiners, U+2060, U+FEFF, the soft
// hyphen, tag characters), and the line and paragraph separators.
func acts(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029'
}
