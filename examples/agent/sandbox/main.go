// Command sandbox runs what the agent example talks to, on loopback: a
// mail server that keeps every message it accepted, and a payment
// provider that honours Idempotency-Key. It prints a line for every
// message and every request, so a run killed and resumed can be watched
// from the other side: each email arrives once, and a call the agent
// sent again is answered from the provider's store (request 2, replayed)
// instead of charging twice.
//
// Usage:
//
//	sandbox [--smtp 127.0.0.1:2525] [--http 127.0.0.1:8025]
//	        [--hold-charge DURATION] [--hold-mail DURATION]
//
// --hold-charge holds the provider's answer to the first charge for that
// long after the charge was made, and --hold-mail the mail server's reply
// to the first message after it arrived: a window to kill the agent
// inside the call, where it cannot know what happened. Interrupt it to stop; it
// prints what it counted.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/lab/mailbox"
	"github.com/oncehq/once/lab/provider"
	"github.com/oncehq/once/sqlite"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "sandbox:", err)
		}
		os.Exit(2)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sandbox", flag.ContinueOnError)
	fs.SetOutput(stderr)
	smtpAddr := fs.String("smtp", "127.0.0.1:2525", "where the mail server listens, `HOST:PORT`")
	httpAddr := fs.String("http", "127.0.0.1:8025", "where the payment provider listens, `HOST:PORT`")
	holdCharge := fs.Duration("hold-charge", 0, "hold the answer to the first charge for `DURATION` after making it")
	holdMail := fs.Duration("hold-mail", 0, "hold the reply to the first message for `DURATION` after it arrived")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q; every option is a flag", fs.Arg(0))
	}
	if *holdCharge < 0 || *holdMail < 0 {
		return errors.New("--hold-charge and --hold-mail must not be negative")
	}

	// The provider's idempotency records: its own database, in a
	// directory removed when the sandbox stops.
	dir, err := os.MkdirTemp("", "once-sandbox")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	store, err := sqlite.Open(filepath.Join(dir, "provider.db"), sqlite.Config{})
	if err != nil {
		return err
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	client, err := once.New(once.Config{Store: store})
	if err != nil {
		return err
	}

	var (
		mu     sync.Mutex
		copies = map[string]int{}
	)
	mail, err := mailbox.Start(mailbox.Config{Addr: *smtpAddr, BeforeReply: func(m mailbox.Message) {
		mu.Lock()
		copies[m.MessageID]++
		n := copies[m.MessageID]
		first := len(copies) == 1 && n == 1
		fmt.Fprintf(stdout, "mailbox   %-22s %-44q %s  copy %d\n", strings.Join(m.To, ","), decode(m.Subject), m.MessageID, n)
		mu.Unlock()
		if *holdMail > 0 && first {
			fmt.Fprintf(stdout, "mailbox   holding the reply for %v\n", *holdMail)
			time.Sleep(*holdMail)
		}
	}})
	if err != nil {
		return err
	}
	defer mail.Close()

	p, err := provider.New(provider.Config{
		Client: client,
		BeforeReply: func(r *http.Request, o provider.Object) {
			if o.Object == "charge" && o.ID == "ch_1" && *holdCharge > 0 {
				fmt.Fprintf(stdout, "provider  made %s; holding the answer for %v\n", o.ID, *holdCharge)
				time.Sleep(*holdCharge)
			}
		},
		Log: func(r provider.Request) {
			what := "nothing created"
			switch {
			case r.Created != nil:
				what = "created " + r.Created.ID
			case r.Replayed:
				what = "replayed the stored answer; nothing created"
			}
			fmt.Fprintf(stdout, "provider  %s %-13s key %.12s  request %d with this key  %d  %s\n", r.Method, r.Path, r.Key, r.Nth, r.Status, what)
		},
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *httpAddr)
	if err != nil {
		return fmt.Errorf("--http %s: %w", *httpAddr, err)
	}
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	fmt.Fprintf(stdout, "sandbox: mail server on %s, payment provider on http://%s; interrupt to stop\n", mail.Addr(), ln.Addr())

	<-ctx.Done()
	shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	srv.Shutdown(shut)

	msgs := mail.Messages()
	fmt.Fprintf(stdout, "\nsandbox: %s", plural(len(msgs), "message"))
	dups := 0
	mu.Lock()
	defer mu.Unlock()
	for id, n := range copies {
		if n > 1 {
			dups++
			fmt.Fprintf(stdout, "; %s arrived %d times", id, n)
		}
	}
	if dups == 0 {
		fmt.Fprint(stdout, ", none twice")
	}
	objs := p.Objects()
	fmt.Fprintf(stdout, "; %s at the provider:", plural(len(objs), "object"))
	for _, o := range objs {
		fmt.Fprintf(stdout, " %s (key %.12s, %s)", o.ID, o.Key, plural(p.Requests(o.Key), "request"))
	}
	fmt.Fprintln(stdout)
	return nil
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// decode turns a Subject's encoded words back into text.
func decode(s string) string {
	if d, err := new(mime.WordDecoder).DecodeHeader(s); err == nil {
		return d
	}
	return s
}
