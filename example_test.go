package once_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/sqlite"
)

// client opens an embedded store in a temporary directory.
func client() (*once.Client, func()) {
	c, _, done := clientWith(once.Config{})
	return c, done
}

// clientWith opens an embedded store in a temporary directory and a
// client over it configured by cfg.
func clientWith(cfg once.Config) (*once.Client, *sqlite.Store, func()) {
	dir, _ := os.MkdirTemp("", "once-example")
	store, err := sqlite.Open(filepath.Join(dir, "once.db"), sqlite.Config{})
	if err != nil {
		panic(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		panic(err)
	}
	cfg.Store = store
	c, err := once.New(cfg)
	if err != nil {
		panic(err)
	}
	return c, store, func() { store.Close(); os.RemoveAll(dir) }
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

// An agent's tool call is sent twice, the second while the first still
// runs. With WaitFor the second waits for the first's result instead of
// an *InFlightError, and the charge is made once.
func ExampleWaitFor() {
	waiting := make(chan struct{})
	c, _, done := clientWith(once.Config{Hooks: once.Hooks{OnEvent: func(_ context.Context, o once.Observation) {
		if o.Type == once.EventWaiting {
			close(waiting) // the second call waits now
		}
	}}})
	defer done()
	ctx := context.Background()

	charge := once.Intent{Run: "agent-run-7", Step: 3, Kind: "charge_card", Target: "cus_42", Payload: map[string]int{"cents": 1999}}
	first, charging := make(chan string), make(chan struct{})
	go func() {
		res, err := once.Do(ctx, c, charge, func(ctx context.Context, a once.Attempt) (string, error) {
			fmt.Println("charging, attempt", a.Number)
			close(charging)
			<-waiting // a slow provider, still working when the second call comes
			return "ch_1", nil
		})
		if err != nil {
			first <- "error: " + err.Error()
			return
		}
		first <- fmt.Sprintf("first call: %s (replayed: %v)", res.Value, res.Replayed)
	}()

	<-charging
	res, err := once.Do(ctx, c, charge, func(ctx context.Context, a once.Attempt) (string, error) {
		return "", errors.New("not run: the first call's result is replayed")
	}, once.WaitFor(10*time.Second))
	fmt.Println(<-first)
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	fmt.Printf("second call: %s (replayed: %v)\n", res.Value, res.Replayed)
	// Output:
	// charging, attempt 1
	// first call: ch_1 (replayed: false)
	// second call: ch_1 (replayed: true)
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
	// 2d006585b492e8d9faa9791fa7ebec5a1acc43d6e649b3791c2a0348486f8958
	// a57747eec186256b4475e4e368d778613adce30d8441a01c67a8dc2d66cac933
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

// DoTx joins the caller's transaction, for an effect that is a write to
// the same database: the claim, the outbox row and the stored result
// commit together, so there is no moment at which the row exists but its
// record does not. The redelivered job gets the stored result back.
func ExampleDoTx() {
	c, s, done := clientWith(once.Config{})
	defer done()
	ctx := context.Background()
	if _, err := s.DB().ExecContext(ctx, `CREATE TABLE outbox (key TEXT PRIMARY KEY, body TEXT)`); err != nil {
		panic(err)
	}

	in := once.Intent{Run: "order-7", Kind: "outbox_write", Target: "shipping", Payload: "order 7 shipped"}
	write := func(ctx context.Context, tx *sql.Tx, a once.Attempt) (int64, error) {
		r, err := tx.ExecContext(ctx, `INSERT INTO outbox (key, body) VALUES (?, ?)`, string(a.Key), "order 7 shipped")
		if err != nil {
			return 0, err
		}
		return r.LastInsertId()
	}
	for delivery := 1; delivery <= 2; delivery++ {
		tx, err := s.DB().BeginTx(ctx, nil)
		if err != nil {
			panic(err)
		}
		res, err := once.DoTx(ctx, c, s, tx, in, write)
		if err != nil {
			tx.Rollback() // nothing was recorded: the claim goes with the write
			fmt.Println("error:", err)
			return
		}
		if err := tx.Commit(); err != nil {
			panic(err)
		}
		fmt.Printf("delivery %d: outbox row %d (replayed: %v)\n", delivery, res.Value, res.Replayed)
	}
	var rows int
	s.DB().QueryRowContext(ctx, `SELECT count(*) FROM outbox`).Scan(&rows)
	fmt.Println("outbox rows:", rows)
	// Output:
	// delivery 1: outbox row 1 (replayed: false)
	// delivery 2: outbox row 1 (replayed: true)
	// outbox rows: 1
}

// chat stands for a messaging API that can be asked whether a message
// posted with a given idempotency key arrived.
type chat struct{ posted map[string]string }

// find is the kind's Verifier: it looks the attempt's provider key up.
func (ch *chat) find(_ context.Context, a once.Action) (bool, json.RawMessage, error) {
	id, ok := ch.posted[string(a.Key)] // Attempt.ProviderKey is the action's key
	if !ok {
		return false, nil, nil // no trace of it: retried
	}
	result, err := json.Marshal(id)
	return true, result, err // landed: stored as if the effect had returned id
}

// Under VerifyThenDecide an effect whose outcome is unknown is not put up
// for review: its kind's Verifier asks the provider. Here the message
// arrived but the reply was lost; the next delivery asks, finds it, and
// gets its id back without posting again.
func ExampleVerifier() {
	ch := &chat{posted: map[string]string{}}
	c, _, done := clientWith(once.Config{Kinds: map[string]once.KindPolicy{
		"post_message": {Recovery: once.VerifyThenDecide, Verifier: ch.find},
	}})
	defer done()
	ctx := context.Background()

	in := once.Intent{Run: "incident-3", Kind: "post_message", Target: "#ops", Payload: "disk full on db-2"}
	posts := 0
	post := func(ctx context.Context, a once.Attempt) (string, error) {
		posts++
		ch.posted[a.ProviderKey] = "msg-42"                        // the service took it…
		return "", errors.New("connection reset before the reply") // …and the reply was lost
	}
	_, err := once.Do(ctx, c, in, post)
	fmt.Println(errors.Is(err, once.ErrOutcomeUnknown))
	key, _, _ := once.KeyOf(in)
	a, _ := c.Get(ctx, key)
	fmt.Println(a.Status)

	time.Sleep(10 * time.Millisecond) // an unknown outcome is due for verification after a millisecond
	res, err := once.Do(ctx, c, in, post)
	fmt.Println(res.Value, res.Replayed, err, posts)
	// Output:
	// true
	// unknown
	// msg-42 true <nil> 1
}

// A reaper applies each kind's recovery to the actions nobody comes back
// for: claims whose worker died, and unknown outcomes that are due. Here
// two posts ended with an unknown outcome; the verifier finds one of them
// landed (it succeeds) and no trace of the other (it is released, and the
// next delivery posts it again).
func ExampleReaper_RunOnce() {
	ch := &chat{posted: map[string]string{}}
	c, _, done := clientWith(once.Config{Kinds: map[string]once.KindPolicy{
		"post_message": {Recovery: once.VerifyThenDecide, Verifier: ch.find},
	}})
	defer done()
	ctx := context.Background()

	landed := once.Intent{Run: "incident-4", Step: 0, Kind: "post_message", Target: "#ops", Payload: "paging"}
	lost := once.Intent{Run: "incident-4", Step: 1, Kind: "post_message", Target: "#ops", Payload: "resolved"}
	once.Do(ctx, c, landed, func(ctx context.Context, a once.Attempt) (string, error) {
		ch.posted[a.ProviderKey] = "msg-1"
		return "", errors.New("timeout reading the reply")
	})
	once.Do(ctx, c, lost, func(ctx context.Context, a once.Attempt) (string, error) {
		return "", errors.New("timeout reading the reply") // it never got there
	})
	time.Sleep(10 * time.Millisecond) // both are due for verification after a millisecond

	r, err := once.NewReaper(c, once.ReaperConfig{})
	if err != nil {
		panic(err)
	}
	rep, err := r.RunOnce(ctx)
	if err != nil {
		panic(err)
	}
	report, _ := json.Marshal(rep)
	fmt.Println(string(report))
	steps, _ := c.RunSteps(ctx, "incident-4")
	for _, a := range steps {
		fmt.Println(a.Step, a.Status)
	}
	// Output:
	// {"examined":2,"review":0,"released":1,"verified":1,"deferred":0,"changed":0,"redriven":0,"waiting":0,"awaiting_verifier":0,"expired":0,"by_kind":{"post_message":2}}
	// 0 succeeded
	// 1 released
}

// Hooks watch every transition: OnExecute wraps the effect (a tracer opens
// a span there), OnEvent sees each event, including replays, which are
// not written to the trail. JoinHooks runs several sets together.
func ExampleHooks() {
	logging := once.Hooks{OnEvent: func(_ context.Context, o once.Observation) {
		fmt.Printf("event %s: %s attempt %d\n", o.Type, o.Kind, o.Attempt)
	}}
	tracing := once.Hooks{OnExecute: func(ctx context.Context, o once.Observation) (context.Context, func(once.Observation, error)) {
		fmt.Println("span start:", o.Kind)
		return ctx, func(o once.Observation, err error) { fmt.Println("span end:", o.Type, err) }
	}}
	c, _, done := clientWith(once.Config{Hooks: once.JoinHooks(logging, tracing)})
	defer done()
	ctx := context.Background()

	in := once.Intent{Run: "signup-12", Kind: "send_email", Target: "ada@example.com", Payload: "welcome"}
	send := func(context.Context, once.Attempt) (string, error) { return "msg-7", nil }
	once.Do(ctx, c, in, send)
	once.Do(ctx, c, in, send) // a duplicate: replayed, the effect does not run
	// Output:
	// span start: send_email
	// event claimed: send_email attempt 1
	// event succeeded: send_email attempt 1
	// span end: succeeded <nil>
	// event replayed: send_email attempt 1
}

// On a graceful shutdown the effect's context is cancelled. An effect
// that knows it sent nothing returns RetryLater(ctx.Err()): the claim is
// released, the job goes back to its queue, and the next delivery, after
// the restart, runs it. (Returned as a plain error, the cancellation
// would be an unknown outcome: a person would be asked.)
func ExampleRetryLater_shutdown() {
	c, done := client()
	defer done()

	in := once.Intent{Run: "newsletter-9", Kind: "send_email", Target: "grace@example.com", Payload: "issue 9"}
	ctx, shutdown := context.WithCancel(context.Background())
	waiting := make(chan struct{})
	go func() { <-waiting; shutdown() }() // SIGTERM arrives while the effect waits
	slot := make(chan struct{})           // a rate limiter's slot that never frees up
	_, err := once.Do(ctx, c, in, func(ctx context.Context, a once.Attempt) (string, error) {
		close(waiting)
		select {
		case <-slot:
			return "msg-1", nil
		case <-ctx.Done():
			return "", once.RetryLater(ctx.Err()) // nothing was sent
		}
	})
	fmt.Println(errors.Is(err, once.ErrRetryLater), errors.Is(err, context.Canceled))

	// After the restart the queue delivers the job again.
	res, err := once.Do(context.Background(), c, in, func(ctx context.Context, a once.Attempt) (string, error) {
		return "msg-2", nil
	})
	fmt.Println(res.Value, res.Attempt, err)
	// Output:
	// true true
	// msg-2 2 <nil>
}

// An effect notes what a person would look for before it calls out: the
// note is the in-flight action's Error, and if the worker died here the
// review item's reason would carry it after "its lease expired".
func ExampleAttempt_Note() {
	c, store, done := clientWith(once.Config{})
	defer done()
	ctx := context.Background()

	charge := once.Intent{Run: "order-4711", Kind: "charge_card", Target: "cus_42", Payload: map[string]int{"cents": 1999}}
	_, err := once.Do(ctx, c, charge, func(ctx context.Context, a once.Attempt) (string, error) {
		if err := a.Note(ctx, "charging cus_42 with Idempotency-Key "+a.ProviderKey[:12]+"…"); errors.Is(err, once.ErrFenced) {
			return "", once.RetryLater(err) // the claim is lost: do not start
		}
		row, _ := store.Get(ctx, a.Key)
		fmt.Println("while it runs:", row.Status, "-", row.Error)
		return "ch_0001", nil
	})
	if err != nil {
		panic(err)
	}
	key, _, _ := once.KeyOf(charge)
	row, _ := store.Get(ctx, key)
	fmt.Printf("after: %s, note %q\n", row.Status, row.Error)
	// Output:
	// while it runs: in_flight - charging cus_42 with Idempotency-Key 53f2da502649…
	// after: succeeded, note ""
}

// A Redrive hook may run a released action itself with a Do of its own,
// for a job with no queue to publish it to again. The reaper marks the
// action re-driven before it calls the hook, so the trail says so before
// the hook's claim, and of several reapers only the one whose mark
// applied calls the hook and counts it.
func ExampleKindPolicy_redrive() {
	reminder := func(step int64) once.Intent {
		return once.Intent{Run: "invoice-88", Step: step, Kind: "send_email", Target: "ada@example.com", Payload: "your invoice is due"}
	}
	send := func(ctx context.Context, a once.Attempt) (string, error) {
		if a.Number == 1 {
			return "", once.RetryLater(errors.New("421 try again later"))
		}
		fmt.Println("sending, attempt", a.Number)
		return "msg-7", nil
	}
	var c *once.Client
	pol := once.KindPolicy{RedriveAfter: 50 * time.Millisecond, Redrive: func(ctx context.Context, a once.Action) error {
		_, err := once.Do(ctx, c, reminder(a.Step), send)
		return err // an error counts the action as waiting, and it is re-driven again later
	}}
	c, _, done := clientWith(once.Config{Kinds: map[string]once.KindPolicy{"send_email": pol}})
	defer done()
	ctx := context.Background()

	res, err := once.Do(ctx, c, reminder(0), send)
	fmt.Println(errors.Is(err, once.ErrRetryLater))
	time.Sleep(60 * time.Millisecond) // nobody delivers the job again within RedriveAfter

	r, err := once.NewReaper(c, once.ReaperConfig{})
	if err != nil {
		panic(err)
	}
	rep, err := r.RunOnce(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("re-driven:", rep.Redriven)
	events, _ := c.Events(ctx, res.Key)
	var trail []any
	for _, e := range events {
		trail = append(trail, e.Type)
	}
	fmt.Println(trail...)
	// Output:
	// true
	// sending, attempt 2
	// re-driven: 1
	// claimed released redriven claimed succeeded
}
