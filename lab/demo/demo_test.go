package demo_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oncehq/once"
	"github.com/oncehq/once/lab/demo"
	"github.com/oncehq/once/sqlite"
)

func TestMain(m *testing.M) {
	// The demo's workers are this test binary, started again.
	if demo.IsWorker() {
		os.Exit(demo.WorkerMain(os.Stderr))
	}
	os.Exit(m.Run())
}

// TestDemo runs the whole story with real processes, a real SMTP server
// and real SIGKILLs: the naive half sends duplicates, the once half none,
// and nothing is silently lost.
func TestDemo(t *testing.T) {
	intents := 200
	if testing.Short() {
		intents = 40
	}
	db := filepath.Join(t.TempDir(), "once.db")
	rep, err := demo.Run(context.Background(), demo.Options{DB: db, Intents: intents, Workers: 4,
		Progress: func(half string, acked, total, kills int) {
			if os.Getenv("ONCE_DEMO_TRACE") != "" {
				t.Logf("%s %d/%d kills %d", half, acked, total, kills)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", rep)
	if rep.Kills == 0 {
		t.Error("no worker was killed")
	}
	if rep.Naive.Duplicates == 0 {
		t.Error("the naive half sent no duplicate; the kills between send and record should have caused some")
	}
	if rep.Once.Duplicates != 0 || rep.Once.Lost != 0 {
		t.Errorf("once half: %d duplicates, %d lost; want none", rep.Once.Duplicates, rep.Once.Lost)
	}
	if rep.Once.Delivered+rep.Once.Review < intents {
		t.Errorf("once half: %d delivered + %d for review < %d intents", rep.Once.Delivered, rep.Once.Review, intents)
	}
	// The review items are in the database for `once serve` to show.
	if review := reviewed(t, db, rep.Run); len(review) != rep.Once.Review {
		t.Fatalf("store has %d review actions, report says %d", len(review), rep.Once.Review)
	}
	// The demo's own server counted: every count is exact, and the table
	// marks none as a bound.
	for _, h := range []struct {
		name string
		n    demo.Bounds
		c    [3]int
	}{{"naive", rep.Naive.Bounds, [3]int{rep.Naive.Delivered, rep.Naive.Duplicates, rep.Naive.Lost}}, {"once", rep.Once.Bounds, [3]int{rep.Once.Delivered, rep.Once.Duplicates, rep.Once.Lost}}} {
		if h.n.SendsUnknown != 0 || h.n.DeliveredAtMost != h.c[0] || h.n.DuplicatesAtMost != h.c[1] || h.n.LostAtLeast != h.c[2] {
			t.Errorf("%s half counted by the demo's own server is not exact: %+v", h.name, h.n)
		}
	}
	var text strings.Builder
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if !rep.Exact || strings.ContainsAny(text.String(), "≥≤") {
		t.Errorf("exact = %v; the table marks a bound:\n%s", rep.Exact, text.String())
	}
}

// reviewed returns the recipients of the run's actions awaiting review.
func reviewed(t *testing.T, db, run string) map[string]bool {
	t.Helper()
	s, err := sqlite.Open(db, sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	review, err := s.List(context.Background(), once.Filter{Status: once.StatusReview, Run: run, Limit: 100000})
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]bool{}
	for _, a := range review {
		m[a.Target] = true
	}
	return m
}

// TestDemoExternalSMTPBounds sends through an SMTP server the demo does
// not own (--smtp), so it counts from the workers' log, while half the
// deliberate kills land after the server accepted a message and before
// the worker logged it. The server, asked afterwards, says what really
// happened: for both halves, every count the demo calls certain is at
// most what the server accepted, certain plus unknown at least, and the
// printed table marks each count that is only a bound.
func TestDemoExternalSMTPBounds(t *testing.T) {
	intents := 200
	if testing.Short() {
		intents = 40
	}
	srv, err := demo.StartMailServer()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	db := filepath.Join(t.TempDir(), "once.db")
	rep, err := demo.Run(context.Background(), demo.Options{DB: db, SMTP: srv.Addr(), Intents: intents, Workers: 4, KillBeforeLog: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", rep)
	if rep.Exact || rep.Naive.SendsUnknown == 0 || rep.Once.SendsUnknown == 0 {
		t.Errorf("exact = %v, unknown sends naive %d, once %d: the kills before the log left no send unknown",
			rep.Exact, rep.Naive.SendsUnknown, rep.Once.SendsUnknown)
	}
	inReview := reviewed(t, db, rep.Run)
	if len(inReview) != rep.Once.Review {
		t.Fatalf("store has %d review actions, report says %d", len(inReview), rep.Once.Review)
	}
	// What the server really accepted, by the recipient pattern the
	// report gives for searching a server's log.
	type truth struct{ accepted, delivered, duplicates, lost int }
	real := map[string]*truth{}
	for _, half := range []string{"naive", "once"} {
		r := &truth{}
		real[half] = r
		for i := range intents {
			rcpt := strings.Replace(strings.Replace(rep.Recipients, "{naive,once}", half, 1), "-N-", fmt.Sprintf("-%d-", i), 1)
			n := srv.Accepted(rcpt)
			r.accepted += n
			switch {
			case n > 0:
				r.delivered++
				r.duplicates += n - 1
			case !inReview[rcpt]:
				r.lost++
			}
		}
	}
	t.Logf("the server accepted: naive %+v, once %+v", *real["naive"], *real["once"])
	if real["naive"].accepted < intents {
		t.Fatalf("the server accepted %d naive messages for %d intents: the recipients %q do not match what was sent", real["naive"].accepted, intents, rep.Recipients)
	}
	if real["once"].duplicates != 0 {
		t.Errorf("the server received %d duplicates from the once half", real["once"].duplicates)
	}

	halves := []struct {
		name       string
		label      string
		b          demo.Bounds
		delivered  int
		duplicates int
		lost       int
	}{
		{"naive", "check, then send", rep.Naive.Bounds, rep.Naive.Delivered, rep.Naive.Duplicates, rep.Naive.Lost},
		{"once", "once", rep.Once.Bounds, rep.Once.Delivered, rep.Once.Duplicates, rep.Once.Lost},
	}
	for _, h := range halves {
		r := real[h.name]
		within := func(what string, low, got, high int) {
			t.Helper()
			if got < low || got > high {
				t.Errorf("%s half: the server's %s is %d, outside the demo's range %d to %d", h.name, what, got, low, high)
			}
		}
		within("accepted messages", h.b.SendsAccepted, r.accepted, h.b.SendsAccepted+h.b.SendsUnknown)
		within("delivered intents", h.delivered, r.delivered, h.b.DeliveredAtMost)
		within("duplicates", h.duplicates, r.duplicates, h.b.DuplicatesAtMost)
		within("silently lost intents", h.b.LostAtLeast, r.lost, h.lost)
	}
	// The naive half's first sends to the jobs killed before the log are
	// duplicates only the server saw: the demo cannot claim them, and must
	// say that its count is a lower bound.
	if rep.Naive.DuplicatesAtMost <= rep.Naive.Duplicates {
		t.Fatalf("naive duplicates %d, at most %d: the unlogged sends widened no range", rep.Naive.Duplicates, rep.Naive.DuplicatesAtMost)
	}

	var text strings.Builder
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	out := text.String()
	t.Logf("\n%s", out)
	for _, h := range halves {
		var row []string
		for _, line := range strings.Split(out, "\n") {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), h.label+" "); ok {
				row = strings.Fields(rest)
			}
		}
		if len(row) != 5 {
			t.Fatalf("no table row for %q in:\n%s", h.label, out)
		}
		want := func(col string, got string, n, other int, explained string) {
			t.Helper()
			switch {
			case other > n && got != fmt.Sprintf("≥%d", n):
				t.Errorf("%s %s: the table shows %q; it is a lower bound (%d to %d) and must say so", h.label, col, got, n, other)
			case other < n && got != fmt.Sprintf("≤%d", n):
				t.Errorf("%s %s: the table shows %q; it is an upper bound (%d to %d) and must say so", h.label, col, got, other, n)
			case other == n && got != fmt.Sprint(n):
				t.Errorf("%s %s: the table shows %q for an exact %d", h.label, col, got, n)
			}
			if other != n && !strings.Contains(out, explained) {
				t.Errorf("%s %s: the range is not spelled out (%q) in:\n%s", h.label, col, explained, out)
			}
		}
		want("delivered", row[1], h.delivered, h.b.DeliveredAtMost, fmt.Sprintf("delivered ≥ %d (up to %d)", h.delivered, h.b.DeliveredAtMost))
		want("duplicates", row[2], h.duplicates, h.b.DuplicatesAtMost, fmt.Sprintf("duplicates ≥ %d (up to %d)", h.duplicates, h.b.DuplicatesAtMost))
		want("silently lost", row[4], h.lost, h.b.LostAtLeast, fmt.Sprintf("silently lost ≤ %d (at least %d)", h.lost, h.b.LostAtLeast))
		if !strings.Contains(out, fmt.Sprintf("  %s: %d sends whose reply no worker logged, so ", h.label, h.b.SendsUnknown)) {
			t.Errorf("%s: the %d unknown sends are not reported in:\n%s", h.label, h.b.SendsUnknown, out)
		}
	}
	if !strings.Contains(out, "≥ marks a lower bound") || !strings.Contains(out, rep.Recipients) {
		t.Errorf("the text does not say what the marks mean or where the exact counts are:\n%s", out)
	}
}

// TestDemoSMTPNotThere: an --smtp address where no server answers is
// refused with a clear error before anything is written, instead of
// workers retrying their sends until the half times out.
func TestDemoSMTPNotThere(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	db := filepath.Join(t.TempDir(), "once.db")
	for _, bad := range []string{addr, "no-port"} {
		_, err := demo.Run(context.Background(), demo.Options{DB: db, SMTP: bad, Intents: 10})
		if err == nil || !strings.Contains(err.Error(), "--smtp") {
			t.Errorf("--smtp %s: err = %v; want an error naming --smtp", bad, err)
		}
	}
	if _, err := os.Stat(db); !os.IsNotExist(err) {
		t.Errorf("a refused demo created %s (%v)", db, err)
	}
}

// TestReportTextMarksBounds: a count that is an upper bound (silently
// lost, when a send nobody logged may have delivered the intent) is
// marked ≤ and spelled out, an exact one is left alone, and one unknown
// send is one send.
func TestReportTextMarksBounds(t *testing.T) {
	rep := demo.Report{Intents: 10, Workers: 2, SMTP: "127.0.0.1:2525", Counted: "the workers' log of the server's replies",
		Recipients: "{naive,once}-N-x@demo.once.localhost",
		Naive:      demo.Naive{Delivered: 10, Duplicates: 2, Bounds: demo.Bounds{SendsAccepted: 12, DeliveredAtMost: 10, DuplicatesAtMost: 2}},
		Once: demo.Once{Delivered: 8, Review: 1, Lost: 1, Bounds: demo.Bounds{SendsAccepted: 8, SendsUnknown: 1,
			DeliveredAtMost: 9, LostAtLeast: 0}}}
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"   check, then send        10          10            2            -               0\n",
		"               once        10          ≥8            0            1              ≤1\n",
		"not by the server: 1 send has\n",
		"  once: 1 send whose reply no worker logged, so delivered ≥ 8 (up to 9), silently lost ≤ 1 (at least 0)\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the text lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "check, then send: ") {
		t.Errorf("the text gives a range for the exact naive half:\n%s", out)
	}
}
