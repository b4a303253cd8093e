package natsjs

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

func TestTermReasonSupported(t *testing.T) {
	for v, want := range map[string]bool{
		"2.9.10": false, "2.10.3": false, "2.10.4": true, "2.10.22": true, "2.11.0": true, "3.0.0": true,
		"v2.10.4": true, "2.10.4-beta.1": true, "2.10.3-RC.2": false, "": false, "2.10": false, "x.y.z": false,
	} {
		if got := termReasonSupported(v); got != want {
			t.Errorf("termReasonSupported(%q) = %v, want %v", v, got, want)
		}
	}
}

func TestBackoff(t *testing.T) {
	w := &Worker{cfg: Config{RetryDelay: time.Second, MaxRetryDelay: 5 * time.Second}}
	for n, want := range map[uint64]time.Duration{0: time.Second, 1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 4: 5 * time.Second, 1 << 40: 5 * time.Second} {
		if got := w.backoff(n); got != want {
			t.Errorf("backoff(%d) = %v, want %v", n, got, want)
		}
	}
}

func TestProgressFor(t *testing.T) {
	for _, tc := range []struct {
		c    jetstream.ConsumerConfig
		want time.Duration
	}{
		{jetstream.ConsumerConfig{}, 10 * time.Second}, // the server's default AckWait, 30s
		{jetstream.ConsumerConfig{AckWait: 3 * time.Second}, time.Second},
		{jetstream.ConsumerConfig{AckWait: time.Minute, BackOff: []time.Duration{6 * time.Second, time.Minute}}, 2 * time.Second},
		{jetstream.ConsumerConfig{AckWait: time.Nanosecond}, time.Millisecond},
	} {
		if got := progressFor(tc.c); got != tc.want {
			t.Errorf("progressFor(AckWait %v, BackOff %v) = %v, want %v", tc.c.AckWait, tc.c.BackOff, got, tc.want)
		}
	}
}
