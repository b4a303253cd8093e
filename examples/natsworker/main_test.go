package main_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/format"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/oncehq/once/lab/mailbox"
)

// TestMainIsShort keeps the example what it claims to be: a worker in
// one screen.
func TestMainIsShort(t *testing.T) {
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(src, []byte("\n")); n >= 100 {
		t.Errorf("main.go is %d lines; keep it under 100", n)
	}
	formatted, err := format.Source(src)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(formatted, src) {
		t.Error("main.go is not gofmt'd")
	}
}

// provider is a loopback payment API that honours Idempotency-Key: a
// key's first call charges, every later call with it gets the stored
// answer. It drops the connection instead of answering the first charge
// it makes, as a reply lost on the network would be.
type provider struct {
	mu        sync.Mutex
	stored    map[string]string
	charges   map[string]int // per customer
	calls     int
	dropFirst bool
}

func (p *provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Customer string
		Amount   int
	}
	key := r.Header.Get("Idempotency-Key")
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || key == "" || body.Customer == "" {
		http.Error(w, "a charge needs a JSON body with a customer and an Idempotency-Key", http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	p.calls++
	answer, seen := p.stored[key]
	drop := false
	if !seen {
		p.charges[body.Customer]++
		answer = fmt.Sprintf(`{"charge":"ch_%s_%d"}`, body.Customer, body.Amount)
		p.stored[key] = answer
		drop, p.dropFirst = p.dropFirst, false
	}
	p.mu.Unlock()
	if drop {
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
		return
	}
	io.WriteString(w, answer)
}

func (p *provider) counts() (charges map[string]int, calls int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	charges = map[string]int{}
	for k, v := range p.charges {
		charges[k] = v
	}
	return charges, p.calls
}

// TestWorker builds the example and runs it as a process against the
// real NATS server, a loopback SMTP server and a loopback payment API;
// every job is published twice, and each must send one email and make
// one charge.
func TestWorker(t *testing.T) {
	mail := startMailbox(t)
	p := &provider{stored: map[string]string{}, charges: map[string]int{}, dropFirst: true}
	api := httptest.NewServer(p)
	t.Cleanup(api.Close)
	r := start(t, mail.Addr(), api.URL+"/charges")
	orders := []string{"ada", "grace", "edsger"}
	publish := func() {
		for i, who := range orders {
			r.publish(t, fmt.Sprintf(`{"id":"order-%d","email":"%s@example.com","customer":"cus_%s","amount":%d}`, i, who, who, 100*(i+1)))
		}
	}
	// Each job twice: once, and again when the first copies are done,
	// as a redelivery after a lost ack would come.
	publish()
	waitFor(t, r.exited, "the first copies done", r.settled(len(orders)))
	publish()
	waitFor(t, r.exited, "the second copies done", r.settled(2*len(orders)))

	msgs := mail.Messages()
	if len(msgs) != len(orders) {
		t.Errorf("%d emails for %d jobs delivered twice; want one each", len(msgs), len(orders))
	}
	for _, who := range orders {
		n := 0
		for _, m := range msgs {
			if len(m.To) == 1 && m.To[0] == who+"@example.com" {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%s got %d emails; want 1", who, n)
		}
	}
	charges, calls := p.counts()
	for _, who := range orders {
		if charges["cus_"+who] != 1 {
			t.Errorf("cus_%s charged %d times; want once (%d calls in all)", who, charges["cus_"+who], calls)
		}
	}
	if calls <= len(orders) {
		t.Errorf("%d calls to the payment API; want the dropped reply's charge retried (same key, charged once)", calls)
	}

	// A graceful stop: SIGTERM, and the worker drains and exits 0.
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-r.exited:
		if err != nil {
			t.Fatalf("the worker exited with %v after SIGTERM; want 0", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the worker did not exit within 30s of SIGTERM")
	}
	if strings.Contains(r.out.String(), "not settled") {
		t.Errorf("a settlement failed:\n%s", r.out.String())
	}
}

// waitFor polls cond until it holds, failing the test if the worker
// exits first or a deadline passes.
func waitFor(t *testing.T, exited <-chan error, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		select {
		case err := <-exited:
			t.Fatalf("the worker exited (%v) while waiting for %s", err, what)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// output collects the worker's output; the process writes it while the
// test reads it.
type output struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

func (o *output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

// startMailbox starts a loopback SMTP server that keeps what it
// accepts, closed when the test ends.
func startMailbox(t *testing.T) *mailbox.Server {
	t.Helper()
	mail, err := mailbox.Start(mailbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mail.Close() })
	return mail
}
