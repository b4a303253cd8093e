package riverjob_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"sync/atomic"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/oncehq/once"
	"github.com/oncehq/once/postgres"
	"github.com/oncehq/once/riverjob"
)

// The once client, its Redrive hook, the worker and the River client,
// wired with one River client: the hook needs the River client to
// insert with, and the River client's workers need the once client, so
// the hook gets a LateInserter that is Set once the River client is
// built. A welcome email whose reply was lost goes to review (its job is
// cancelled); a person's Retry releases it, and the reaper re-drives it
// through the hook: a new job sends it.
//
// RescueStuckJobsAfter is set from the kind's MaxExecution: River's
// default (one hour) leaves the job of a killed worker running, for
// nobody, for that long.
func Example_wiring() {
	ctx := context.Background()
	pool, schema, cleanup, err := exampleDatabase(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer cleanup()
	store, err := postgres.New(pool, postgres.Config{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	var ins riverjob.LateInserter // Set below, once the River client exists
	client, err := once.New(once.Config{Store: store, Kinds: map[string]once.KindPolicy{
		"send_email": {
			Recovery: once.AskPerson, // plain SMTP cannot be asked whether it delivered
			Redrive: riverjob.Redrive(&ins, func(a once.Action) (river.JobArgs, *river.InsertOpts, error) {
				var args WelcomeArgs // the intent's payload is the args
				err := json.Unmarshal(a.Payload, &args)
				args.Redriven = riverjob.RedrivenFrom(a)
				return args, nil, err
			}),
			RedriveAfter: 10 * time.Millisecond, // short for the example; the default is 5 minutes
		},
	}})
	if err != nil {
		log.Fatal(err)
	}
	var sent atomic.Int32
	worker, err := riverjob.NewWorker(riverjob.WorkerConfig[WelcomeArgs, string]{
		Client: client,
		Intent: func(job *river.Job[WelcomeArgs]) once.Intent {
			return once.Intent{Run: "welcome-" + job.Args.UserID, Kind: "send_email", Target: job.Args.Email, Payload: job.Args}
		},
		Effect: func(ctx context.Context, job *river.Job[WelcomeArgs], a once.Attempt) (string, error) {
			sent.Add(1)
			if a.Number == 1 {
				return "", errors.New("connection reset after the final dot") // it may have been delivered
			}
			return "250 queued", nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, worker)
	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Schema:  schema,
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 2}},
		Workers: workers,
		// Rescue a killed worker's job soon after its longest run: the
		// kind's MaxExecution, the worker's margin, and a minute.
		RescueStuckJobsAfter: client.Policy("send_email").MaxExecution + riverjob.TimeoutMargin + time.Minute,
		Logger:               quiet,
	})
	if err != nil {
		log.Fatal(err)
	}
	ins.Set(rc)
	events, unsubscribe := rc.Subscribe(river.EventKindJobCompleted, river.EventKindJobCancelled)
	defer unsubscribe()
	if err := rc.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer rc.Stop(ctx)
	wait := func() river.EventKind {
		select {
		case e := <-events:
			return e.Kind
		case <-time.After(30 * time.Second):
			log.Fatal("no job ended within 30s")
		}
		return ""
	}

	if _, err := rc.Insert(ctx, WelcomeArgs{UserID: "4712", Email: "grace@example.com"}, nil); err != nil {
		log.Fatal(err)
	}
	fmt.Println("first job:", wait())
	review, err := client.List(ctx, once.Filter{Status: once.StatusReview})
	if err != nil || len(review) != 1 {
		log.Fatalf("in review: %v, %v", review, err)
	}
	if _, err := client.Resolve(ctx, review[0].Key, once.Resolution{Decision: once.DecisionRetry, By: "ops", Note: "not in the mail log", Attempt: review[0].Attempt}); err != nil {
		log.Fatal(err)
	}
	reaper, err := once.NewReaper(client, once.ReaperConfig{})
	if err != nil {
		log.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		rep, err := reaper.RunOnce(ctx) // or reaper.Start(ctx), every ReaperConfig.Interval
		if err != nil || time.Now().After(deadline) {
			log.Fatalf("not re-driven within 30s: %v", err)
		}
		if rep.Redriven == 1 {
			break
		}
	}
	fmt.Println("re-driven job:", wait())
	a, err := client.Get(ctx, review[0].Key)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("action:", a.Status, "at attempt", a.Attempt, "; emails tried:", sent.Load())
	// Output:
	// first job: job_cancelled
	// re-driven job: job_completed
	// action: succeeded at attempt 2 ; emails tried: 2
}
