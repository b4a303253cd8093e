package rabbitmq_test

import (
	"context"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/rabbitmq"
)

// TestRetryOnHungConnection hangs the publishing connection (the broker
// stops answering; no reset) just before a retry is copied: the copy's
// confirm never comes, and Handle must give up within ConfirmTimeout and
// requeue the job, not wait for the client's heartbeat to notice the dead
// connection.
func TestRetryOnHungConnection(t *testing.T) {
	t.Parallel()
	// warm: a channel waits in the pool, so the copy is written at once;
	// cold: the pool is empty, so opening a channel is what hangs.
	for _, warm := range []bool{true, false} {
		name := "cold"
		if warm {
			name = "warm"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			retryOnHungConnection(t, warm)
		})
	}
}

func retryOnHungConnection(t *testing.T, warm bool) {
	const confirm = 500 * time.Millisecond
	b := setup(t, rabbitmq.Config{MinRetryDelay: 100 * time.Millisecond, MaxRetryDelay: time.Second}, nil)
	proxy, viaProxy := proxied(t, b.url)
	pubConn := dial(t, viaProxy)
	hung, err := rabbitmq.New(rabbitmq.Config{Conn: pubConn, Queue: b.q.Name(), MinRetryDelay: 100 * time.Millisecond, MaxRetryDelay: time.Second, ConfirmTimeout: confirm})
	if err != nil {
		t.Fatal(err)
	}
	defer hung.Close()
	c := consume(t, b, nil, b.q.Name())
	if warm {
		// A publish that goes through first: its channel waits in the pool.
		if err := hung.Publish(context.Background(), job{ID: "warm", To: "x"}.publishing()); err != nil {
			t.Fatal(err)
		}
		c.next(t, 10*time.Second).Ack(false)
	}
	b.publish(t, job{ID: uniqueName(t), To: "ada"})
	d := c.next(t, 10*time.Second)

	proxy.Blackout(true)
	defer func() {
		proxy.Blackout(false)
		proxy.Reset()
	}()
	start := time.Now()
	disp, err := hung.Handle(context.Background(), d, work(b.client, "send_email", func(context.Context, once.Attempt) (string, error) {
		return "", once.RetryLater(errBusy)
	}))
	took := time.Since(start)
	if disp.Action != once.JobRetry || err == nil {
		t.Fatalf("%s (%v); want a retry that could not be queued, requeued", disp.Action, err)
	}
	if took > 5*time.Second {
		t.Fatalf("Handle took %v on a hung publishing connection; ConfirmTimeout is %v", took, confirm)
	}
	if again := c.next(t, 10*time.Second); !again.Redelivered {
		t.Error("the requeued job did not come back as a redelivery")
	} else {
		again.Ack(false)
	}
}
