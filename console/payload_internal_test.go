package console

import (
	"strings"
	"testing"
)

// TestShowPayloadDropsASplitRune: a page cuts a payload at maxShown
// bytes; when the bound falls inside a rune, the page shows the text
// before it, not a hex dump of text that is valid but for its last
// bytes.
func TestShowPayloadDropsASplitRune(t *testing.T) {
	p := []byte(strings.Repeat("a", maxShown-1) + "é and more")
	v := showPayload(p)
	if v.Format != "text" || v.Text != strings.Repeat("a", maxShown-1) || v.Cut != len(p)-maxShown || v.Size != len(p) {
		t.Errorf("a %d-byte payload cut inside a rune: format %q, %d bytes of text, %d cut, size %d; want text of %d bytes, %d cut", len(p), v.Format, len(v.Text), v.Cut, v.Size, maxShown-1, len(p)-maxShown)
	}
}
