package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/oncehq/once"
	"github.com/oncehq/once/natsjs"
	"github.com/oncehq/once/rabbitmq"
)

// Queue names the brokers a run can use.
const (
	QueueNATS     = "nats"
	QueueRabbitMQ = "rabbitmq"
)

// ackWait is the JetStream consumer's AckWait: a stopped worker's
// messages are delivered to another worker after it.
const ackWait = 3 * time.Second

// queueSpec tells a worker where its jobs are.
type queueSpec struct {
	Kind string `json:"kind"`
	URL  string `json:"url"`
	// NATS
	Stream   string `json:"stream,omitempty"`
	Subject  string `json:"subject,omitempty"`
	Consumer string `json:"consumer,omitempty"`
	// RabbitMQ
	Queue string `json:"queue,omitempty"`
}

// job is one intent's message: its index; everything else follows from
// it and the run.
type job struct {
	I int `json:"i"`
}

func encodeJob(i int) []byte { b, _ := json.Marshal(job{I: i}); return b }

// jobOf rebuilds an action's job for a re-drive: the intent's Step is its
// index.
func jobOf(a once.Action) ([]byte, error) {
	if a.Step < 0 || a.Step > 1<<30 {
		return nil, fmt.Errorf("action %s has step %d, not a chaos intent's index", a.Key, a.Step)
	}
	return encodeJob(int(a.Step)), nil
}

// rabbitConfig is the queue configuration the harness declares and every
// worker settles with: the retry queues' names follow from it.
func rabbitConfig(conn *amqp.Connection, name string) rabbitmq.Config {
	return rabbitmq.Config{Conn: conn, Queue: name, MinRetryDelay: 250 * time.Millisecond, MaxRetryDelay: 4 * time.Second, ConfirmTimeout: 3 * time.Second}
}

// jobQueue is the harness's side of the queue: it publishes the jobs,
// re-drives released actions for the reaper, and removes what it made.
type jobQueue interface {
	spec() queueSpec
	publish(ctx context.Context, i int) error
	redrive(ctx context.Context, a once.Action) error
	close(ctx context.Context) error
}

// natsJobs is a stream with a durable consumer the workers share.
type natsJobs struct {
	s  queueSpec
	nc *nats.Conn
	js jetstream.JetStream
	rd func(context.Context, once.Action) error
}

func newNATSJobs(ctx context.Context, url, run string) (*natsJobs, error) {
	nc, err := nats.Connect(url, nats.Name("once chaos "+run), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		return nil, fmt.Errorf("chaos: connecting to NATS at %s: %w", url, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	name := "ONCE_CHAOS_" + strings.ToUpper(strings.ReplaceAll(run, "-", "_"))
	q := &natsJobs{nc: nc, js: js, s: queueSpec{Kind: QueueNATS, URL: url, Stream: name, Subject: "once.chaos." + run + ".jobs", Consumer: "workers"}}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{q.s.Subject}, Storage: jetstream.FileStorage}); err != nil {
		nc.Close()
		return nil, fmt.Errorf("chaos: creating stream %s: %w", name, err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, name, jetstream.ConsumerConfig{
		Durable: q.s.Consumer, AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, MaxDeliver: -1, MaxAckPending: 100000,
	}); err != nil {
		nc.Close()
		return nil, fmt.Errorf("chaos: creating the consumer of stream %s: %w", name, err)
	}
	q.rd = natsjs.Redrive(js, func(a once.Action) (*nats.Msg, error) {
		b, err := jobOf(a)
		if err != nil {
			return nil, err
		}
		return &nats.Msg{Subject: q.s.Subject, Data: b}, nil
	})
	return q, nil
}

func (q *natsJobs) spec() queueSpec { return q.s }

func (q *natsJobs) publish(ctx context.Context, i int) error {
	_, err := q.js.Publish(ctx, q.s.Subject, encodeJob(i), jetstream.WithMsgID("job-"+strconv.Itoa(i)))
	return err
}

func (q *natsJobs) redrive(ctx context.Context, a once.Action) error { return q.rd(ctx, a) }

func (q *natsJobs) close(ctx context.Context) error {
	defer q.nc.Close()
	return q.js.DeleteStream(ctx, q.s.Stream)
}

// rabbitJobs is a work queue with its retry queues. Its connection is
// dialled again when a broker restart closed it.
type rabbitJobs struct {
	s queueSpec

	mu   sync.Mutex
	conn *amqp.Connection
	q    *rabbitmq.Queue
}

func newRabbitJobs(ctx context.Context, url, run string) (*rabbitJobs, error) {
	r := &rabbitJobs{s: queueSpec{Kind: QueueRabbitMQ, URL: url, Queue: "once-chaos-" + run}}
	q, err := r.queue()
	if err != nil {
		return nil, err
	}
	if err := q.Declare(ctx); err != nil {
		r.close(ctx)
		return nil, err
	}
	return r, nil
}

func (r *rabbitJobs) spec() queueSpec { return r.s }

// queue returns the Queue on a live connection, dialling one if needed.
func (r *rabbitJobs) queue() (*rabbitmq.Queue, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conn != nil && !r.conn.IsClosed() {
		return r.q, nil
	}
	conn, err := amqp.DialConfig(r.s.URL, amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)})
	if err != nil {
		return nil, fmt.Errorf("chaos: connecting to RabbitMQ: %w", err)
	}
	q, err := rabbitmq.New(rabbitConfig(conn, r.s.Queue))
	if err != nil {
		conn.Close()
		return nil, err
	}
	r.conn, r.q = conn, q
	return q, nil
}

func (r *rabbitJobs) publish(ctx context.Context, i int) error {
	q, err := r.queue()
	if err != nil {
		return err
	}
	return q.Publish(ctx, amqp.Publishing{ContentType: "application/json", MessageId: "job-" + strconv.Itoa(i), Body: encodeJob(i)})
}

func (r *rabbitJobs) redrive(ctx context.Context, a once.Action) error {
	q, err := r.queue()
	if err != nil {
		return err
	}
	return q.Redrive(func(a once.Action) (amqp.Publishing, error) {
		b, err := jobOf(a)
		return amqp.Publishing{ContentType: "application/json", Body: b}, err
	})(ctx, a)
}

func (r *rabbitJobs) close(context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conn == nil {
		return nil
	}
	var errs []error
	if ch, err := r.conn.Channel(); err == nil {
		for _, name := range append([]string{r.s.Queue}, r.q.RetryQueues()...) {
			if _, err := ch.QueueDelete(name, false, false, false); err != nil {
				errs = append(errs, err)
				break
			}
		}
		ch.Close()
	}
	r.q.Close()
	errs = append(errs, r.conn.Close())
	return errors.Join(errs...)
}

// publishAll publishes every job, a few at a time, trying each again
// until it is confirmed or ctx ends.
func publishAll(ctx context.Context, q jobQueue, n int) error {
	next := make(chan int)
	errc := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range next {
				var err error
				for try := 0; try < 50; try++ {
					pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					err = q.publish(pctx, i)
					cancel()
					if err == nil || ctx.Err() != nil {
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
				if err != nil {
					select {
					case errc <- fmt.Errorf("chaos: publishing job %d: %w", i, err):
					default:
					}
				}
			}
		})
	}
	for i := 0; i < n; i++ {
		select {
		case next <- i:
		case err := <-errc:
			close(next)
			wg.Wait()
			return err
		}
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}
