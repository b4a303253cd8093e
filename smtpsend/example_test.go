package smtpsend_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/smtpsend"
	"github.com/oncehq/once/sqlite"
)

// A welcome email sent through once.Do: the first delivery of the job
// sends it, a duplicate delivery gets the server's reply back without a
// second copy, and a server that defers the message releases the action
// for the next delivery instead of losing or doubling it.
func Example() {
	// A real SMTP server on loopback stands in for the mail relay.
	srv, stop, err := newServer(nil)
	if err != nil {
		panic(err)
	}
	defer stop()

	dir, err := os.MkdirTemp("", "smtpsend-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	store, err := sqlite.Open(filepath.Join(dir, "once.db"), sqlite.Config{})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	ctx := context.Background()
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}
	client, err := once.New(once.Config{Store: store})
	if err != nil {
		panic(err)
	}

	sender := &smtpsend.Sender{Addr: srv.addr(), Timeout: 30 * time.Second}
	intent := once.Intent{
		Run:     "signup-4711",
		Kind:    "send_email",
		Target:  "ada@example.com",
		Payload: map[string]string{"template": "welcome"},
	}
	send := func(ctx context.Context, a once.Attempt) (string, error) {
		return sender.Send(ctx, a, smtpsend.Message{
			From:    "noreply@example.com",
			To:      []string{"ada@example.com"},
			Subject: "Welcome",
			Body:    []byte("Hello Ada\n"),
		})
	}

	// The relay is busy at first: 421 on MAIL FROM.
	srv.setFailure(failure{mail: reply(421, "try again later")})
	_, err = once.Do(ctx, client, intent, send)
	fmt.Println("busy relay, retry later:", errors.Is(err, once.ErrRetryLater))

	srv.setFailure(failure{})
	for delivery := 2; delivery <= 3; delivery++ {
		res, err := once.Do(ctx, client, intent, send)
		if err != nil {
			panic(err)
		}
		fmt.Printf("delivery %d: %s (replayed %v)\n", delivery, res.Value, res.Replayed)
	}
	msgs := srv.messages()
	key, _, _ := once.KeyOf(intent)
	fmt.Println("copies received:", len(msgs))
	fmt.Println("Message-ID from the key:", msgs[0].Header.Get("Message-ID") == smtpsend.MessageID(key, ""))
	// Output:
	// busy relay, retry later: true
	// delivery 2: 250 2.0.0 OK: queued (replayed false)
	// delivery 3: 250 2.0.0 OK: queued (replayed true)
	// copies received: 1
	// Message-ID from the key: true
}
