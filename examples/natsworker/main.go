// Command natsworker takes order jobs from NATS JetStream and, for each, charges the customer through a payment API
// and then sends a confirmation email, each exactly once, however often the job is delivered. Publish each order on
// natsjs.JobSubject("<stream>.orders", its id): the reaper publishes it again for a released action (a person's Retry).
package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oncehq/once"
	"github.com/oncehq/once/idemhttp"
	"github.com/oncehq/once/natsjs"
	"github.com/oncehq/once/smtpsend"
	"github.com/oncehq/once/sqlite"
)

type order struct {
	ID, Email, Customer string
	Amount              int
}

func main() {
	natsURL := flag.String("nats", cmp.Or(os.Getenv("NATS_URL"), nats.DefaultURL), "NATS server URL (NATS_URL)")
	smtpAddr := flag.String("smtp", cmp.Or(os.Getenv("SMTP_ADDR"), "127.0.0.1:25"), "SMTP server host:port (SMTP_ADDR)")
	api := flag.String("provider", cmp.Or(os.Getenv("PROVIDER_URL"), "http://127.0.0.1:8080/charges"), "payment API's charge URL (PROVIDER_URL)")
	db := flag.String("db", cmp.Or(os.Getenv("ONCE_DB"), "once.db"), "SQLite file for once's records (ONCE_DB)")
	stream := flag.String("stream", cmp.Or(os.Getenv("STREAM"), "ORDERS"), "stream of the jobs, on subjects <stream>.> (STREAM)")
	redriveAfter := flag.Duration("redrive-after", once.DefaultRedriveAfter, "how long a released job waits for a delivery before it is published again")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	nc := must(nats.Connect(*natsURL))
	defer nc.Drain()
	js := must(jetstream.New(nc))
	s := must(js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: *stream, Subjects: []string{*stream + ".>"}, MaxAge: 30 * 24 * time.Hour})) // keeps acked jobs, for re-drives
	store := must(sqlite.Open(*db, sqlite.Config{}))
	defer store.Close()
	must(0, store.Migrate(ctx))
	client := must(once.New(once.Config{Store: store, Kinds: map[string]once.KindPolicy{"charge": {Recovery: once.RetryWithProviderKey}},
		Default: once.KindPolicy{Redrive: natsjs.RedriveJob(js, *stream, *stream+".orders"), RedriveAfter: *redriveAfter}})) // released: the whole order again, its done effects replay
	must(0, must(once.NewReaper(client, once.ReaperConfig{Interval: *redriveAfter / 2})).Start(ctx)) // stops with ctx
	jobs := must(s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "natsworker", AckPolicy: jetstream.AckExplicitPolicy}))
	worker := must(natsjs.New(js, natsjs.Config{Concurrency: 4}))
	sender, hc := &smtpsend.Sender{Addr: *smtpAddr, Timeout: 30 * time.Second}, &http.Client{Transport: &idemhttp.Transport{}, Timeout: 30 * time.Second}
	must(0, worker.Consume(ctx, jobs, func(ctx context.Context, msg jetstream.Msg) error {
		var o order
		if err := json.Unmarshal(msg.Data(), &o); err != nil {
			return once.Permanent(err) // no delivery will decode it: terminated
		}
		// Charge first: its unknown outcomes are retried, not reviewed; the email's may be, so it goes last and a dropped job leaves nothing undone.
		charge := once.Intent{Run: o.ID, Step: 0, Kind: "charge", Target: o.Customer, Payload: o.Amount}
		if _, err := once.Do(ctx, client, charge, func(ctx context.Context, a once.Attempt) (string, error) {
			body, _ := json.Marshal(map[string]any{"customer": o.Customer, "amount": o.Amount})
			req, err := http.NewRequestWithContext(idemhttp.WithKey(ctx, a.ProviderKey), "POST", *api, bytes.NewReader(body))
			if err != nil {
				return "", once.Permanent(err)
			}
			resp, err := hc.Do(req) // with Idempotency-Key: a.ProviderKey
			if err != nil {
				return "", err // it may have been charged: retried with the same key
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			switch c := resp.StatusCode; { // the provider's answer as an outcome, by hand: swap for idemhttp's mapping
			case c == http.StatusTooManyRequests || c == http.StatusConflict || c >= 500: // 409: the key's first request still runs
				return "", fmt.Errorf("payment API: %s", resp.Status) // unknown: retried with the same key
			case c >= 400:
				return "", once.Permanent(fmt.Errorf("payment API: %s: %s", resp.Status, b))
			}
			return string(b), err
		}); err != nil {
			return err
		}
		mail := smtpsend.Message{From: "shop@example.com", To: []string{o.Email}, Subject: "Order " + o.ID, Body: []byte("Thank you.\n")}
		send := once.Intent{Run: o.ID, Step: 1, Kind: "send_email", Target: o.Email, Payload: mail}
		_, err := once.Do(ctx, client, send, func(ctx context.Context, a once.Attempt) (string, error) { return sender.Send(ctx, a, mail) }) // classified errors
		return err
	}))
}

func must[T any](v T, err error) T {
	if err != nil {
		log.Fatal(err)
	}
	return v
}
