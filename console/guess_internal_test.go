package console

import (
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"
)

// TestGuessTableIsBounded: more addresses sending wrong tokens than the
// table holds do not grow it; the addresses beyond it share one bucket,
// which they spend together, and addresses whose buckets refilled are
// forgotten to make room. A right token (right=true) asks the wait
// without spending an attempt.
func TestGuessTableIsBounded(t *testing.T) {
	g := newGuessLimit()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range guessAddrs + 500 {
		addr := fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
		for range guessBurst {
			g.attempt(log, addr, "header", false, now)
		}
	}
	if n := len(g.addrs); n > guessAddrs {
		t.Fatalf("the table holds %d addresses, over its bound of %d", n, guessAddrs)
	}
	if g.attempt(log, "192.0.2.1", "header", true, now) == 0 {
		t.Errorf("a new address, with the table full of limited ones, is not limited by the shared bucket")
	}
	if g.attempt(log, "10.0.0.1", "header", true, now) == 0 {
		t.Errorf("an address that spent its attempts is not limited")
	}
	later := now.Add(guessBurst * guessEvery)
	if d := g.attempt(log, "10.0.0.1", "header", true, later); d != 0 {
		t.Errorf("after its bucket refilled, an address still waits %s", d)
	}
	g.attempt(log, "192.0.2.1", "header", false, later)
	if _, ok := g.addrs["192.0.2.1"]; !ok || len(g.addrs) > guessAddrs {
		t.Errorf("with refilled addresses forgotten, a new one has no bucket of its own (table of %d)", len(g.addrs))
	}
}
