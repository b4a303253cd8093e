// Command agent is an agent-style run carried out with once: a run that
// can be killed at any point and started again, and whose every external
// effect still happens exactly once.
//
// One run (--run order-42) takes an order through six tool calls, in
// order:
//
//	step 0  send_email     tell the customer the order was received   smtpsend, Message-ID from the key
//	step 1  create_customer  at the payment provider                  HTTP, Idempotency-Key from the key
//	step 2  charge_card    charge that customer                       HTTP, Idempotency-Key from the key
//	step 3  record_order   one row in the orders table                once.DoTx, same database as the ledger
//	step 4  send_email     the receipt, to the customer               smtpsend
//	step 5  send_email     the shipping request, to the warehouse     smtpsend
//
// A resumed run executes from the start; every step that already
// happened replays its stored result, so the run picks up where it died
// and carries the same values (the customer id, the charge id) forward.
//
// A step's key is the run id, the step's number in the run (once.Run.Next
// counts them), its kind and its target. The id a model gives a tool call
// (call_…) is not part of it: the model makes up a new one on every turn,
// so a key built from it would turn each resumed step into a new action
// and do it again. The transcript prints the tool-call id beside the key
// to show that the one changes between tries and the other does not.
//
// Each kind recovers in its own way when a step died with its outcome
// unknown: the provider's calls are sent again with the same provider key
// (RetryWithProviderKey: the provider answers from its idempotency store
// instead of charging twice), and an email is put up for review
// (AskPerson: plain SMTP cannot be asked whether it delivered, so a person
// searches the mailbox for its Message-ID and records what they found with
// `once resolve`). The order row needs no recovery: it commits in one
// transaction with its record, or not at all.
//
// Usage:
//
//	agent --run order-42 [--db agent.db | --db postgres://…] [--smtp 127.0.0.1:2525]
//	      [--provider http://127.0.0.1:8025] [--pause-before-each-step]
//
// `go run ./examples/agent/sandbox` starts a mail server and a payment
// provider to run it against; README.md shows a run killed and resumed.
//
// Exit status: 0 when the run finished, 3 when a step waits for a person
// (the transcript says what to check and the command to record it), 2 for
// bad flags, 1 for any other error.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/idemhttp"
	"github.com/oncehq/once/smtpsend"
)

const (
	exitOK     = 0
	exitError  = 1
	exitUsage  = 2
	exitReview = 3
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// options are the command's flags.
type options struct {
	run         string
	db          string
	smtp        string
	provider    string
	from        string
	lease       time.Duration
	stepTimeout time.Duration
	pause       bool
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.run, "run", "", "the run's `ID` (an order, a conversation): the same id resumes the same run. Required")
	fs.StringVar(&o.db, "db", "agent.db", "the database of the ledger and the orders table: a SQLite file `PATH`, or a postgres:// URL (once_schema=NAME in its query places the tables)")
	fs.StringVar(&o.smtp, "smtp", "127.0.0.1:2525", "the SMTP server, `HOST:PORT` (plain SMTP, no TLS or login)")
	fs.StringVar(&o.provider, "provider", "http://127.0.0.1:8025", "the payment provider's base `URL`")
	fs.StringVar(&o.from, "from", "shop@example.com", "the sender `ADDRESS` of the emails")
	fs.DurationVar(&o.lease, "lease", 5*time.Second, "how long a claim outlives a killed run before recovery may decide it (`DURATION`; once's default is 2m, shortened so a resumed run does not wait long)")
	fs.DurationVar(&o.stepTimeout, "step-timeout", time.Minute, "how long one step may keep waiting and retrying before the run gives up (`DURATION`)")
	fs.BoolVar(&o.pause, "pause-before-each-step", false, "print a line starting with \"pause:\" before each step and after the last, and wait for a line on stdin: a moment to kill the run")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: agent --run ID [--db PATH|URL] [--smtp HOST:PORT] [--provider URL] [--pause-before-each-step]")
		fmt.Fprint(stderr, "\ntakes one order through six tool calls, each exactly once however often the run is killed and resumed\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected argument %q; every option is a flag (--run ID)", fs.Arg(0))
	case strings.TrimSpace(o.run) == "":
		return o, errors.New("--run is required: name the run, such as --run order-42; the same id resumes it")
	case o.lease < 100*time.Millisecond:
		return o, fmt.Errorf("--lease %v is too short; give at least 100ms (heartbeats renew it every third of it)", o.lease)
	case o.stepTimeout <= 0:
		return o, fmt.Errorf("--step-timeout %v must be positive", o.stepTimeout)
	}
	if _, _, err := net.SplitHostPort(o.smtp); err != nil {
		return o, fmt.Errorf("--smtp %q is not HOST:PORT (%v)", o.smtp, err)
	}
	u, err := url.Parse(o.provider)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return o, fmt.Errorf("--provider %q is not an http:// or https:// URL, such as http://127.0.0.1:8025", o.provider)
	}
	o.provider = strings.TrimSuffix(o.provider, "/")
	return o, nil
}

// needsPerson is the error of a run stopped at a step that waits for a
// person's decision.
type needsPerson struct{ err error }

func (e *needsPerson) Error() string { return e.err.Error() }
func (e *needsPerson) Unwrap() error { return e.err }

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintln(stderr, "agent:", err)
		return exitUsage
	}
	db, err := openDatabase(ctx, o.db)
	if err != nil {
		fmt.Fprintln(stderr, "agent:", err)
		return exitError
	}
	defer db.close()

	client, err := once.New(once.Config{
		Store: db.store,
		Kinds: map[string]once.KindPolicy{
			// Plain SMTP cannot be asked whether a message arrived: a
			// send whose outcome is unknown goes to a person, never
			// out a second time.
			"send_email": {Lease: o.lease, Recovery: once.AskPerson},
			// The provider honours Idempotency-Key: a call whose outcome
			// is unknown is sent again with the same key, and the
			// provider answers it from its store instead of acting twice.
			"create_customer": {Lease: o.lease, Recovery: once.RetryWithProviderKey},
			"charge_card":     {Lease: o.lease, Recovery: once.RetryWithProviderKey},
			// record_order runs in DoTx: the transaction holds its claim
			// and commits it with the row, so it never has an unknown
			// outcome to recover.
		},
	})
	if err != nil {
		fmt.Fprintln(stderr, "agent:", err)
		return exitError
	}

	a := &agent{
		opts:   o,
		client: client,
		db:     db,
		run:    client.Run(o.run),
		out:    stdout,
		mail:   &smtpsend.Sender{Addr: o.smtp, Timeout: 30 * time.Second},
		// idemhttp.Transport puts the provider key that the effect puts
		// in the request's context (idemhttp.WithKey) on the wire as
		// Idempotency-Key.
		http: &http.Client{Transport: &idemhttp.Transport{}, Timeout: 30 * time.Second},
	}
	if o.pause {
		a.lines = readLines(stdin)
	}
	fmt.Fprintf(stdout, "run %s: %s, smtp %s, provider %s\n", o.run, db.name, o.smtp, o.provider)
	err = a.takeOrder(ctx)
	var person *needsPerson
	switch {
	case errors.As(err, &person):
		fmt.Fprintf(stdout, "run %s stopped: a person decides step %d; run it again once they have\n", o.run, a.steps)
		return exitReview
	case err != nil:
		fmt.Fprintf(stdout, "run %s stopped at step %d: %v\n", o.run, a.steps, err)
		return exitError
	}
	if err := a.pause(ctx, "after the last step"); err != nil {
		return exitError
	}
	fmt.Fprintf(stdout, "run %s finished: %d steps, %d ran, %d replayed\n", o.run, a.steps, a.ran, a.steps-a.ran)
	return exitOK
}

// readLines hands over stdin's lines, for the pauses. It stops at the
// end of input; a pause then goes on by itself.
func readLines(r io.Reader) <-chan string {
	ch := make(chan string)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			ch <- sc.Text()
		}
	}()
	return ch
}
