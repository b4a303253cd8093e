// Command quickstart shows the core of once in one screen: a job
// delivered three times sends its email once, and every delivery gets the
// same message id back. It uses the embedded SQLite store in a temporary
// directory, so it needs no server.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/oncehq/once"
	"github.com/oncehq/once/sqlite"
)

func main() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "once-quickstart")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	store, err := sqlite.Open(filepath.Join(dir, "once.db"), sqlite.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	client, err := once.New(once.Config{Store: store})
	if err != nil {
		log.Fatal(err)
	}

	welcome := once.Intent{
		Run:     "signup-4711",
		Kind:    "send_email",
		Target:  "ada@example.com",
		Payload: map[string]string{"subject": "Welcome", "body": "Hello Ada"},
	}
	sent := 0
	send := func(ctx context.Context, a once.Attempt) (string, error) {
		sent++ // here: hand the message to your SMTP server or email API
		return fmt.Sprintf("msg-%d", sent), nil
	}

	for delivery := 1; delivery <= 3; delivery++ {
		res, err := once.Do(ctx, client, welcome, send)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("delivery %d: message %s, replayed %v\n", delivery, res.Value, res.Replayed)
	}
	fmt.Printf("emails sent: %d (key %.16s…)\n", sent, must(once.KeyOf(welcome)))
}

func must(k once.Key, _ once.Fingerprint, err error) once.Key {
	if err != nil {
		log.Fatal(err)
	}
	return k
}
