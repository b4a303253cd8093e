package main

import (
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestPausedPastLease stops the process (SIGSTOP) after it wrote a
// charge and before it answered, for longer than the claim's lease. A
// second process takes the client's retry over and answers the charge.
// When the first process runs again (SIGCONT), the request it still
// holds must be answered with the charge that exists too, not with a 5xx
// that says the charge was interrupted.
func TestPausedPastLease(t *testing.T) {
	t.Parallel()
	db := postgresDB(t)
	p := start(t, db, "--hold-after-charge", "10m")
	key := newKey()
	type result struct {
		a   answer
		err error
	}
	posted := make(chan result, 1)
	go func() {
		a, err := send(http.MethodPost, p.base+"/charges", key, "", adaBody)
		posted <- result{a, err}
	}()
	var written []charge
	for deadline := time.Now().Add(time.Minute); len(written) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the charge was not written within a minute")
		}
		written = p.charges(t, "")
	}
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	t.Cleanup(func() {
		if stopped {
			p.cmd.Process.Signal(syscall.SIGCONT)
		}
	})

	p2 := start(t, db)
	var retried answer
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		retried = p2.post(t, key, "", adaBody)
		if retried.status != http.StatusConflict {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the paused claim was not taken over within a minute")
		}
	}
	if retried.status != http.StatusCreated || retried.charge(t) != written[0] {
		t.Fatalf("retry on the second process: %d %s; want 201 with the charge written, %+v", retried.status, retried.body, written[0])
	}

	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	var first result
	select {
	case first = <-posted:
	case <-time.After(time.Minute):
		t.Fatal("the resumed process did not answer its request within a minute")
	}
	if first.err != nil {
		t.Fatalf("the resumed process's request: %v", first.err)
	}
	if first.a.status != http.StatusCreated || first.a.charge(t) != written[0] {
		code := ""
		if strings.HasPrefix(first.a.header.Get("Content-Type"), "application/problem+json") {
			code = first.a.code(t)
		}
		t.Fatalf("the resumed process answered %d %s %s; want 201 with the charge that exists, %+v", first.a.status, code, first.a.body, written[0])
	}
	if list := p2.charges(t, ""); len(list) != 1 {
		t.Fatalf("charges: %+v; want one", list)
	}
	if a := p2.post(t, key, "", adaBody); !a.replayed() || a.body != retried.body {
		t.Fatalf("repeat: %d replayed=%v %s; want the recorded answer", a.status, a.replayed(), a.body)
	}
}
