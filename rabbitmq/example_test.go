package rabbitmq_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/oncehq/once"
	"github.com/oncehq/once/rabbitmq"
	"github.com/oncehq/once/sqlite"
)

// A worker that sends a welcome email per job. The job is published
// twice (a producer retried); the email goes out once, and both
// deliveries are acked. A job whose claim is held, or whose provider was
// busy, would wait in a retry queue; one a person must look at would go
// to the dead-letter queue; and a released action whose job is gone is
// published again by the reaper through the Redrive hook.
func Example() {
	ctx := context.Background()
	conn, err := amqp.Dial("amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		panic(err)
	}
	defer conn.Close()

	var r [4]byte
	rand.Read(r[:])
	name := "once-example.welcome." + hex.EncodeToString(r[:])
	q, err := rabbitmq.New(rabbitmq.Config{Conn: conn, Queue: name, DeadLetterQueue: name + ".dead"})
	if err != nil {
		panic(err)
	}
	defer q.Close()
	if err := q.Declare(ctx); err != nil {
		panic(err)
	}
	defer deleteExampleQueues(conn, append(q.RetryQueues(), name, name+".dead"))

	dir, err := os.MkdirTemp("", "rabbitmq-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	store, err := sqlite.Open(filepath.Join(dir, "once.db"), sqlite.Config{})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}

	type welcome struct {
		ID string `json:"id"`
		To string `json:"to"`
	}
	client, err := once.New(once.Config{Store: store, Kinds: map[string]once.KindPolicy{
		"send_email": {Redrive: q.Redrive(func(a once.Action) (amqp.Publishing, error) {
			body, err := json.Marshal(welcome{ID: a.Run, To: a.Target})
			return amqp.Publishing{ContentType: "application/json", Body: body}, err
		})},
	}})
	if err != nil {
		panic(err)
	}

	sent := 0
	sendWelcome := func(ctx context.Context, d amqp.Delivery) error {
		var w welcome
		if err := json.Unmarshal(d.Body, &w); err != nil {
			return once.Permanent(err) // dropped: delivering it again changes nothing
		}
		in := once.Intent{Run: w.ID, Kind: "send_email", Target: w.To}
		_, err := once.Do(ctx, client, in, func(ctx context.Context, a once.Attempt) (string, error) {
			sent++ // your mailer here; smtpsend classifies its failures for once
			return "250 queued", nil
		})
		return err
	}

	job, _ := json.Marshal(welcome{ID: "signup-4711", To: "ada@example.com"})
	for range 2 {
		if err := q.Publish(ctx, amqp.Publishing{ContentType: "application/json", Body: job}); err != nil {
			panic(err)
		}
	}

	ch, err := conn.Channel()
	if err != nil {
		panic(err)
	}
	deliveries, err := ch.Consume(name, "", false, false, false, false, nil) // manual acks
	if err != nil {
		panic(err)
	}
	for i := 1; i <= 2; i++ {
		disp, err := q.Handle(ctx, <-deliveries, sendWelcome)
		if err != nil {
			panic(err)
		}
		fmt.Printf("delivery %d: %s\n", i, disp.Action)
	}
	ch.Close()
	fmt.Println("emails sent:", sent)
	// Output:
	// delivery 1: ack
	// delivery 2: ack
	// emails sent: 1
}

func deleteExampleQueues(conn *amqp.Connection, names []string) {
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	defer ch.Close()
	for _, n := range names {
		ch.QueueDelete(n, false, false, false)
	}
}
