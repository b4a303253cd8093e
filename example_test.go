package once_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/oncehq/once"
	"github.com/oncehq/once/sqlite"
)

// client opens an embedded store in a temporary directory.
func client() (*once.Client, func()) {
	dir, _ := os.MkdirTemp("", "once-example")
	store, err := sqlite.Open(filepath.Join(dir, "once.db"), sqlite.Config{})
	if err != nil {
		panic(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		panic(err)
	}
	c, err := once.New(once.Config{Store: store})
	if err != nil {
		panic(err)
	}
	return c, func() { store.Close(); os.RemoveAll(dir) }
}

// A job is delivered twice; the email goes out once, and the second
// delivery gets the first one's message id back.
func ExampleDo() {
	c, done := client()
	defer done()
	ctx := context.Background()

	welcome := once.Intent{
		Run:     "signup-4711",
		Step:    0,
		Kind:    "send_email",
		Target:  "ada@example.com",
		Payload: map[string]string{"subject": "Welcome", "body": "Hello Ada"},
	}
	send := func(ctx context.Context, a once.Attempt) (string, error) {
		fmt.Println("sending, attempt", a.Number)
		return "msg-0001", nil // the provider's message id
	}

	for delivery := 1; delivery <= 2; delivery++ {
		res, err := once.Do(ctx, c, welcome, send)
		if err != nil {
			fmt.Println("error:", err)
			return
		}
		fmt.Printf("delivery %d: %s (replayed: %v)\n", delivery, res.Value, res.Replayed)
	}
	// Output:
	// sending, attempt 1
	// delivery 1: msg-0001 (replayed: false)
	// delivery 2: msg-0001 (replayed: true)
}

// An agent that regenerates the body on retry does not send a second,
// different email: the changed payload is refused.
func ExampleDo_fingerprint() {
	c, done := client()
	defer done()
	ctx := context.Background()

	in := once.Intent{Run: "agent-run-9", Step: 2, Kind: "send_email", Target: "grace@example.com", Payload: "Dear Grace, …"}
	send := func(context.Context, once.Attempt) (bool, error) { return true, nil }
	once.Do(ctx, c, in, send)

	in.Payload = "Hi Grace! (rewritten by the model)"
	_, err := once.Do(ctx, c, in, send)
	fmt.Println(errors.Is(err, once.ErrFingerprintMismatch))
	// Output: true
}

// RetryLater says the effect did not happen: the claim is released and
// the next delivery tries again with the same provider idempotency key.
func ExampleRetryLater() {
	c, done := client()
	defer done()
	ctx := context.Background()

	in := once.Intent{Run: "invoice-17", Kind: "charge_card", Target: "cus_42", Payload: map[string]int{"amount": 1999}}
	var keys []string
	charge := func(ctx context.Context, a once.Attempt) (string, error) {
		keys = append(keys, a.ProviderKey) // sent as Stripe's Idempotency-Key
		if a.Number == 1 {
			return "", once.RetryLater(errors.New("429 rate limited"))
		}
		return "ch_1", nil
	}
	_, err := once.Do(ctx, c, in, charge)
	fmt.Println(errors.Is(err, once.ErrRetryLater))
	res, _ := once.Do(ctx, c, in, charge)
	fmt.Println(res.Value, res.Attempt, keys[0] == keys[1])
	// Output:
	// true
	// ch_1 2 true
}

// Permanent says the effect did not happen and never will; every
// duplicate gets the same failure back.
func ExamplePermanent() {
	c, done := client()
	defer done()
	ctx := context.Background()

	in := once.Intent{Run: "r", Kind: "send_email", Target: "nobody@invalid"}
	send := func(context.Context, once.Attempt) (string, error) {
		return "", once.Permanent(errors.New("550 no such mailbox"))
	}
	once.Do(ctx, c, in, send)
	_, err := once.Do(ctx, c, in, send)
	var failed *once.FailedError
	if errors.As(err, &failed) {
		fmt.Println(failed.Message, failed.Replayed)
	}
	// Output: 550 no such mailbox true
}

// KeyOf computes the key and fingerprint without touching a database.
func ExampleKeyOf() {
	key, fp, _ := once.KeyOf(once.Intent{Run: "run-1", Step: 2, Kind: "send_email", Target: "ada@example.com", Payload: []byte(`{"subject":"hi"}`)})
	fmt.Println(key)
	fmt.Println(fp)
	// Output:
	// 0a3c3c42b6236f4ce825ed6954cf0ff3f9df2e723e31a81d485a3f26b34bf790
	// 1b9565f2e170e86a7524d3b864f3506c3cee7192d334e1447ab8901a4eff471e
}

// A run numbers its steps in call order: run again after a crash, it
// re-executes only the steps that never succeeded.
func ExampleRun_Next() {
	c, done := client()
	defer done()
	ctx := context.Background()

	agent := func(crashAfter int) {
		run := c.Run("agent-run-7")
		for i, to := range []string{"ada@example.com", "grace@example.com", "alan@example.com"} {
			if i == crashAfter {
				fmt.Println("crash")
				return
			}
			once.Do(ctx, c, run.Next(once.Intent{Kind: "send_email", Target: to, Payload: "hello"}), func(context.Context, once.Attempt) (string, error) {
				fmt.Println("sending to", to)
				return "sent", nil
			})
		}
	}
	agent(2) // dies before the third email
	agent(-1)

	steps, _ := c.Run("agent-run-7").Steps(ctx)
	for _, s := range steps {
		fmt.Println(s.Step, s.Target, s.Status)
	}
	// Output:
	// sending to ada@example.com
	// sending to grace@example.com
	// crash
	// sending to alan@example.com
	// 0 ada@example.com succeeded
	// 1 grace@example.com succeeded
	// 2 alan@example.com succeeded
}

// An email whose outcome is unknown waits for a person, who checks the
// mail server's log and records what happened; duplicates then replay it.
func ExampleClient_Resolve() {
	c, done := client()
	defer done()
	ctx := context.Background()

	in := once.Intent{Run: "r", Kind: "send_email", Target: "ada@example.com"}
	send := func(context.Context, once.Attempt) (string, error) {
		return "", errors.New("connection reset after DATA") // did the server take it?
	}
	_, err := once.Do(ctx, c, in, send)
	fmt.Println(errors.Is(err, once.ErrOutcomeUnknown))
	_, err = once.Do(ctx, c, in, send)
	fmt.Println(errors.Is(err, once.ErrReview))

	key, _, _ := once.KeyOf(in)
	a, _ := c.Resolve(ctx, key, once.Resolution{Decision: once.DecisionDone, Result: []byte(`"250 queued as 4711"`), By: "ada", Note: "found in the mail log"})
	fmt.Println(a.Status, a.ResolvedBy)

	res, _ := once.Do(ctx, c, in, send)
	fmt.Println(res.Value, res.Replayed)
	// Output:
	// true
	// true
	// succeeded ada
	// 250 queued as 4711 true
}
