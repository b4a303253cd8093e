package main_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"testing"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/faultproxy"
	"github.com/oncehq/once/lab/mailbox"
	"github.com/oncehq/once/sqlite"
)

// startReplyLost starts the example against a mailbox behind a proxy
// that loses the final reply to the first email (the server has queued
// it) and a provider: the mailbox, the provider, the run, and a channel
// closed when a reply was lost.
func startReplyLost(t *testing.T) (*mailbox.Server, *provider, *run, <-chan struct{}) {
	t.Helper()
	mail := startMailbox(t)
	proxy, err := faultproxy.Start(mail.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	lost := proxy.CutAfter([]byte("\r\n.\r\n"), []byte("250"))
	p := &provider{stored: map[string]string{}, charges: map[string]int{}}
	api := httptest.NewServer(p)
	t.Cleanup(api.Close)
	return mail, p, start(t, proxy.Addr(), api.URL+"/charges"), lost
}

// TestEmailReviewKeepsCharge loses the SMTP server's final reply to one
// order's email: the message may have been delivered, so its action goes
// to review and the job is dropped for a person to decide. The order's
// charge must not be lost with it: whatever the person decides about the
// email, nothing delivers the job again, so a charge that had not been
// made by then is never made.
func TestEmailReviewKeepsCharge(t *testing.T) {
	_, p, r, lost := startReplyLost(t)
	orders := []string{"ada", "grace", "edsger"}
	for i, who := range orders {
		r.publish(t, fmt.Sprintf(`{"id":"order-%d","email":"%s@example.com","customer":"cus_%s","amount":%d}`, i, who, who, 100*(i+1)))
	}
	waitFor(t, r.exited, "every job settled", r.settled(len(orders)))
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

// TestRetryAfterReviewSendsAgain resolves the email in review with
// Retry, as a person who checked the mail log and found nothing would.
// The worker's own reaper must publish the order again (before, the
// example ran no reaper and set no Redrive, so a Retry never ran): the
// charge replays, and the email is sent on the re-driven job.
func TestRetryAfterReviewSendsAgain(t *testing.T) {
	mail, p, r, lost := startReplyLost(t)
	r.publish(t, `{"id":"order-9","email":"ada@example.com","customer":"cus_ada","amount":900}`)
	waitFor(t, r.exited, "the job settled", r.settled(1))
	<-lost

	store, err := sqlite.Open(r.dbPath, sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	client, err := once.New(once.Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	inReview, err := client.List(ctx, once.Filter{Status: once.StatusReview})
	if err != nil || len(inReview) != 1 || inReview[0].Kind != "send_email" {
		t.Fatalf("in review: %+v (%v); want the one email", inReview, err)
	}
	a := inReview[0]
	if _, err := client.Resolve(ctx, a.Key, once.Resolution{Decision: once.DecisionRetry, By: "ops", Note: "not in the mail log", Attempt: a.Attempt}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, r.exited, "the re-driven order settled", r.settled(2))
	waitFor(t, r.exited, "the email sent again", func() bool {
		got, err := client.Get(ctx, a.Key)
		return err == nil && got.Status == once.StatusSucceeded
	})
	if n := len(mail.Messages()); n != 2 {
		t.Errorf("%d emails; want 2: the one whose reply was lost, and the person's Retry", n)
	}
	if charges, _ := p.counts(); charges["cus_ada"] != 1 {
		t.Errorf("cus_ada charged %d times; want once: the re-driven order replays its charge", charges["cus_ada"])
	}
}
