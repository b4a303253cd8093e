package demo

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"time"

	_ "modernc.org/sqlite" // the naive worker's own table

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/dburl"
	"github.com/oncehq/once/smtpsend"
)

// A worker is this same binary, started with envWorker holding its
// configuration as JSON; main hands control to WorkerMain before parsing
// any flags.
const envWorker = "ONCE_DEMO_WORKER"

type workerConfig struct {
	Slot    int    `json:"slot"`
	Mode    string `json:"mode"` // "naive" or "once"
	Queue   string `json:"queue"`
	SMTP    string `json:"smtp"`
	DB      string `json:"db"`       // once mode: the action log
	NaiveDB string `json:"naive_db"` // naive mode: its own "sent" table
	SendLog string `json:"send_log"` // the workers' account of their sends, for --smtp
	Lease   string `json:"lease"`
}

// IsWorker reports whether this process was started as a demo worker.
func IsWorker() bool { return os.Getenv(envWorker) != "" }

// WorkerMain runs a worker until the queue is drained and returns the
// process's exit code.
func WorkerMain(stderr io.Writer) int {
	var cfg workerConfig
	if err := json.Unmarshal([]byte(os.Getenv(envWorker)), &cfg); err != nil {
		fmt.Fprintln(stderr, "demo worker: bad configuration:", err)
		return 2
	}
	if err := work(context.Background(), cfg); err != nil {
		fmt.Fprintf(stderr, "demo worker %d (%s): %v\n", cfg.Slot, cfg.Mode, err)
		return 1
	}
	return 0
}

func work(ctx context.Context, cfg workerConfig) error {
	w := &worker{cfg: cfg, http: &http.Client{Timeout: 10 * time.Second}}
	if cfg.SendLog != "" {
		l, err := openSendLog(cfg.SendLog)
		if err != nil {
			return err
		}
		defer l.close()
		w.log = l
	}
	switch cfg.Mode {
	case "naive":
		db, err := sql.Open("sqlite", cfg.NaiveDB+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
		if err != nil {
			return err
		}
		defer db.Close()
		w.naive = db
	case "once":
		s, err := dburl.Open(ctx, cfg.DB)
		if err != nil {
			return err
		}
		defer s.Close()
		lease, _ := time.ParseDuration(cfg.Lease)
		c, err := once.New(once.Config{Store: s, Kinds: map[string]once.KindPolicy{
			// Plain SMTP cannot be asked whether it delivered: an
			// ambiguous send goes to a person, never out again.
			"send_email": {Recovery: once.AskPerson, Lease: lease, MaxExecution: 10 * time.Second},
		}})
		if err != nil {
			return err
		}
		w.once = c
	default:
		return fmt.Errorf("unknown mode %q", cfg.Mode)
	}
	for {
		job, more, err := w.next()
		if err != nil {
			return err
		}
		if !more {
			return nil
		}
		if job == nil {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if err := w.handle(ctx, *job); err != nil {
			return err
		}
	}
}

type worker struct {
	cfg   workerConfig
	http  *http.Client
	naive *sql.DB
	once  *once.Client
	log   *sendLog // nil when the demo's own server counts
}

// errNoLog stops a worker that could not log a send before making it:
// a send the log does not know of would make the counts wrong, not
// merely uncertain.
var errNoLog = errors.New("cannot log the send, so it was not made")

func (w *worker) post(path string, v url.Values) (*http.Response, error) {
	v.Set("worker", strconv.Itoa(w.cfg.Slot))
	v.Set("pid", strconv.Itoa(os.Getpid()))
	return w.http.PostForm(w.cfg.Queue+path, v)
}

// next asks for a job: nil with more=true when none is ready yet,
// more=false when the queue is drained.
func (w *worker) next() (*Job, bool, error) {
	resp, err := w.post("/next", url.Values{})
	if err != nil {
		return nil, false, err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusGone:
		return nil, false, nil
	case http.StatusNoContent:
		return nil, true, nil
	}
	var j Job
	if err := json.NewDecoder(resp.Body).Decode(&j); err != nil {
		return nil, false, err
	}
	return &j, true, nil
}

func (w *worker) ack(j Job) error {
	resp, err := w.post("/ack", url.Values{"id": {strconv.Itoa(j.ID)}})
	if err == nil {
		resp.Body.Close()
	}
	return err
}

func (w *worker) nack(j Job, delay time.Duration) error {
	resp, err := w.post("/nack", url.Values{"id": {strconv.Itoa(j.ID)}, "delay_ms": {strconv.FormatInt(delay.Milliseconds(), 10)}})
	if err == nil {
		resp.Body.Close()
	}
	return err
}

// pause stops the worker dead, between the SMTP server's acceptance and
// any record of it: where the seed's story has the process killed. It
// tells the supervisor, which kills it.
func (w *worker) pause() {
	if resp, err := w.post("/pause", url.Values{}); err == nil {
		resp.Body.Close()
	}
	select {} // SIGKILL arrives here
}

// messageIDDomain is the right-hand side of every demo Message-ID.
const messageIDDomain = "once.localhost"

// sender sends the demo's messages: plain SMTP on loopback, no STARTTLS
// or authentication, each command bounded so a hung server fails a send
// instead of the half.
func (w *worker) sender() *smtpsend.Sender {
	return &smtpsend.Sender{Addr: w.cfg.SMTP, Timeout: 5 * time.Second, MessageIDDomain: messageIDDomain}
}

// send runs one SMTP transaction for the attempt a, whose key names the
// Message-ID. With a send log, an attempt line goes before it and an
// outcome line after, by smtpsend's classification of the failure:
// accepted as soon as the server replies 250 to the message (before QUIT,
// whose failure changes nothing), not_accepted when the message certainly
// was not taken (smtpsend says retry later, or refused for good), unsure
// when the end was sent and no reply came back (a plain error). It
// returns the server's reply, or smtpsend's error, classified for
// once.Do, or errNoLog.
func (w *worker) send(ctx context.Context, j Job, a once.Attempt) (string, error) {
	line, err := w.log.begin(w.cfg.Mode, j, smtpsend.MessageID(a.Key, messageIDDomain))
	if err != nil {
		return "", fmt.Errorf("%w: %v", errNoLog, err)
	}
	reply, err := w.sender().Send(ctx, a, smtpsend.Message{
		From:    "demo@once.localhost",
		To:      []string{j.Rcpt},
		Subject: j.Subject,
		Body:    []byte("Hello from once.\r\n"),
	})
	switch {
	case err == nil:
		if j.PauseBeforeLog {
			w.pause()
		}
		w.log.end(line, logAccepted, reply)
	case errors.Is(err, once.ErrRetryLater), errors.Is(err, once.ErrPermanent):
		w.log.end(line, logNotAccepted, err.Error())
	default:
		w.log.end(line, logUnsure, err.Error())
	}
	return reply, err
}

func (w *worker) handle(ctx context.Context, j Job) error {
	if w.naive != nil {
		return w.handleNaive(ctx, j)
	}
	return w.handleOnce(ctx, j)
}

// handleNaive is the seed's broken "check, then send, then record".
func (w *worker) handleNaive(ctx context.Context, j Job) error {
	var n int
	if err := w.naive.QueryRowContext(ctx, `SELECT count(*) FROM sent WHERE rcpt = ?`, j.Rcpt).Scan(&n); err != nil {
		return w.nack(j, 100*time.Millisecond)
	}
	if n > 0 {
		return w.ack(j)
	}
	// The naive worker has no action, so it names its message after the
	// delivery: every delivery sends a message of its own.
	naive := once.Attempt{Key: once.Key(fmt.Sprintf("naive-%d-%d", j.ID, j.Delivery)), Number: 1}
	if _, err := w.send(ctx, j, naive); errors.Is(err, errNoLog) {
		return err
	} else if err != nil {
		return w.nack(j, 100*time.Millisecond)
	}
	if j.PauseAfterSend {
		w.pause()
	}
	if _, err := w.naive.ExecContext(ctx, `INSERT OR IGNORE INTO sent (rcpt) VALUES (?)`, j.Rcpt); err != nil {
		return w.nack(j, 100*time.Millisecond)
	}
	return w.ack(j)
}

// handleOnce is the same job through once.Do.
func (w *worker) handleOnce(ctx context.Context, j Job) error {
	in := once.Intent{Run: j.Run, Step: int64(j.ID), Kind: "send_email", Target: j.Rcpt, Payload: map[string]string{"subject": j.Subject}}
	_, err := once.Do(ctx, w.once, in, func(ctx context.Context, a once.Attempt) (string, error) {
		// smtpsend derives the Message-ID from the action's key: the
		// same on every attempt, so a receiving system could spot a
		// duplicate too. Its errors are classified already: released
		// when the server certainly did not take the message, unknown
		// (a person reviews it) when the reply to it was lost.
		reply, err := w.send(ctx, j, a)
		if errors.Is(err, errNoLog) {
			return "", once.RetryLater(err) // nothing was sent
		} else if err != nil {
			return "", err
		}
		if j.PauseAfterSend {
			w.pause()
		}
		return reply, nil
	})
	if errors.Is(err, errNoLog) {
		return err
	}
	// once.Dispose knows the error matrix: ack what is finished, put
	// back what a later delivery must finish (an action awaiting its
	// verifier among them), and drop what a person decides. The demo's
	// queue has no dead-letter queue, so a drop is an ack.
	switch d := once.Dispose(err); d.Action {
	case once.JobRetry:
		return w.nack(j, max(d.After, 100*time.Millisecond))
	default:
		return w.ack(j)
	}
}
