package main_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncehq/once/internal/smtptest"
	"github.com/oncehq/once/internal/testdb"
)

// TestChargeKeyInFlight has the payment API answer a charge with 409, as
// an API behind idemhttp.Middleware (or Stripe) does while an earlier
// request with the same Idempotency-Key is still being processed: an
// attempt that was taken over while its request was still out. This
// request was refused, and the first may yet charge; the charge is not
// known to have failed, so it must not be recorded as failed for good
// (and the job terminated): the next delivery asks again with the same
// key and gets the charge.
func TestChargeKeyInFlight(t *testing.T) {
	url := testdb.RequireNATS(t)
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("building the example needs the go command: %v", err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "natsworker")
	if out, err := exec.Command(goBin, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	mail := smtptest.Start(t)
	p := &provider{stored: map[string]string{}, charges: map[string]int{}}
	var mu sync.Mutex
	inFlight := map[string]bool{}
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		first := !inFlight[key]
		inFlight[key] = true
		mu.Unlock()
		if first {
			// The key's first request is still being processed elsewhere.
			w.Header().Set("Content-Type", "application/problem+json")
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusConflict)
			fmt.Fprint(w, `{"type":"key-in-flight","title":"a request with this Idempotency-Key is still being processed; wait for it to finish and retry"}`)
			return
		}
		p.ServeHTTP(w, r)
	}))
	defer api.Close()
	_, js := testdb.NATS(t)
	stream := testdb.NATSStream(t, js, jetstream.StreamConfig{}).CachedInfo().Config.Name

	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(),
		"NATS_URL="+url, "SMTP_ADDR="+mail.Addr(), "PROVIDER_URL="+api.URL+"/charges",
		"ONCE_DB="+filepath.Join(dir, "once.db"), "STREAM="+stream)
	out := &output{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		cmd.Process.Kill()
		if t.Failed() {
			t.Logf("worker output:\n%s", out.String())
		}
	}()

	ctx := context.Background()
	var cons jetstream.Consumer
	waitFor(t, exited, "the worker to create its consumer", func() bool {
		cons, err = js.Consumer(ctx, stream, "natsworker")
		return err == nil
	})
	if _, err := js.Publish(ctx, stream+".orders", []byte(`{"id":"order-409","email":"ada@example.com","customer":"cus_ada","amount":100}`)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, exited, "the job settled", func() bool {
		i, err := cons.Info(ctx)
		return err == nil && i.Delivered.Stream == 1 && i.NumAckPending == 0 && i.NumPending == 0
	})
	if charges, calls := p.counts(); charges["cus_ada"] != 1 {
		t.Errorf("cus_ada charged %d times (%d charge calls after the 409); want once", charges["cus_ada"], calls)
	}
	if n := len(mail.Messages()); n != 1 {
		t.Errorf("%d emails; want the order confirmed once", n)
	}
}
