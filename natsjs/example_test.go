package natsjs_test

import (
	"context"
	"encoding/json"
	"log"
	"os"
	"os/signal"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncehq/once"
	"github.com/oncehq/once/natsjs"
	"github.com/oncehq/once/sqlite"
)

// A worker that charges each order once, however often JetStream
// delivers it. Consume settles every message by what once recorded
// (DoubleAck, NakWithDelay or Term), keeps it alive with InProgress
// while the charge runs, and drains on SIGINT. The kind's Redrive hook
// publishes an order again when a released charge has no delivery left
// to run it (its message was acked or ran out of MaxDeliver).
//
// It needs a NATS server with JetStream, so it is compiled, not run;
// the package's tests run the same flow against a real server.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Drain()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	store, err := sqlite.Open("once.db", sqlite.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	type order struct {
		ID, Customer string
		Amount       int
	}
	// The job comes back from the action: Run is the order's id, Target
	// the customer, Payload the amount.
	republish := func(a once.Action) (*nats.Msg, error) {
		var amount int
		if err := json.Unmarshal(a.Payload, &amount); err != nil {
			return nil, err
		}
		data, err := json.Marshal(order{ID: a.Run, Customer: a.Target, Amount: amount})
		return &nats.Msg{Subject: "ORDERS.new", Data: data}, err
	}
	client, err := once.New(once.Config{Store: store, Kinds: map[string]once.KindPolicy{
		"charge": {Recovery: once.RetryWithProviderKey, Redrive: natsjs.Redrive(js, republish)},
	}})
	if err != nil {
		log.Fatal(err)
	}
	reaper, err := once.NewReaper(client, once.ReaperConfig{})
	if err != nil {
		log.Fatal(err)
	}
	if err := reaper.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer reaper.Stop()

	cons, err := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{Durable: "charger", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		log.Fatal(err)
	}
	worker, err := natsjs.New(js, natsjs.Config{Concurrency: 8})
	if err != nil {
		log.Fatal(err)
	}
	err = worker.Consume(ctx, cons, func(ctx context.Context, msg jetstream.Msg) error {
		var o order
		if err := json.Unmarshal(msg.Data(), &o); err != nil {
			return once.Permanent(err) // terminated: no delivery will decode it
		}
		in := once.Intent{Run: o.ID, Kind: "charge", Target: o.Customer, Payload: o.Amount}
		_, err := once.Do(ctx, client, in, func(ctx context.Context, a once.Attempt) (string, error) {
			return chargeCard(ctx, a.ProviderKey, o.Customer, o.Amount)
		})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
}

// chargeCard stands for the payment API call, made with the provider
// key as its Idempotency-Key (see idemhttp).
func chargeCard(_ context.Context, _, _ string, _ int) (string, error) { return "ch_1", nil }
