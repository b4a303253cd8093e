package once

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// ReaperConfig configures a Reaper.
type ReaperConfig struct {
	// Interval is the time between passes. Zero means 30 seconds.
	Interval time.Duration
	// MaxPerPass bounds the actions one pass handles, so a backlog is
	// worked through over several passes. Zero means 10,000.
	MaxPerPass int
	// OnPass, if not nil, is called after every pass Start makes, with
	// its report and error: a console shows the last pass, an
	// application alerts on a growing review count.
	OnPass func(ReapReport, error)
	// Logger for pass summaries. Nil means the client's.
	Logger *slog.Logger
}

// ReapReport says what one pass did, per recovery outcome.
type ReapReport struct {
	// Examined counts actions taken for recovery.
	Examined int `json:"examined"`
	// Review counts actions put up for review (AskPerson, or a verifier
	// that failed too often).
	Review int `json:"review"`
	// Released counts actions released for the next delivery
	// (RetryWithProviderKey, or a verifier that found no trace).
	Released int `json:"released"`
	// Verified counts actions a verifier found had landed.
	Verified int `json:"verified"`
	// Deferred counts actions whose verifier could not tell; they come
	// back after a backoff.
	Deferred int `json:"deferred"`
	// Changed counts actions that moved on (a late worker finished)
	// while the reaper decided.
	Changed int `json:"changed"`
	// Redriven counts released actions handed to their kind's Redrive
	// hook because no delivery claimed them within RedriveAfter, and
	// which the hook took (it returned nil). Of several reapers, only
	// the one that marked an action re-driven hands it on and counts it.
	Redriven int `json:"redriven"`
	// Waiting counts released actions past RedriveAfter that could not be
	// re-driven (no Redrive hook, or it failed): they run only if their
	// job is delivered again, or a hook that failed is called again
	// after another RedriveAfter.
	Waiting int `json:"waiting"`
	// AwaitingVerifier counts actions due for recovery under
	// VerifyThenDecide that this reaper left alone because it does not
	// hold their kind's verifier: only a process that does can decide
	// them (run a reaper in the application).
	AwaitingVerifier int `json:"awaiting_verifier"`
	// Expired counts actions whose wait for approval expired unanswered:
	// failed, or put up for review, as their kind asked when they were
	// claimed.
	Expired int `json:"expired"`
	// ByKind breaks Examined down by kind.
	ByKind map[string]int `json:"by_kind,omitempty"`
}

func (r *ReapReport) add(kind string, d decision) {
	r.Examined++
	if r.ByKind == nil {
		r.ByKind = map[string]int{}
	}
	r.ByKind[kind]++
	switch d {
	case decReview:
		r.Review++
	case decReleased:
		r.Released++
	case decSucceeded:
		r.Verified++
	case decBackoff:
		r.Deferred++
	default:
		r.Changed++
	}
}

// Reaper finds actions whose outcome is unknown — in flight with a lapsed
// lease (the worker died), or unknown and due — and applies their kind's
// recovery. Leases are judged by the database's clock, and each action is
// taken atomically (FOR UPDATE SKIP LOCKED on PostgreSQL), so reapers on
// several machines never handle the same action twice. Workers apply the
// same recovery inline when they meet such an action; the reaper is for
// the jobs that never come back.
type Reaper struct {
	c   *Client
	cfg ReaperConfig
	log *slog.Logger

	mu      sync.Mutex
	cancel  context.CancelFunc
	done    chan struct{}
	passing sync.Mutex // held for the length of a pass
}

// NewReaper returns a reaper over c's store and policies.
func NewReaper(c *Client, cfg ReaperConfig) (*Reaper, error) {
	if c == nil {
		return nil, errors.New("once: NewReaper needs a *Client")
	}
	if cfg.Interval < 0 || cfg.MaxPerPass < 0 {
		return nil, errors.New("once: ReaperConfig.Interval and MaxPerPass must not be negative; zero means the default")
	}
	cfg.Interval = orDefault(cfg.Interval, 30*time.Second)
	cfg.MaxPerPass = orDefault(cfg.MaxPerPass, 10000)
	log := cfg.Logger
	if log == nil {
		log = c.log
	}
	return &Reaper{c: c, cfg: cfg, log: log}, nil
}

// RunOnce makes one pass: it takes due actions one at a time until none
// is left (or MaxPerPass is reached) and applies each one's recovery.
// Each action is held only while it is decided, so a slow verifier
// cannot outlast the hold on actions still waiting their turn, and a
// second reaper never handles an action this one is deciding. For tests
// and cron.
func (r *Reaper) RunOnce(ctx context.Context) (ReapReport, error) {
	r.passing.Lock()
	defer r.passing.Unlock()
	var rep ReapReport
	// A reaper that outlived an upgrade must not act on rows a newer
	// once wrote.
	cctx, cancel := r.c.call(ctx)
	err := r.c.CheckSchema(cctx)
	cancel()
	if err != nil {
		return rep, fmt.Errorf("once: reaper: %w", err)
	}
	var firstErr error
	// Each action is held for its own kind's decision: a duplicate that
	// meets the hold is told to come back when it runs out.
	hold, kindHolds := r.c.holds()
	// The pass takes what was due when it began: an action whose
	// verifier it deferred a moment ago waits for the next pass.
	var dueBy time.Time
	for taken := 0; taken < r.cfg.MaxPerPass; taken++ {
		token := newToken()
		cctx, cancel := r.c.call(ctx)
		got, now, err := r.c.store.Recoverable(cctx, RecoverRequest{Limit: 1, Hold: hold, KindHolds: kindHolds, Token: token, DueBy: dueBy, Verifiable: r.c.verifiable})
		cancel()
		if err != nil {
			return rep, cmp.Or(firstErr, fmt.Errorf("once: reaper: %w", err))
		}
		if dueBy.IsZero() {
			dueBy = now
		}
		if len(got) == 0 {
			break
		}
		a := got[0]
		d, _, err := r.c.decide(ctx, r.c.Policy(a.Kind), a, token, ActorReaper, "")
		if err != nil {
			// Go on with the others; this one comes back when its
			// hold runs out.
			firstErr = cmp.Or(firstErr, err)
			continue
		}
		rep.add(a.Kind, d)
	}
	if err := r.expire(ctx, &rep); err != nil {
		firstErr = cmp.Or(firstErr, err)
	}
	if err := r.redrive(ctx, &rep); err != nil {
		firstErr = cmp.Or(firstErr, err)
	}
	if err := r.countUnverifiable(ctx, &rep); err != nil {
		firstErr = cmp.Or(firstErr, err)
	}
	if rep.Examined > 0 || rep.Redriven > 0 || rep.Waiting > 0 || rep.AwaitingVerifier > 0 || rep.Expired > 0 {
		r.log.Info("once: reaper pass", "examined", rep.Examined, "review", rep.Review, "released", rep.Released, "verified", rep.Verified,
			"deferred", rep.Deferred, "changed", rep.Changed, "redriven", rep.Redriven, "waiting", rep.Waiting, "awaiting_verifier", rep.AwaitingVerifier,
			"expired", rep.Expired)
	}
	return rep, firstErr
}

// expire ends the waits for approval that expired unanswered: each
// becomes what its row recorded at the claim (OnExpiry: failed, or
// review), fenced by its attempt, its status and the expiry itself
// (Transition.Expired, by the database's clock), so an approval given
// before the expiry wins, and one given after it is refused; of two
// reapers, one expires it.
func (r *Reaper) expire(ctx context.Context, rep *ReapReport) error {
	cctx, cancel := r.c.call(ctx)
	acts, err := r.c.store.List(cctx, Filter{Expired: true, OldestFirst: true, Brief: true, Limit: r.cfg.MaxPerPass})
	cancel()
	if err != nil {
		return fmt.Errorf("once: reaper: listing expired approvals: %w", err)
	}
	var firstErr error
	for _, a := range acts {
		m, then := expireFail, "it failed and does not run"
		if a.OnExpiry == StatusReview {
			m, then = expireReview, "a person decides what then"
		}
		t := m.of(a, ActorReaper).noting(fmt.Sprintf("nobody approved or rejected it within its wait, which expired at %s; %s",
			a.LeaseUntil.UTC().Format(time.RFC3339), then))
		t.Expired = true
		ok, err := r.c.transition(ctx, t)
		if err != nil {
			firstErr = cmp.Or(firstErr, fmt.Errorf("once: expiring action %s: %w", a.Key, err))
			continue
		}
		if ok {
			rep.Expired++
			r.c.emit(ctx, Observation{Event: t.Event, Kind: a.Kind, Recovered: true})
		}
	}
	return firstErr
}

// redrive hands released actions that waited too long for a delivery to
// their kind's Redrive hook, and counts the ones it cannot. It marks each
// one first (event redriven, updated now), fenced by the attempt, the
// status and the wait itself (Transition.Waiting), and calls the hook only
// if the mark applied: of several reapers that found the action waiting,
// one hands it on and counts it, and the trail says so before whatever
// the hook does (a publish, or a Do of its own) claims it. The mark makes
// the action wait another RedriveAfter, also when the hook fails.
func (r *Reaper) redrive(ctx context.Context, rep *ReapReport) error {
	cctx, cancel := r.c.call(ctx)
	acts, err := r.c.Waiting(cctx, r.cfg.MaxPerPass)
	cancel()
	if err != nil {
		return fmt.Errorf("once: reaper: listing released actions: %w", err)
	}
	var firstErr error
	for _, a := range acts {
		pol := r.c.Policy(a.Kind)
		if pol.Redrive == nil {
			if !a.Redrive {
				// Its application has no hook either: nobody will
				// deliver it unless a person publishes the job again.
				rep.Waiting++
			}
			// Otherwise its application's reaper re-drives it.
			continue
		}
		t := redrive.of(a, ActorReaper)
		t.Error, t.Waiting = a.Error, true
		t.Event.Note = fmt.Sprintf("%s %s ago and not claimed since; handed to the kind's Redrive hook", a.Status, time.Since(a.UpdatedAt).Round(time.Second))
		ok, err := r.c.transition(ctx, t)
		if err != nil {
			firstErr = cmp.Or(firstErr, fmt.Errorf("once: marking action %s re-driven: %w", a.Key, err))
			continue
		}
		if !ok {
			// Claimed meanwhile, or another reaper marked it first
			// and hands it on.
			continue
		}
		r.c.emit(ctx, Observation{Event: t.Event, Kind: a.Kind, Recovery: pol.Recovery})
		if err := safeRedrive(ctx, pol, a); err != nil {
			r.log.Warn("once: re-drive failed; the action waits for a delivery, and is re-driven again after RedriveAfter", "key", a.Key, "kind", a.Kind, "err", err)
			rep.Waiting++
			firstErr = cmp.Or(firstErr, fmt.Errorf("once: re-driving action %s: %w", a.Key, err))
			continue
		}
		rep.Redriven++
	}
	return firstErr
}

// countUnverifiable counts the due actions this reaper may not take
// because only a process holding their kind's verifier decides them
// (Recovery.KindOnly), so an operator running one without the
// application's verifiers is told they wait for another process.
func (r *Reaper) countUnverifiable(ctx context.Context, rep *ReapReport) error {
	for _, rec := range Recoveries() {
		if !rec.KindOnly() {
			continue
		}
		cctx, cancel := r.c.call(ctx)
		acts, err := r.c.store.List(cctx, Filter{Due: true, Recovery: rec, OldestFirst: true, Limit: r.cfg.MaxPerPass})
		cancel()
		if err != nil {
			return fmt.Errorf("once: reaper: counting actions awaiting a verifier: %w", err)
		}
		for _, a := range acts {
			if rec.rules().verifier(r.c.Policy(a.Kind)) == nil {
				rep.AwaitingVerifier++
			}
		}
	}
	return nil
}

// safeRedrive calls a kind's Redrive hook under the kind's MaxExecution,
// turning a panic into an error.
func safeRedrive(ctx context.Context, pol KindPolicy, a Action) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("redrive panicked: %v", p)
		}
	}()
	rctx, cancel := context.WithTimeout(ctx, pol.MaxExecution)
	defer cancel()
	return pol.Redrive(rctx, a)
}

// Start runs passes every Interval in the background until Stop or ctx
// ends. A failed pass is logged and the loop goes on.
func (r *Reaper) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cancel != nil {
		return errors.New("once: reaper already started")
	}
	ctx, r.cancel = context.WithCancel(ctx)
	r.done = make(chan struct{})
	go func() {
		defer close(r.done)
		for {
			rep, err := r.RunOnce(ctx)
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				r.log.Warn("once: reaper pass failed", "err", err)
			}
			if r.cfg.OnPass != nil {
				r.cfg.OnPass(rep, err)
			}
			t := time.NewTimer(r.cfg.Interval)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
	}()
	return nil
}

// Stop ends the loop and waits for the pass in progress to finish.
func (r *Reaper) Stop() {
	r.mu.Lock()
	cancel, done := r.cancel, r.done
	r.cancel = nil
	r.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
}

// holds are the holds a reaper takes: each configured kind's own, and
// Config.Default's for the kinds this process was told nothing about.
func (c *Client) holds() (time.Duration, map[string]time.Duration) {
	kinds := make(map[string]time.Duration, len(c.kinds))
	for kind, p := range c.kinds {
		kinds[kind] = p.hold()
	}
	return c.def.hold(), kinds
}
