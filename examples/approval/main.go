// Command approval shows an approval gate: a payment over a limit waits
// for a person before it is charged, and is charged once after they
// approve it, however often its job is delivered.
//
//	go run ./examples/approval [--db URL] [--limit CENTS]
//
// Three payment jobs are each delivered three times, as a queue that
// delivers at least once would deliver them. The one under the limit is
// charged at its first delivery, and the others replay its charge. The
// two over the limit (ApprovalPolicy.When looks at the amount) are not
// charged: once.Do returns *once.AwaitingApprovalError, the kind's
// OnAwaitingApproval hook tells the approvers (once, not at every
// delivery), and once.Dispose tells the worker to retry the job later.
// A person opens the approval queue (the actions awaiting approval, as
// the console lists them). Ada approves the first, and its next
// delivery charges it, once; a second approval is refused, naming who
// decided. Grace rejects the other, and every delivery after is told
// why.
//
// Here Client.Approve and Client.Reject stand in for the person. In
// production they decide in the console (once serve) or with once
// approve and once reject, which call the same two methods with the
// attempt and payload the person was shown (Approval.Attempt and
// Approval.Fingerprint), so a decision taken on a stale page is refused,
// and with Via "console" or "cli" for the action's trail. The worker
// needs no change: its next delivery finds the decision.
//
// The store is a SQLite file in the temporary directory, or --db (a
// SQLite path, or postgres://…). Run it again on the same store and
// every delivery replays: nothing is charged twice, nobody is asked
// twice. --hold-before-decide waits after the approvers were told, so
// the process can be killed before anyone decides: run again, the
// waiting payment is still in the approval queue, nobody is told a
// second time, and it is charged once after its approval.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/dburl"
)

func main() { os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr)) }

// payment is a job's body, and its intent's payload.
type payment struct {
	ID       string `json:"id"`
	Customer string `json:"customer"`
	Cents    int    `json:"cents"`
}

func (p payment) intent() once.Intent {
	return once.Intent{Run: p.ID, Kind: "charge", Target: p.Customer, Payload: p}
}

func (p payment) String() string {
	return fmt.Sprintf("%s (%d.%02d EUR to %s)", p.ID, p.Cents/100, p.Cents%100, p.Customer)
}

// run is the command; it returns the exit code: 2 for a usage error, 1
// when the store cannot be used.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("approval", flag.ContinueOnError)
	fs.SetOutput(stderr)
	db := fs.String("db", filepath.Join(os.TempDir(), "once-approval.db"), "the database `URL`: a SQLite file path, or postgres://user@host:5432/db (once_schema=NAME places the tables)")
	limit := fs.Int("limit", 1000_00, "charges over this many `CENTS` wait for a person's approval")
	hold := fs.Duration("hold-before-decide", 0, "wait this long after the approvers were asked, before anyone decides, to watch a crash there")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "approval: unexpected argument %q; the options are flags (approval -h lists them)\n", fs.Arg(0))
		return 2
	case *limit < 0:
		fmt.Fprintf(stderr, "approval: --limit %d: give a number of cents, 0 or more\n", *limit)
		return 2
	case *hold < 0:
		fmt.Fprintln(stderr, "approval: --hold-before-decide must not be negative")
		return 2
	}
	if err := story(ctx, *db, *limit, *hold, stdout); err != nil {
		fmt.Fprintln(stderr, "approval:", dburl.Redact(err.Error()))
		return 1
	}
	return 0
}

// story delivers the payments, and decides the ones over the limit as a
// person would.
func story(ctx context.Context, db string, limit int, hold time.Duration, out io.Writer) error {
	store, err := dburl.Open(ctx, db)
	if err != nil {
		return err
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	asked := 0 // the approvers asked during the last delivery
	client, err := once.New(once.Config{Store: store,
		Kinds: map[string]once.KindPolicy{"charge": {Recovery: once.RetryWithProviderKey, Approval: once.ApprovalPolicy{
			// Ask when the amount is over the limit, or cannot be read.
			When: func(in once.Intent) bool { p, ok := in.Payload.(payment); return !ok || p.Cents > limit },
		}}},
		// Tell the approvers, once per action: in a real service, a
		// message to them.
		Hooks: once.Hooks{OnAwaitingApproval: func(_ context.Context, a once.Action) {
			asked++
			fmt.Fprintf(out, "  approvers asked about %s, until %s (key %.12s)\n", a.Run, a.LeaseUntil.UTC().Format("2006-01-02 15:04:05Z"), a.Key)
		}},
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "approval: %s; charges over %d.%02d EUR wait for a person\n", store.Name, limit/100, limit%100)

	charged := 0
	charge := func(_ context.Context, a once.Attempt) (string, error) {
		charged++ // here: the payment provider, called with a.ProviderKey
		return "ch_" + a.ProviderKey[:8], nil
	}
	deliver := func(p payment, n int) error {
		res, err := once.Do(ctx, client, p.intent(), charge)
		d := once.Dispose(err)
		var (
			awaiting *once.AwaitingApprovalError
			failed   *once.FailedError
		)
		switch {
		case err == nil && res.Replayed:
			fmt.Fprintf(out, "%s delivery %d: replayed %s; ack\n", p.ID, n, res.Value)
		case err == nil:
			fmt.Fprintf(out, "%s delivery %d: charged %s as %s; ack\n", p.ID, n, p, res.Value)
		case errors.As(err, &awaiting):
			fmt.Fprintf(out, "%s delivery %d: awaits approval, nothing charged; %s after %v\n", p.ID, n, d.Action, d.After.Round(time.Second))
		case errors.As(err, &failed):
			fmt.Fprintf(out, "%s delivery %d: not charged: %s; %s\n", p.ID, n, failed.Message, d.Action)
		default:
			return err // the store failed: a worker would retry the job
		}
		return nil
	}
	payments := []payment{
		{ID: "pay-1", Customer: "cus_ada", Cents: 120_00},
		{ID: "pay-2", Customer: "cus_grace", Cents: 2500_00},
		{ID: "pay-3", Customer: "cus_edsger", Cents: 9900_00},
	}
	for _, p := range payments {
		if err := deliver(p, 1); err != nil {
			return err
		}
		if asked > 0 && hold > 0 {
			fmt.Fprintf(out, "  holding %v before anyone decides\n", hold)
			time.Sleep(hold)
		}
		if err := decide(ctx, client, p, out); err != nil {
			return err
		}
		for n := 2; n <= 3; n++ {
			if err := deliver(p, n); err != nil {
				return err
			}
		}
		asked = 0
	}
	fmt.Fprintf(out, "charges made: %d\n", charged)
	return nil
}

// decide is the person: they open the approval queue (the actions
// awaiting approval, as the console lists them), find the payment, and
// decide it. Ada approves pay-2, and a second approval is refused,
// naming who decided; grace rejects pay-3. Each decision carries the
// attempt and payload the queue showed, as the console's Approve and
// Reject buttons do.
func decide(ctx context.Context, client *once.Client, p payment, out io.Writer) error {
	queue, err := client.List(ctx, once.Filter{Status: once.StatusAwaitingApproval, Run: p.ID})
	if err != nil {
		return err
	}
	for _, a := range queue {
		seen := once.Approval{Attempt: a.Attempt, Fingerprint: a.Fingerprint}
		if p.ID == "pay-3" {
			seen.By, seen.Note = "grace", "over the customer's credit line"
			if _, err := client.Reject(ctx, a.Key, seen); err != nil {
				return err
			}
			fmt.Fprintf(out, "  grace rejects %s: %s\n", p, seen.Note)
			continue
		}
		seen.By = "ada"
		if _, err := client.Approve(ctx, a.Key, seen); err != nil {
			return err
		}
		fmt.Fprintf(out, "  ada approves %s\n", p)
		seen.By = "grace" // a second approver, on a page loaded before ada's click
		_, err := client.Approve(ctx, a.Key, seen)
		if !errors.Is(err, once.ErrConflict) {
			return fmt.Errorf("a second approval of %s: %v; want it refused", p.ID, err)
		}
		fmt.Fprintf(out, "  grace approves it too: %v\n", err)
	}
	return nil
}
