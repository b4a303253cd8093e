package webhook_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/oncehq/once/webhook"
)

var (
	secret = []byte("whsec-0123456789abcdef")
	body   = []byte(`{"id":"k-1-1","type":"awaiting_approval"}`)
	signed = time.Unix(1_700_000_000, 0)
)

// TestWebhookVerify: a signature Sign makes verifies, and each way a
// request can be forged, altered, replayed or garbled is refused with
// the error that says which.
func TestWebhookVerify(t *testing.T) {
	good := webhook.Sign(secret, signed, body)
	if !strings.HasPrefix(good, "t=1700000000,v1=") || len(good) != len("t=1700000000,v1=")+64 {
		t.Fatalf("Sign = %q, want t=<unix>,v1=<64 hex>", good)
	}
	other := webhook.Sign([]byte("another secret"), signed, body)
	_, otherSig, _ := strings.Cut(other, ",")
	_, goodSig, _ := strings.Cut(good, ",")
	tests := []struct {
		name   string
		secret []byte
		header string
		body   []byte
		now    time.Time
		want   error
	}{
		{"as signed", secret, good, body, signed, nil},
		{"within the tolerance", secret, good, body, signed.Add(webhook.DefaultTolerance), nil},
		{"clock behind, within the tolerance", secret, good, body, signed.Add(-webhook.DefaultTolerance), nil},
		{"rotating: the old and the new", secret, good + "," + otherSig, body, signed, nil},
		{"rotating: the new first", secret, "t=1700000000," + otherSig + "," + goodSig, body, signed, nil},
		{"spaces after commas", secret, "t=1700000000, " + goodSig, body, signed, nil},
		{"an unknown scheme beside", secret, good + ",v0=abc", body, signed, nil},
		{"forged: another secret", secret, other, body, signed, webhook.ErrMismatch},
		{"altered body", secret, good, []byte(`{"id":"k-1-1","type":"awaiting_approval "}`), signed, webhook.ErrMismatch},
		{"timestamp changed", secret, "t=1700000001," + goodSig, body, signed, webhook.ErrMismatch},
		{"replayed later", secret, good, body, signed.Add(webhook.DefaultTolerance + time.Second), webhook.ErrTimestamp},
		{"from the future", secret, good, body, signed.Add(-webhook.DefaultTolerance - time.Second), webhook.ErrTimestamp},
		{"empty secret", nil, webhook.Sign(nil, signed, body), body, signed, webhook.ErrNoSecret},
		{"no header", secret, "", body, signed, webhook.ErrMalformed},
		{"no signature", secret, "t=1700000000", body, signed, webhook.ErrMalformed},
		{"no timestamp", secret, goodSig, body, signed, webhook.ErrMalformed},
		{"two timestamps", secret, "t=1700000000,t=1700000000," + goodSig, body, signed, webhook.ErrMalformed},
		{"timestamp not a number", secret, "t=17e8," + goodSig, body, signed, webhook.ErrMalformed},
		{"timestamp with a sign", secret, "t=+1700000000," + goodSig, body, signed, webhook.ErrMalformed},
		{"signature not hex", secret, "t=1700000000,v1=" + strings.Repeat("z", 64), body, signed, webhook.ErrMalformed},
		{"signature short", secret, "t=1700000000,v1=abcd", body, signed, webhook.ErrMalformed},
		{"no equals sign", secret, "t=1700000000,v1", body, signed, webhook.ErrMalformed},
		{"too long", secret, good + strings.Repeat(",x=y", webhook.MaxHeaderBytes), body, signed, webhook.ErrMalformed},
		{"too many signatures", secret, "t=1700000000" + strings.Repeat(","+otherSig, 9) + "," + goodSig, body, signed, webhook.ErrMalformed},
	}
	for _, tt := range tests {
		err := webhook.Verify(tt.secret, tt.header, tt.body, tt.now, 0)
		if tt.want == nil && err != nil || tt.want != nil && !errors.Is(err, tt.want) {
			t.Errorf("%s: Verify = %v, want %v", tt.name, err, tt.want)
		}
	}
	// A tolerance given is the one applied.
	if err := webhook.Verify(secret, good, body, signed.Add(2*time.Second), time.Second); !errors.Is(err, webhook.ErrTimestamp) {
		t.Errorf("2 s late with a tolerance of 1 s: Verify = %v, want ErrTimestamp", err)
	}
}

// FuzzWebhookVerify: no header makes Verify panic or accept a body it
// did not sign, and every header Sign makes verifies.
func FuzzWebhookVerify(f *testing.F) {
	f.Add(webhook.Sign(secret, signed, body), int64(0))
	f.Add("t=1700000000,v1=00", int64(1))
	f.Add(",,,=,t=,v1=", int64(-5))
	f.Fuzz(func(t *testing.T, header string, at int64) {
		if err := webhook.Verify(secret, header, []byte("a body nobody signed"), signed, 0); err == nil {
			t.Fatalf("Verify accepted %q for a body nobody signed", header)
		}
		when := time.Unix(at, 0)
		h := webhook.Sign(secret, when, []byte(header))
		if err := webhook.Verify(secret, h, []byte(header), when, 0); err != nil {
			t.Fatalf("Verify of Sign(%d, %q) = %v", at, header, err)
		}
		if _, err := strconv.ParseInt(strings.TrimPrefix(strings.SplitN(h, ",", 2)[0], "t="), 10, 64); err != nil {
			t.Fatalf("Sign wrote t= that is not a number: %q", h)
		}
	})
}
