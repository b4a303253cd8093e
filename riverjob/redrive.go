package riverjob

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/oncehq/once"
)

// Inserter inserts River jobs. A *river.Client is one, whether it works
// jobs or only inserts them.
type Inserter interface {
	Insert(ctx context.Context, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error)
}

// LateInserter is an Inserter set after it is handed out. The wiring is
// circular: the once client's Redrive hook needs a River client to
// insert with, and the River client's workers need the once client.
// Give Redrive a LateInserter, build the once client, the workers and
// the River client, then Set it:
//
//	var ins riverjob.LateInserter
//	client, _ := once.New(once.Config{..., Redrive: riverjob.Redrive(&ins, build)})
//	worker, _ := riverjob.NewWorker(riverjob.WorkerConfig[A, R]{Client: client, ...})
//	rc, _ := river.NewClient(driver, &river.Config{Workers: workers, ...})
//	ins.Set(rc)
//
// A re-drive before Set is an error the reaper logs; it tries again on
// a later pass. It is safe for concurrent use.
type LateInserter struct {
	ins atomic.Pointer[Inserter]
}

// Set makes ins the inserter that re-drives use from now on.
func (l *LateInserter) Set(ins Inserter) { l.ins.Store(&ins) }

// Insert inserts with the inserter Set, or fails when none is.
func (l *LateInserter) Insert(ctx context.Context, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error) {
	p := l.ins.Load()
	if p == nil || *p == nil {
		return nil, errors.New("riverjob: the LateInserter was not Set yet; call Set with the River client once it is built")
	}
	return (*p).Insert(ctx, args, opts)
}

// Redriven marks a job that a re-drive inserted with the action and the
// attempt it re-drives. Embed it in the job's args and set it with
// RedrivenFrom in Redrive's build function:
//
//	type ChargeArgs struct {
//		OrderID string `json:"order_id"`
//		riverjob.Redriven
//	}
//
// Its fields are left out of the JSON while empty, so jobs inserted the
// usual way encode as before. In a re-driven job they make the args, and
// so River's unique key by args, differ per action and attempt: Redrive
// then inserts one job per released attempt however often the reaper
// calls it, and a later attempt is still re-driven. A Worker clears the
// mark before it calls Intent, so an intent whose payload is the whole
// args is the same for the original job and the re-driven one.
type Redriven struct {
	// OnceKey is the key of the action the job re-drives.
	OnceKey once.Key `json:"once_redrive_key,omitempty"`
	// OnceAttempt is the attempt that was released.
	OnceAttempt int `json:"once_redrive_attempt,omitempty"`
}

// RedrivenFrom returns the mark for a re-drive of a.
func RedrivenFrom(a once.Action) Redriven {
	return Redriven{OnceKey: a.Key, OnceAttempt: a.Attempt}
}

// redriveMark and clearRedriveMark are promoted to args that embed
// Redriven, which is how the package finds the mark in any args type.
func (r Redriven) redriveMark() Redriven { return r }
func (r *Redriven) clearRedriveMark()    { *r = Redriven{} }

type marked interface{ redriveMark() Redriven }
type clearable interface{ clearRedriveMark() }

// markOf returns the Redriven mark args carry: the zero Redriven when
// they carry none, or do not embed it.
func markOf(args any) Redriven {
	if m, ok := args.(marked); ok {
		return m.redriveMark()
	}
	return Redriven{}
}

// unmarked returns job with its args' Redriven mark cleared, and the
// mark. The job River handed over is left as it was; a copy is returned
// when there was a mark to clear.
func unmarked[T river.JobArgs](job *river.Job[T]) (*river.Job[T], Redriven) {
	mark := markOf(job.Args)
	if mark == (Redriven{}) {
		return job, mark
	}
	cp := *job
	if c, ok := any(&cp.Args).(clearable); ok {
		c.clearRedriveMark()
	} else if c, ok := any(cp.Args).(clearable); ok {
		// Args of pointer type: River decoded them for this run alone.
		c.clearRedriveMark()
	}
	return &cp, mark
}

// Redrive returns a once.KindPolicy.Redrive hook that inserts a River job
// for a released action nobody delivers any more. build makes the job
// from the action: decode a.Payload when the intent's payload is the
// args, or look the work up by a.Run; embed Redriven in the args and set
// it to RedrivenFrom(a). build's InsertOpts may be nil.
//
// When the args carry the mark and the InsertOpts set no UniqueOpts,
// Redrive asks River for uniqueness by args: the reaper calls the hook
// again every RedriveAfter until a delivery claims the action, and each
// call after the first finds the job already there (available,
// scheduled, running, retryable) and inserts none. A released attempt
// whose earlier re-drive was cancelled or discarded is inserted again;
// one whose re-drive River holds running for a worker that died before
// it claimed the action waits for River's rescuer to retry that job. If
// River skips the insert as a duplicate of a job that re-drives no such
// attempt or has already finished (args whose fields are tagged
// river:"unique" leave the mark out of River's key; UniqueOpts of your
// own may too), the hook returns an error naming it, so the reaper counts
// the action as waiting instead of re-driven.
//
// Without the mark every call inserts a job. That is safe, since once
// runs the effect once however many jobs carry it; the extra jobs replay
// or snooze and complete.
func Redrive(ins Inserter, build func(a once.Action) (river.JobArgs, *river.InsertOpts, error)) func(context.Context, once.Action) error {
	return func(ctx context.Context, a once.Action) error {
		switch {
		case ins == nil:
			return errors.New("riverjob: Redrive was given a nil Inserter; pass the *river.Client that inserts your jobs")
		case build == nil:
			return errors.New("riverjob: Redrive was given a nil build function; pass one that makes the job's args from the action")
		}
		args, opts, err := build(a)
		if err != nil {
			return fmt.Errorf("riverjob: building the job to re-drive action %s: %w", a.Key, err)
		}
		if args == nil {
			return fmt.Errorf("riverjob: the Redrive build function returned no job args for action %s", a.Key)
		}
		mark := markOf(args)
		isMarked := mark != (Redriven{})
		if isMarked && mark != RedrivenFrom(a) {
			return fmt.Errorf("riverjob: the job built to re-drive action %s attempt %d is marked for %q attempt %d; set its Redriven to riverjob.RedrivenFrom(a)", a.Key, a.Attempt, mark.OnceKey, mark.OnceAttempt)
		}
		var o river.InsertOpts
		if opts != nil {
			o = *opts
		}
		if isMarked && uniqueUnset(o.UniqueOpts) {
			o.UniqueOpts = river.UniqueOpts{ByArgs: true}
		}
		res, err := ins.Insert(ctx, args, &o)
		if err != nil {
			return fmt.Errorf("riverjob: inserting a %s job to re-drive action %s: %w", args.Kind(), a.Key, err)
		}
		if res != nil && res.UniqueSkippedAsDuplicate && res.Job != nil {
			return checkDuplicate(a, res.Job)
		}
		return nil
	}
}

// uniqueUnset reports whether u asks for no uniqueness at all.
func uniqueUnset(u river.UniqueOpts) bool {
	return !u.ByArgs && u.ByPeriod == time.Duration(0) && !u.ByQueue && u.ByState == nil && !u.ExcludeKind
}

// checkDuplicate accepts an insert River skipped when the job it kept
// will deliver the same released attempt.
func checkDuplicate(a once.Action, job *rivertype.JobRow) error {
	var got Redriven
	_ = json.Unmarshal(job.EncodedArgs, &got) // args that are no object carry no mark
	if got != RedrivenFrom(a) {
		return fmt.Errorf("riverjob: River skipped the re-drive of action %s attempt %d as a duplicate of job %d, which re-drives %q attempt %d; River's unique key must include the Redriven mark: do not tag args fields river:\"unique\", or set InsertOpts.UniqueOpts that tell attempts apart", a.Key, a.Attempt, job.ID, got.OnceKey, got.OnceAttempt)
	}
	switch job.State {
	case rivertype.JobStateCompleted, rivertype.JobStateCancelled, rivertype.JobStateDiscarded:
		return fmt.Errorf("riverjob: River skipped the re-drive of action %s attempt %d as a duplicate of job %d, which is %s and will not run again; the action still waits for a delivery", a.Key, a.Attempt, job.ID, job.State)
	}
	return nil
}
