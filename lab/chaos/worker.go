package chaos

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/oncehq/once"
	"github.com/oncehq/once/idemhttp"
	"github.com/oncehq/once/internal/dburl"
	"github.com/oncehq/once/natsjs"
	"github.com/oncehq/once/rabbitmq"
	"github.com/oncehq/once/smtpsend"
)

// A worker is this same binary (the once command, or a test binary),
// started with envWorker holding its configuration as JSON; main hands
// control to WorkerMain before it parses any flags.
const envWorker = "ONCE_CHAOS_WORKER"

// workerConfig is what a worker process is told.
type workerConfig struct {
	Slot   int       `json:"slot"`
	Run    string    `json:"run"`
	RunTag string    `json:"run_tag"`
	Naive  bool      `json:"naive"`
	Queue  queueSpec `json:"queue"`
	// DB is the ledger's URL (once_schema set), through the fault
	// proxies, with the worker's application_name.
	DB string `json:"db"`
	// NaiveDB and NaiveTable are the naive worker's "sent" table.
	NaiveDB       string `json:"naive_db,omitempty"`
	NaiveTable    string `json:"naive_table,omitempty"`
	SMTP          string `json:"smtp"`
	Payments      string `json:"payments"`
	Posts         string `json:"posts"`
	Lease         string `json:"lease"`
	EffectTimeout string `json:"effect_timeout"`
	Concurrency   int    `json:"concurrency"`
}

// IsWorker reports whether this process was started by the harness, as
// a worker or as the guard of a broker: then WorkerMain must run instead
// of the program.
func IsWorker() bool { return os.Getenv(envWorker) != "" || os.Getenv(envGuard) != "" }

// WorkerMain runs a worker until it is killed or sent SIGTERM (or a
// broker's guard until the broker exits), and returns the process's exit
// code.
func WorkerMain(stderr io.Writer) int {
	if os.Getenv(envGuard) != "" {
		return guardMain(os.Stdout, stderr)
	}
	var cfg workerConfig
	if err := json.Unmarshal([]byte(os.Getenv(envWorker)), &cfg); err != nil {
		fmt.Fprintln(stderr, "chaos worker: bad configuration in "+envWorker+":", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := runWorker(ctx, cfg, stderr); err != nil && ctx.Err() == nil {
		fmt.Fprintf(stderr, "chaos worker %d: %v\n", cfg.Slot, err)
		return 1
	}
	return 0
}

type worker struct {
	cfg     workerConfig
	pid     string
	http    *http.Client
	timeout time.Duration
	client  *once.Client
	naive   *pgxpool.Pool
	log     *slog.Logger
}

func runWorker(ctx context.Context, cfg workerConfig, stderr io.Writer) error {
	lease, err := time.ParseDuration(cfg.Lease)
	if err != nil {
		return fmt.Errorf("lease %q: %w", cfg.Lease, err)
	}
	timeout, err := time.ParseDuration(cfg.EffectTimeout)
	if err != nil {
		return fmt.Errorf("effect timeout %q: %w", cfg.EffectTimeout, err)
	}
	level := slog.LevelError
	if os.Getenv("ONCE_CHAOS_TRACE") != "" {
		level = slog.LevelDebug
	}
	w := &worker{
		cfg:     cfg,
		pid:     strconv.Itoa(os.Getpid()),
		timeout: timeout,
		http:    &http.Client{Timeout: timeout, Transport: &idemhttp.Transport{}},
		log:     slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})),
	}
	if cfg.Naive {
		pool, err := retryOpen(ctx, func(ctx context.Context) (*pgxpool.Pool, error) {
			p, err := pgxpool.New(ctx, cfg.NaiveDB)
			if err == nil {
				if err = p.Ping(ctx); err != nil {
					p.Close()
				}
			}
			return p, err
		})
		if err != nil {
			return err
		}
		defer pool.Close()
		w.naive = pool
	} else {
		s, err := retryOpen(ctx, func(ctx context.Context) (*dburl.Store, error) { return dburl.Open(ctx, cfg.DB) })
		if err != nil {
			return err
		}
		defer s.Close()
		w.client, err = once.New(once.Config{
			Store:         s,
			Kinds:         policies(lease, w.verify, nil),
			ClaimTimeout:  2 * time.Second,
			RecordTimeout: 5 * time.Second,
			Origin:        fmt.Sprintf("chaos-worker-%d-pid-%s", cfg.Slot, w.pid),
			Logger:        w.log,
		})
		if err != nil {
			return err
		}
	}
	switch cfg.Queue.Kind {
	case QueueNATS:
		return w.consumeNATS(ctx)
	case QueueRabbitMQ:
		return w.consumeRabbitMQ(ctx)
	}
	return fmt.Errorf("unknown queue %q", cfg.Queue.Kind)
}

// retryOpen opens what open opens, trying again for half a minute: a
// worker restarted while the database is cut off waits for it.
func retryOpen[T any](ctx context.Context, open func(context.Context) (T, error)) (T, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		octx, cancel := context.WithTimeout(ctx, 5*time.Second)
		v, err := open(octx)
		cancel()
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) {
			return v, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// policies are the three kinds' policies, one recovery each; the
// harness's client adds the re-drive hook, the workers do not need it.
func policies(lease time.Duration, verify once.Verifier, redrive func(context.Context, once.Action) error) map[string]once.KindPolicy {
	base := once.KindPolicy{Lease: lease, MaxExecution: 5 * time.Second, Redrive: redrive, RedriveAfter: time.Second}
	email, charge, post := base, base, base
	email.Recovery = once.AskPerson
	charge.Recovery = once.RetryWithProviderKey
	post.Recovery = once.VerifyThenDecide
	post.Verifier = verify
	post.VerifyBackoff = 500 * time.Millisecond
	post.MaxVerifyFailures = 20
	return map[string]once.KindPolicy{kindEmail: email, kindCharge: charge, kindPost: post}
}

// intent is intent i of the run.
func intent(run, runTag string, i int) once.Intent {
	in := once.Intent{Run: run, Step: int64(i), Kind: kindOf(i)}
	switch in.Kind {
	case kindEmail:
		in.Target = recipient(i, runTag)
		in.Payload = map[string]any{"subject": fmt.Sprintf("Your receipt #%d", i)}
	case kindCharge:
		in.Target = fmt.Sprintf("cus_%d", i)
		in.Payload = map[string]any{"amount": amount(i), "currency": "eur"}
	default:
		in.Target = fmt.Sprintf("channel-%d", i%7)
		in.Payload = map[string]any{"text": fmt.Sprintf("Order %d shipped", i)}
	}
	return in
}

func amount(i int) int64 { return 100 + int64(i%900) }

// handle runs job i and returns what decides its settlement.
func (w *worker) handle(ctx context.Context, i int) error {
	if w.naive != nil {
		return w.handleNaive(ctx, i)
	}
	in := intent(w.cfg.Run, w.cfg.RunTag, i)
	var err error
	switch in.Kind {
	case kindEmail:
		_, err = once.Do(ctx, w.client, in, func(ctx context.Context, a once.Attempt) (string, error) {
			return w.sender().Send(ctx, a, w.message(i))
		})
	case kindCharge:
		_, err = once.Do(ctx, w.client, in, func(ctx context.Context, a once.Attempt) (string, error) {
			return w.charge(idemhttp.WithKey(ctx, a.ProviderKey), i)
		})
	default:
		_, err = once.Do(ctx, w.client, in, func(ctx context.Context, a once.Attempt) (string, error) {
			return w.post(ctx, string(a.Key), i)
		})
	}
	if err != nil {
		w.log.Debug("job", "i", i, "kind", in.Kind, "disposition", once.Dispose(err).Action.String(), "err", err)
	}
	return err
}

// handleNaive is the seed's "check, then send, then record", with no
// claim: two deliveries both pass the check, and a worker killed between
// the send and the record leaves a job that sends again.
func (w *worker) handleNaive(ctx context.Context, i int) error {
	var sent bool
	if err := w.naive.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+w.cfg.NaiveTable+` WHERE intent = $1)`, i).Scan(&sent); err != nil {
		return err
	}
	if sent {
		return nil
	}
	// With no action there is no key: every delivery's send is its own.
	key := "naive-" + strconv.Itoa(i) + "-" + randomHex(6)
	var err error
	switch kindOf(i) {
	case kindEmail:
		_, err = w.sender().Send(ctx, once.Attempt{Key: once.Key(key), Number: 1}, w.message(i))
	case kindCharge:
		_, err = w.charge(ctx, i)
	default:
		_, err = w.post(ctx, key, i)
	}
	if err != nil {
		return err
	}
	_, err = w.naive.Exec(ctx, `INSERT INTO `+w.cfg.NaiveTable+` (intent) VALUES ($1) ON CONFLICT DO NOTHING`, i)
	return err
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// sender greets with the worker's pid, by which the SMTP tap knows whom
// to kill.
func (w *worker) sender() *smtpsend.Sender {
	return &smtpsend.Sender{Addr: w.cfg.SMTP, Timeout: w.timeout, Hello: "w" + w.pid, MessageIDDomain: "chaos.once.localhost"}
}

func (w *worker) message(i int) smtpsend.Message {
	return smtpsend.Message{
		From:    "receipts@chaos.once.localhost",
		To:      []string{recipient(i, w.cfg.RunTag)},
		Subject: fmt.Sprintf("Your receipt #%d", i),
		Body:    []byte(fmt.Sprintf("Thank you for order %d.\n", i)),
	}
}

// request sends a JSON request with the worker's pid and returns the
// status and body; a request that could not even connect is a
// RetryLater (nothing reached the provider), any other failure an
// unknown outcome.
func (w *worker) request(ctx context.Context, method, url string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, once.Permanent(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return 0, nil, once.Permanent(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(pidHeader, w.pid)
	resp, err := w.http.Do(req)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return 0, nil, once.RetryLater(err)
		}
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, err
	}
	return resp.StatusCode, b, nil
}

// charge charges intent i's amount; the provider key travels in ctx.
func (w *worker) charge(ctx context.Context, i int) (string, error) {
	status, body, err := w.request(ctx, http.MethodPost, w.cfg.Payments+"/v1/charges", chargeRequest{Intent: i, Amount: amount(i)})
	if err != nil {
		return "", err
	}
	return created(status, body, http.StatusOK)
}

// post posts intent i's message under key.
func (w *worker) post(ctx context.Context, key string, i int) (string, error) {
	status, body, err := w.request(ctx, http.MethodPost, w.cfg.Posts+"/v1/posts", postRequest{Key: key, Intent: i, Text: fmt.Sprintf("Order %d shipped", i)})
	if err != nil {
		return "", err
	}
	return created(status, body, http.StatusCreated)
}

// created reads the id of what a provider created, and classifies a
// refusal: a 4xx did not happen and never will, a 409 (a request with
// the key is being served) did not happen this time.
func created(status int, body []byte, want int) (string, error) {
	var v struct {
		ID string `json:"id"`
	}
	switch {
	case status == want:
		if err := json.Unmarshal(body, &v); err != nil || v.ID == "" {
			return "", fmt.Errorf("the provider answered %d without an id: %q", status, body)
		}
		return v.ID, nil
	case status == http.StatusConflict:
		return "", once.RetryLater(fmt.Errorf("the provider is serving the same key: %s", body))
	case status >= 400 && status < 500:
		return "", once.Permanent(fmt.Errorf("the provider refused: %d %s", status, body))
	}
	return "", fmt.Errorf("the provider answered %d: %s", status, body)
}

// verify asks the posts provider whether the action's post landed.
func (w *worker) verify(ctx context.Context, a once.Action) (bool, json.RawMessage, error) {
	return verifyPost(ctx, w.http, w.cfg.Posts, a)
}

func verifyPost(ctx context.Context, hc *http.Client, base string, a once.Action) (bool, json.RawMessage, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/posts/"+string(a.Key), nil)
	if err != nil {
		return false, nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return false, nil, err
	}
	defer resp.Body.Close()
	var v struct {
		ID string `json:"id"`
	}
	switch resp.StatusCode {
	case http.StatusOK:
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || v.ID == "" {
			return false, nil, fmt.Errorf("the provider's answer about %s has no id", a.Key)
		}
		result, _ := json.Marshal(v.ID)
		return true, result, nil
	case http.StatusNotFound:
		return false, nil, nil
	}
	return false, nil, fmt.Errorf("the provider answered %s about %s", resp.Status, a.Key)
}

// jobIndex decodes a job's body.
func jobIndex(body []byte) (int, error) {
	var j job
	if err := json.Unmarshal(body, &j); err != nil {
		return 0, once.Permanent(fmt.Errorf("the job %q does not decode: %w", body, err))
	}
	return j.I, nil
}

func (w *worker) consumeNATS(ctx context.Context) error {
	nc, err := nats.Connect(w.cfg.Queue.URL, nats.Name(fmt.Sprintf("once chaos worker %d", w.cfg.Slot)),
		nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.RetryOnFailedConnect(true))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	nw, err := natsjs.New(js, natsjs.Config{
		Concurrency: w.cfg.Concurrency, RetryDelay: 200 * time.Millisecond, MaxRetryDelay: 2 * time.Second,
		AckTimeout: 2 * time.Second, DrainTimeout: time.Second, Logger: w.log,
		OnSettle: func(jetstream.Msg, once.Disposition, error) {},
	})
	if err != nil {
		return err
	}
	fn := func(ctx context.Context, msg jetstream.Msg) error {
		i, err := jobIndex(msg.Data())
		if err != nil {
			return err
		}
		return w.handle(ctx, i)
	}
	for ctx.Err() == nil {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		cons, err := js.Consumer(cctx, w.cfg.Queue.Stream, w.cfg.Queue.Consumer)
		cancel()
		if err == nil {
			err = nw.Consume(ctx, cons, fn)
		}
		if err != nil && ctx.Err() == nil {
			w.log.Debug("consuming", "err", err)
			pause(ctx, 200*time.Millisecond)
		}
	}
	return nil
}

func (w *worker) consumeRabbitMQ(ctx context.Context) error {
	work := func(ctx context.Context, d amqp.Delivery) error {
		i, err := jobIndex(d.Body)
		if err != nil {
			return err
		}
		return w.handle(ctx, i)
	}
	for ctx.Err() == nil {
		if err := w.rabbitSession(ctx, work); err != nil && ctx.Err() == nil {
			w.log.Debug("consuming", "err", err)
			pause(ctx, 200*time.Millisecond)
		}
	}
	return nil
}

// rabbitSession consumes on one connection until it closes (a broker
// restart) or ctx ends.
func (w *worker) rabbitSession(ctx context.Context, work func(context.Context, amqp.Delivery) error) error {
	conn, err := amqp.DialConfig(w.cfg.Queue.URL, amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)})
	if err != nil {
		return err
	}
	defer conn.Close()
	q, err := rabbitmq.New(rabbitConfig(conn, w.cfg.Queue.Queue))
	if err != nil {
		return err
	}
	defer q.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Qos(w.cfg.Concurrency, 0, false); err != nil {
		return err
	}
	deliveries, err := ch.Consume(w.cfg.Queue.Queue, "", false, false, false, false, nil)
	if err != nil {
		return err
	}
	// The prefetch count bounds the deliveries held at once.
	running := 0
	finished := make(chan struct{})
	defer func() {
		for ; running > 0; running-- {
			<-finished
		}
	}()
	for {
		select {
		case <-ctx.Done():
			ch.Close()
			return nil
		case <-finished:
			running--
		case d, ok := <-deliveries:
			if !ok {
				return errors.New("the channel closed")
			}
			running++
			go func() {
				q.Handle(ctx, d, work)
				finished <- struct{}{}
			}()
		}
	}
}

func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
