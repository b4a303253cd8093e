package main_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncehq/once/internal/faultproxy"
	"github.com/oncehq/once/internal/smtptest"
	"github.com/oncehq/once/internal/testdb"
)

// TestEmailReviewKeepsCharge loses the SMTP server's final reply to one
// order's email: the message may have been delivered, so its action goes
// to review and the job is dropped for a person to decide. The order's
// charge must not be lost with it: whatever the person decides about the
// email, nothing delivers the job again, so a charge that had not been
// made by then is never made.
func TestEmailReviewKeepsCharge(t *testing.T) {
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
	proxy, err := faultproxy.Start(mail.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	// The first email's final reply is lost: the server has queued it.
	lost := proxy.CutAfter([]byte("\r\n.\r\n"), []byte("250"))
	p := &provider{stored: map[string]string{}, charges: map[string]int{}}
	api := httptest.NewServer(p)
	defer api.Close()
	_, js := testdb.NATS(t)
	stream := testdb.NATSStream(t, js, jetstream.StreamConfig{}).CachedInfo().Config.Name

	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(),
		"NATS_URL="+url, "SMTP_ADDR="+proxy.Addr(), "PROVIDER_URL="+api.URL+"/charges",
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
	orders := []string{"ada", "grace", "edsger"}
	for i, who := range orders {
		data := fmt.Sprintf(`{"id":"order-%d","email":"%s@example.com","customer":"cus_%s","amount":%d}`, i, who, who, 100*(i+1))
		if _, err := js.Publish(ctx, stream+".orders", []byte(data)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, exited, "every job settled", func() bool {
		i, err := cons.Info(ctx)
		return err == nil && i.Delivered.Stream == uint64(len(orders)) && i.NumAckPending == 0 && i.NumPending == 0
	})
	select {
	case <-lost:
	default:
		t.Fatal("no email's final reply was lost")
	}
	charges, _ := p.counts()
	for _, who := range orders {
		if charges["cus_"+who] != 1 {
			t.Errorf("cus_%s charged %d times; want once: every job is settled, so a charge not made now is never made", who, charges["cus_"+who])
		}
	}
}
