package main_test

import (
	"fmt"
	"net/http/httptest"
	"testing"

	"github.com/oncehq/once/internal/faultproxy"
)

// TestEmailReviewKeepsCharge loses the SMTP server's final reply to one
// order's email: the message may have been delivered, so its action goes
// to review and the job is dropped for a person to decide. The order's
// charge must not be lost with it: whatever the person decides about the
// email, nothing delivers the job again, so a charge that had not been
// made by then is never made.
func TestEmailReviewKeepsCharge(t *testing.T) {
	mail := startMailbox(t)
	proxy, err := faultproxy.Start(mail.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	// The first email's final reply is lost: the server has queued it.
	lost := proxy.CutAfter([]byte("\r\n.\r\n"), []byte("250"))
	p := &provider{stored: map[string]string{}, charges: map[string]int{}}
	api := httptest.NewServer(p)
	t.Cleanup(api.Close)
	r := start(t, proxy.Addr(), api.URL+"/charges")
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
