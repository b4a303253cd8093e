package riverjob

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/oncehq/once"
	"github.com/oncehq/once/postgres"
)

// TimeoutMargin is what a Worker adds to its kind's MaxExecution when it
// tells River how long a job may run: time for the claim and for
// recovering a lapsed claim inline before the effect starts. Recording
// the outcome does not need it; once records on a context of its own.
const TimeoutMargin = 30 * time.Second

// Dispose returns what a River worker's Work should return, given the
// error once.Do or once.DoTx returned: it applies once.Dispose and says
// it in River's terms (the package doc has the table). A worker of your
// own ends with
//
//	_, err := once.Do(ctx, client, in, effect)
//	return riverjob.Dispose(err)
//
// An action that failed for good (*once.FailedError, or an effect that
// returned once.Permanent inside DoTx, where nothing was recorded) is
// cancelled rather than completed, so River shows that the job's effect
// did not happen; it is never retried either way. Errors are returned as
// Do gave them, wrapped only by river.JobCancel, so an ErrorHandler can
// still inspect them with errors.As.
func Dispose(err error) error {
	if err == nil {
		return nil
	}
	var fenced *once.FencedError
	if errors.As(err, &fenced) && fenced.Outcome == once.StatusSucceeded {
		// The effect happened; a newer attempt or a person moved the
		// action on. Nothing is left for this job to do.
		return nil
	}
	// once.Dispose decides, so the job's fate follows what Do recorded:
	// an error whose chain holds a Permanent mark may still be a release
	// (RetryLater over it), and cancelling that job would leave the
	// released action with nobody to deliver it. From DoTx, a Permanent
	// effect error arrives unrecorded and once.Dispose drops it.
	d := once.Dispose(err)
	switch d.Action {
	case once.JobAck:
		// Done without the effect (failed for good): cancelled, so the
		// job's state tells the truth.
		return river.JobCancel(err)
	case once.JobRetry:
		if d.After > 0 {
			// Another attempt holds the claim, or recovery is due later:
			// waiting is not a failure, so it must not use up attempts.
			return river.JobSnooze(d.After)
		}
		return err
	default:
		return river.JobCancel(err)
	}
}

// WorkerConfig says how a Worker turns a job into an effect that runs at
// most once.
type WorkerConfig[T river.JobArgs, R any] struct {
	// Client runs the effect. Required.
	Client *once.Client
	// Intent names the effect a job carries out. Every job that carries
	// the same work — the job retried, or inserted twice — must give the
	// same intent, so take Run from the args (an order id, a signup id),
	// never from the job's River id. It must not depend on a Redriven
	// mark: the Worker clears the mark before calling it. Required.
	Intent func(job *river.Job[T]) once.Intent
	// Effect performs the effect; once.Do decides whether it runs. Its
	// errors are classified as Do's are: once.RetryLater when it did not
	// happen, once.Permanent when it never will, anything else is an
	// unknown outcome that the kind's recovery decides. Exactly one of
	// Effect and EffectTx is required.
	Effect func(ctx context.Context, job *river.Job[T], a once.Attempt) (R, error)
	// EffectTx performs an effect that is a write to the database River
	// and Store share, inside the transaction that also records the
	// action and completes the job (see DoTx). An error from it rolls all
	// three back.
	EffectTx func(ctx context.Context, tx pgx.Tx, job *river.Job[T], a once.Attempt) (R, error)
	// Store is the client's store, required with EffectTx: it begins the
	// transaction on its pool and binds it for once.DoTx.
	Store *postgres.Store
	// Timeout is River's timeout for one run of a job. Zero means the
	// kind's MaxExecution plus TimeoutMargin, so once's MaxExecution is
	// what bounds the effect. -1 means River never times the job out.
	Timeout time.Duration
}

// Worker is a river.Worker[T] that runs its effect through once: a job
// inserted twice, retried, or rescued runs its effect once, and what Do
// returned decides the job's state (see Dispose). Register it with
// river.AddWorker.
type Worker[T river.JobArgs, R any] struct {
	river.WorkerDefaults[T]
	cfg WorkerConfig[T, R]
}

var _ river.Worker[river.JobArgs] = (*Worker[river.JobArgs, any])(nil)

// NewWorker checks cfg and returns its Worker.
func NewWorker[T river.JobArgs, R any](cfg WorkerConfig[T, R]) (*Worker[T, R], error) {
	switch {
	case cfg.Client == nil:
		return nil, errors.New("riverjob: WorkerConfig.Client is nil; pass the *once.Client that runs the effects")
	case cfg.Intent == nil:
		return nil, errors.New("riverjob: WorkerConfig.Intent is nil; give it a function that builds the job's once.Intent from its args")
	case cfg.Effect == nil && cfg.EffectTx == nil:
		return nil, errors.New("riverjob: WorkerConfig has neither Effect nor EffectTx; set the one that performs the job's effect")
	case cfg.Effect != nil && cfg.EffectTx != nil:
		return nil, errors.New("riverjob: WorkerConfig has both Effect and EffectTx; set Effect for an external call, EffectTx for a write to the same database")
	case cfg.EffectTx != nil && cfg.Store == nil:
		return nil, errors.New("riverjob: WorkerConfig.EffectTx needs Store, the client's *postgres.Store, to begin the transaction")
	case cfg.Effect != nil && cfg.Store != nil:
		return nil, errors.New("riverjob: WorkerConfig.Store is only used with EffectTx; leave it nil with Effect")
	case cfg.Timeout < -1:
		return nil, fmt.Errorf("riverjob: WorkerConfig.Timeout is %v; use a positive duration, zero for the kind's MaxExecution plus TimeoutMargin, or -1 for none", cfg.Timeout)
	}
	return &Worker[T, R]{cfg: cfg}, nil
}

// Timeout implements river.Worker: WorkerConfig.Timeout, or the kind's
// MaxExecution plus TimeoutMargin.
func (w *Worker[T, R]) Timeout(job *river.Job[T]) time.Duration {
	if w.cfg.Timeout != 0 {
		return w.cfg.Timeout
	}
	job, _ = unmarked(job)
	return w.cfg.Client.Policy(w.cfg.Intent(job).Kind).MaxExecution + TimeoutMargin
}

// Work implements river.Worker: it runs the effect through once.Do (or
// DoTx) and returns Dispose's answer.
func (w *Worker[T, R]) Work(ctx context.Context, job *river.Job[T]) error {
	orig := job
	job, mark := unmarked(job)
	in := w.cfg.Intent(job)
	if mark.OnceKey != "" {
		key, _, err := once.KeyOf(in)
		if err == nil && key != mark.OnceKey {
			// The re-drive's build function made args that name another
			// action: running it would run the wrong effect, and the
			// released action would still wait.
			return river.JobCancel(fmt.Errorf("riverjob: job %d was re-driven for action %s, but its args give action %s; the Redrive build function must return args from which Intent builds the same intent (decode a.Payload, or look the job up by a.Run)", job.ID, mark.OnceKey, key))
		}
	}
	if w.cfg.EffectTx != nil {
		_, err := doTx(ctx, w.cfg.Client, w.cfg.Store, orig, in, func(ctx context.Context, tx pgx.Tx, a once.Attempt) (R, error) {
			return w.cfg.EffectTx(ctx, tx, job, a)
		})
		return Dispose(err)
	}
	_, err := once.Do(ctx, w.cfg.Client, in, func(ctx context.Context, a once.Attempt) (R, error) {
		return w.cfg.Effect(ctx, job, a)
	})
	return Dispose(err)
}
