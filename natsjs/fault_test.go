package natsjs_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/brokertest/natstest"
	"github.com/oncehq/once/internal/faultproxy"
	"github.com/oncehq/once/natsjs"
)

// viaProxy connects to the test server through a fault proxy, so a test
// can lose a reply or hang the connection at a chosen moment.
func viaProxy(t *testing.T) (*faultproxy.Proxy, jetstream.JetStream) {
	t.Helper()
	u, err := url.Parse(natstest.Require(t))
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	nc, err := nats.Connect("nats://"+p.Addr(), nats.ReconnectWait(20*time.Millisecond), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return p, js
}

// TestRedrivePubAckLost loses the stream's answer to a re-drive: the
// hook reports the failure, the reaper's next try publishes the same
// attempt again, and the duplicate window absorbs it, so the job is in
// the stream once.
func TestRedrivePubAckLost(t *testing.T) {
	t.Parallel()
	_, direct := natstest.Connect(t)
	s := natstest.Stream(t, direct, jetstream.StreamConfig{})
	subject := s.CachedInfo().Config.Name + ".jobs"
	p, js := viaProxy(t)
	redrive := natsjs.Redrive(js, func(a once.Action) (*nats.Msg, error) {
		return &nats.Msg{Subject: subject, Data: []byte(a.Run)}, nil
	})
	a := once.Action{Key: once.Key(strings.Repeat("cd", 32)), Run: "order-11", Attempt: 3}

	cut := p.CutAfter([]byte(natsjs.RedriveMsgID(a)), []byte(`"seq"`))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	err := redrive(ctx, a)
	cancel()
	if err == nil {
		t.Fatal("the re-drive whose PubAck was lost reported success")
	}
	<-cut
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := redrive(ctx, a); err != nil {
		t.Fatalf("the reaper's next try: %v", err)
	}
	i, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if i.State.Msgs != 1 {
		t.Fatalf("the stream holds %d messages; want the re-drive once", i.State.Msgs)
	}
}

// TestAckConfirmationLost loses, then hangs, the server's confirmation
// of an ack: Handle reports the ack as not settled, and the server has
// the ack all the same, so nothing is delivered again.
func TestAckConfirmationLost(t *testing.T) {
	t.Parallel()
	for _, hang := range []bool{false, true} {
		name := "cut"
		if hang {
			name = "hang"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, jetstream.ConsumerConfig{}, once.Config{})
			p, js := viaProxy(t)
			cons, err := js.Consumer(context.Background(), b.stream, "worker")
			if err != nil {
				t.Fatal(err)
			}
			w, err := natsjs.New(js, natsjs.Config{AckTimeout: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			b.publish(t, job{ID: "order-12", Customer: "cus_12", Amount: 1200})
			msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
			if err != nil {
				t.Fatal(err)
			}
			arm := p.CutAfter
			if hang {
				arm = p.HangAfter
			}
			lost := arm([]byte("+ACK"), []byte("_INBOX."))
			d, err := w.Handle(context.Background(), msg, func(context.Context, jetstream.Msg) error { return nil })
			var se *natsjs.SettleError
			if d.Action != once.JobAck || !errors.As(err, &se) || se.Action != once.JobAck {
				t.Fatalf("settled %v with %v; want an ack reported as not settled", d.Action, err)
			}
			<-lost
			i := b.settledAll(t, 1)
			if i.NumRedelivered != 0 {
				t.Fatalf("%d redelivered; want none: the server took the ack", i.NumRedelivered)
			}
			if hang {
				p.Reset() // let the client reconnect before the test closes it
			}
		})
	}
}
