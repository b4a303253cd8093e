package cli

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// bar draws a one-line progress bar on a terminal's standard error. It
// redraws at most ten times a second, so long work is not slowed by it.
type bar struct {
	mu    sync.Mutex
	w     io.Writer
	label string
	total int
	last  time.Time
	drawn bool
}

// newBar returns a bar that draws only when w is a terminal: a log file
// or a pipe gets no carriage returns and escape codes.
func newBar(w io.Writer, label string, total int) *bar {
	b := &bar{w: w, label: label, total: max(total, 1)}
	if f, ok := w.(*os.File); !ok || !isTerminal(f) {
		b.w = io.Discard
	}
	return b
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func (b *bar) set(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if time.Since(b.last) < 100*time.Millisecond && n < b.total {
		return
	}
	b.last = time.Now()
	b.draw(n, "")
}

// update draws n of total under label, with a note after the bar.
func (b *bar) update(label string, n int, note string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.label = label
	if time.Since(b.last) < 100*time.Millisecond {
		return
	}
	b.last = time.Now()
	b.draw(n, note)
}

func (b *bar) draw(n int, note string) {
	const width = 30
	n = min(n, b.total)
	full := width * n / b.total
	fmt.Fprintf(b.w, "\r%-10s [%s%s] %d/%d %s\033[K", b.label, strings.Repeat("#", full), strings.Repeat(".", width-full), n, b.total, note)
	b.drawn = true
}

func (b *bar) finish() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.drawn {
		fmt.Fprint(b.w, "\r\033[K")
	}
}
