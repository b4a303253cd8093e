package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/idemhttp"
	"github.com/oncehq/once/smtpsend"
)

// The order the run takes through its steps. A real agent would have it
// from its conversation; what matters here is that a resumed run sees the
// same order, so every step presents the same intent again.
const (
	customerEmail = "ada@example.com"
	customerName  = "Ada Lovelace"
	warehouse     = "warehouse@example.com"
	item          = "1 × brass desk lamp"
	amountCents   = 4200
	currency      = "eur"
)

// agent carries out one run.
type agent struct {
	opts   options
	client *once.Client
	db     *database
	// run numbers the steps: the n-th external call of the run is step
	// n, on every try of the run. A tool-call id that the model invents
	// (call_…) is new on every turn, so a key made from it would make a
	// resumed run's calls new actions and do them all again; it is shown
	// in the transcript to make that plain, and never enters a key.
	run   *once.Run
	out   io.Writer
	mail  *smtpsend.Sender
	http  *http.Client
	lines <-chan string // stdin's lines, with --pause-before-each-step

	steps int    // steps finished
	ran   int    // of which ran in this process (not replayed)
	note  string // what the running step's effect has to add to its line
	why   string // why the running step's effect did not happen this time, for the waiting line
}

// takeOrder is the run: its calls in the same order on every try, so
// Run.Next hands each the same step number.
func (a *agent) takeOrder(ctx context.Context) error {
	if _, err := a.email(ctx, customerEmail, "We received your order "+a.opts.run,
		fmt.Sprintf("Hello %s,\n\nwe received your order %s: %s, %s.\nWe will charge your card and send you a receipt.\n", customerName, a.opts.run, item, money(amountCents))); err != nil {
		return err
	}
	customer, err := a.createCustomer(ctx)
	if err != nil {
		return err
	}
	charge, err := a.charge(ctx, customer.ID)
	if err != nil {
		return err
	}
	orderID, err := a.recordOrder(ctx, customer.ID, charge.ID)
	if err != nil {
		return err
	}
	if _, err := a.email(ctx, customerEmail, "Your receipt for order "+a.opts.run,
		fmt.Sprintf("Hello %s,\n\nwe charged %s for %s (charge %s). Your order number is %d.\n", customerName, money(amountCents), item, charge.ID, orderID)); err != nil {
		return err
	}
	_, err = a.email(ctx, warehouse, fmt.Sprintf("Ship order %d (%s)", orderID, a.opts.run),
		fmt.Sprintf("Order %d (%s), paid with charge %s:\n%s to %s <%s>.\n", orderID, a.opts.run, charge.ID, item, customerName, customerEmail))
	return err
}

func money(cents int64) string { return fmt.Sprintf("%d.%02d EUR", cents/100, cents%100) }

// mail is an email step's payload: what the message says. It is
// fingerprinted beside the key, so a run that came back with a different
// text for the same step (a model rarely writes the same words twice) is
// refused, not sent a second, different email.
type mail struct {
	From    string `json:"from"`
	To      string `json:"to"`
	Subject string `json:"subject"`
	Body    string `json:"body"`
}

// email sends one message as one step. smtpsend writes the Message-ID
// from the action's key, so every attempt of the step sends the same
// Message-ID, and a person can search the mailbox for it.
func (a *agent) email(ctx context.Context, to, subject, body string) (string, error) {
	m := mail{From: a.opts.from, To: to, Subject: subject, Body: body}
	in := a.run.Next(once.Intent{Kind: "send_email", Target: to, Payload: m})
	return step(ctx, a, in, func(v string) string { return v }, func(ctx context.Context) (once.Result[string], error) {
		return once.Do(ctx, a.client, in, func(ctx context.Context, at once.Attempt) (string, error) {
			// Send's errors are classified by the stage they happened
			// at; return them unchanged.
			return a.mail.Send(ctx, at, smtpsend.Message{From: m.From, To: []string{m.To}, Subject: m.Subject, Body: []byte(m.Body)})
		})
	})
}

// object is what the provider returns for a customer or a charge.
type object struct {
	ID string `json:"id"`
}

// createCustomer creates the customer at the provider.
func (a *agent) createCustomer(ctx context.Context) (object, error) {
	body := map[string]string{"email": customerEmail, "name": customerName}
	in := a.run.Next(once.Intent{Kind: "create_customer", Target: customerEmail, Payload: body})
	return a.callProvider(ctx, in, "/v1/customers", body)
}

// charge charges the customer. Its payload holds the customer id step 1
// returned, which a resumed run gets back replayed: the same intent.
func (a *agent) charge(ctx context.Context, customer string) (object, error) {
	body := map[string]any{"customer": customer, "amount": amountCents, "currency": currency}
	in := a.run.Next(once.Intent{Kind: "charge_card", Target: customer, Payload: body})
	return a.callProvider(ctx, in, "/v1/charges", body)
}

// callProvider makes one provider call as one step.
func (a *agent) callProvider(ctx context.Context, in once.Intent, path string, body any) (object, error) {
	return step(ctx, a, in, func(o object) string { return o.ID }, func(ctx context.Context) (once.Result[object], error) {
		return once.Do(ctx, a.client, in, func(ctx context.Context, at once.Attempt) (object, error) {
			o, replayed, err := a.post(ctx, at, path, body)
			if replayed {
				// This attempt sent the call again after an attempt
				// died in it; the provider absorbed the duplicate.
				a.note = "the provider answered the retried call from its idempotency store"
			}
			return o, err
		})
	})
}

// post sends one request with the attempt's provider key and classifies
// its answer for once.Do.
func (a *agent) post(ctx context.Context, at once.Attempt, path string, body any) (object, bool, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return object{}, false, once.Permanent(err)
	}
	// The provider key is the same on every attempt of the step, and
	// idemhttp.Transport sends it as Idempotency-Key. (Without the
	// transport, idemhttp.SetKey(req, at) sets the header on one request.)
	req, err := http.NewRequestWithContext(idemhttp.WithKey(ctx, at.ProviderKey), http.MethodPost, a.opts.provider+path, bytes.NewReader(b))
	if err != nil {
		return object{}, false, once.Permanent(fmt.Errorf("provider request: %w; check --provider", err))
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.http.Do(req)
	if err != nil {
		// The request may have reached the provider, or not: an unknown
		// outcome. RetryWithProviderKey sends it again with the same key,
		// which the provider absorbs if the first one landed.
		return object{}, false, fmt.Errorf("provider POST %s: %w", path, err)
	}
	defer resp.Body.Close()
	text, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return object{}, false, fmt.Errorf("provider POST %s: reading the answer: %w", path, err)
	}
	switch {
	case resp.StatusCode/100 == 2:
		var o object
		if err := json.Unmarshal(text, &o); err != nil || o.ID == "" {
			return object{}, false, fmt.Errorf("provider POST %s: answered %d without an object id: %.200s", path, resp.StatusCode, text)
		}
		return o, resp.Header.Get(idemhttp.ReplayedHeader) == "true", nil
	case resp.StatusCode == http.StatusConflict, resp.StatusCode == http.StatusTooManyRequests, resp.StatusCode == http.StatusServiceUnavailable:
		// Not taken this time (a call with this key still in progress,
		// a rate limit): nothing new happened; try again later, with the
		// same key.
		a.why = fmt.Sprintf("the provider answered %s (%s); the same call goes again with the same key", resp.Status, detail(text))
		return object{}, false, once.RetryLater(fmt.Errorf("provider POST %s: %s: %.200s", path, resp.Status, text))
	case resp.StatusCode/100 == 4:
		return object{}, false, once.Permanent(fmt.Errorf("provider POST %s refused the call: %s: %.200s", path, resp.Status, text))
	default:
		return object{}, false, fmt.Errorf("provider POST %s: %s: %.200s", path, resp.Status, text)
	}
}

// detail is the gist of an error answer: the first clause of its problem
// detail (RFC 9457) or error field when it is JSON, else of its text.
func detail(text []byte) string {
	var p struct {
		Detail string `json:"detail"`
		Error  string `json:"error"`
	}
	s := string(text)
	if json.Unmarshal(text, &p) == nil && (p.Detail != "" || p.Error != "") {
		s = p.Detail + p.Error
	}
	s, _, _ = strings.Cut(s, ";")
	if r := []rune(s); len(r) > 100 {
		s = string(r[:100]) + "…"
	}
	return s
}

// recordOrder writes the order row with DoTx, in the same database as the
// ledger: the row and the step's record commit together.
func (a *agent) recordOrder(ctx context.Context, customer, charge string) (int64, error) {
	o := orderRow{Run: a.opts.run, Customer: customer, Charge: charge, Amount: amountCents, Currency: currency}
	in := a.run.Next(once.Intent{Kind: "record_order", Target: a.opts.run, Payload: o})
	return step(ctx, a, in, func(id int64) string { return fmt.Sprintf("order %d", id) }, func(ctx context.Context) (once.Result[int64], error) {
		return a.db.writeOrder(ctx, a.client, in, o)
	})
}

// step carries out one step: pause if asked, then call do until
// once.Dispose says the step is finished, waiting as it says in between,
// and write the step's line of the transcript.
func step[T any](ctx context.Context, a *agent, in once.Intent, show func(T) string, do func(context.Context) (once.Result[T], error)) (T, error) {
	var zero T
	key, _, err := once.KeyOf(in)
	if err != nil {
		return zero, err
	}
	if err := a.pause(ctx, fmt.Sprintf("before step %d (%s)", in.Step, in.Kind)); err != nil {
		return zero, err
	}
	call := toolCallID()
	a.note, a.why = "", ""
	head := fmt.Sprintf("step %d  %-15s %-22s", in.Step, in.Kind, in.Target)
	deadline := time.Now().Add(a.opts.stepTimeout)
	backoff := 100 * time.Millisecond
	for {
		res, err := do(ctx)
		d := once.Dispose(err)
		switch d.Action {
		case once.JobAck:
			if err != nil && !errors.Is(err, once.ErrFenced) {
				fmt.Fprintf(a.out, "%s failed    key %.12s  %s  %v\n", head, key, call, err)
				return zero, err
			}
			how := "ran     "
			if res.Replayed {
				how = "replayed"
			} else {
				a.ran++
			}
			var notes []string
			if res.Attempt > 1 && !res.Replayed {
				notes = append(notes, fmt.Sprintf("attempt %d", res.Attempt))
			}
			if a.note != "" {
				notes = append(notes, a.note)
			}
			note := ""
			if len(notes) > 0 {
				note = " (" + strings.Join(notes, "; ") + ")"
			}
			fmt.Fprintf(a.out, "%s %s  key %.12s  %s  %s%s\n", head, how, key, call, show(res.Value), note)
			a.steps++
			return res.Value, nil
		case once.JobDrop:
			if errors.Is(err, once.ErrFingerprintMismatch) || errors.Is(err, once.ErrInvalidIntent) {
				// The step is not what it was when it first ran (the
				// run's code changed, or it does not make its calls the
				// same way each time): nothing a person can decide
				// about the action; the run itself must be fixed.
				fmt.Fprintf(a.out, "%s refused   key %.12s  %s  %v\n", head, key, call, err)
				return zero, err
			}
			fmt.Fprintf(a.out, "%s review    key %.12s  %s  %s\n", head, key, call, d.Reason)
			a.explainReview(in, key, err)
			return zero, &needsPerson{err}
		}
		wait := max(d.After, backoff)
		if time.Until(deadline) < wait {
			fmt.Fprintf(a.out, "%s gave up   key %.12s  after --step-timeout %v: %v\n", head, key, a.opts.stepTimeout, err)
			return zero, fmt.Errorf("step %d did not finish within --step-timeout %v: %w", in.Step, a.opts.stepTimeout, err)
		}
		why := d.Reason
		if a.why != "" {
			why, a.why = a.why, ""
		}
		fmt.Fprintf(a.out, "%s waiting   key %.12s  %v: %s\n", head, key, wait.Round(10*time.Millisecond), why)
		select {
		case <-ctx.Done():
			return zero, context.Cause(ctx)
		case <-time.After(wait):
		}
		backoff = min(backoff*2, 2*time.Second)
	}
}

// explainReview says what a person checks for a step put up for review,
// and how to record what they found.
func (a *agent) explainReview(in once.Intent, key once.Key, err error) {
	fmt.Fprintf(a.out, "  %v\n", err)
	result := ""
	if in.Kind == "send_email" {
		fmt.Fprintf(a.out, "  the message may have reached the server: search %s's mailbox (or the server's log)\n", in.Target)
		fmt.Fprintf(a.out, "  for Message-ID %s, then record what you found and run again:\n", smtpsend.MessageID(key, ""))
		result = ` --result '"found in the mailbox"'`
	} else {
		fmt.Fprintf(a.out, "  find out whether the step's effect happened, then record it and run again:\n")
	}
	db := a.opts.db
	if isPostgres(db) {
		db = "<the same postgres URL>"
	}
	fmt.Fprintf(a.out, "    once resolve %s --db %s --done%s --note '...'   # it happened\n", key, db, result)
	fmt.Fprintf(a.out, "    once resolve %s --db %s --retry --note '...'   # it did not: do it again\n", key, db)
}

// pause, with --pause-before-each-step, prints a line starting with
// "pause:" and waits for a line on stdin (or its end).
func (a *agent) pause(ctx context.Context, where string) error {
	if a.lines == nil {
		return nil
	}
	fmt.Fprintf(a.out, "pause: %s; press Enter to go on\n", where)
	select {
	case <-a.lines:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// toolCallID makes up an id the way a model names its tool calls: new
// every time, which is why it is never part of a key.
func toolCallID() string {
	return "call_" + rand.Text()[:8]
}
