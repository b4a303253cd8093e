package linearize

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/oncehq/once"
)

// Never is the return time of an operation whose effect on the database
// is unknown: porcupine may linearize it at any point after its call, as
// it does an operation that never returned.
const Never int64 = math.MaxInt64

// Recorder writes down the history of the calls made through it. Times
// come from one monotonic clock in this process. It is safe for
// concurrent use.
type Recorder struct {
	start time.Time

	mu       sync.Mutex
	ops      []porcupine.Operation
	effects  map[Attempt]int
	ran      map[Attempt]Interval
	claims   map[Attempt]int
	problems []string
}

// Interval is when an attempt's effect ran, by the recorder's clock.
type Interval struct{ Start, End int64 }

// Attempt names one attempt of one action.
type Attempt struct {
	Key    once.Key
	Number int
}

// NewRecorder returns a Recorder whose clock starts now. Give the
// clients it records Recorder.Hooks (or join them with the client's own).
func NewRecorder() *Recorder {
	return &Recorder{start: time.Now(), effects: map[Attempt]int{}, ran: map[Attempt]Interval{}, claims: map[Attempt]int{}}
}

// Start is when the recorder's clock started, by the wall clock: a
// history's times are nanoseconds after it, and the store's events, by
// the database's clock, can be set beside them.
func (r *Recorder) Start() time.Time { return r.start }

// Now is the recorder's clock: nanoseconds since it was made, by the
// monotonic clock.
func (r *Recorder) Now() int64 { return int64(time.Since(r.start)) }

// Hooks are the hooks a recorded client needs: OnExecute tells the
// recorder which attempt a Do won, and when.
func (r *Recorder) Hooks() once.Hooks {
	return once.Hooks{OnEvent: func(ctx context.Context, o once.Observation) {
		if tr, ok := ctx.Value(traceKey{}).(*trace); ok && o.Type == once.EventClaimResent {
			tr.resent = true
		}
	}, OnExecute: func(ctx context.Context, o once.Observation) (context.Context, func(once.Observation, error)) {
		if tr, ok := ctx.Value(traceKey{}).(*trace); ok {
			tr.claimedAt, tr.attempt, tr.claimed = r.Now(), o.Attempt, true
			r.mu.Lock()
			r.claims[Attempt{o.Key, o.Attempt}]++
			r.mu.Unlock()
		}
		return ctx, nil
	}}
}

// trace is what one Do told the recorder while it ran, on its own
// goroutine.
type trace struct {
	// resent: a claim's try failed and was sent again; the failed try
	// may commit at any time after the call (once.EventClaimResent).
	resent    bool
	claimed   bool
	claimedAt int64
	attempt   int
	ran       bool
	ranAt     int64
	value     string
	effectErr error
}

type traceKey struct{}

func (r *Recorder) add(op porcupine.Operation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, op)
}

func (r *Recorder) problem(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.problems = append(r.problems, fmt.Sprintf(format, args...))
}

// History returns the operations recorded so far, by call time.
func (r *Recorder) History() []porcupine.Operation {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := append([]porcupine.Operation(nil), r.ops...)
	sort.SliceStable(h, func(i, j int) bool { return h[i].Call < h[j].Call })
	return h
}

// Ran returns when each attempt's effect ran (the last run, if it ran
// more than once, which Problems reports).
func (r *Recorder) Ran() map[Attempt]Interval {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := make(map[Attempt]Interval, len(r.ran))
	for k, v := range r.ran {
		m[k] = v
	}
	return m
}

// Problems returns what the recorder met that no history can hold: a
// Do whose answer the model has no word for, an effect run twice for one
// attempt, an effect handed an attempt other than the one claimed.
func (r *Recorder) Problems() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := append([]string(nil), r.problems...)
	for a, n := range r.effects {
		if n > 1 {
			p = append(p, fmt.Sprintf("attempt %d of %.12s ran its effect %d times", a.Number, a.Key, n))
		}
	}
	for a, n := range r.claims {
		if n > 1 {
			p = append(p, fmt.Sprintf("attempt %d of %.12s was claimed %d times", a.Number, a.Key, n))
		}
	}
	sort.Strings(p)
	return p
}

// canonical returns the JSON of a stored or returned value in one form,
// whatever the store did to its spacing or key order; "" for none.
func canonical(raw []byte) string {
	if len(raw) == 0 {
		return ""
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return "!" + string(raw)
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func valueOf(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("!%v", v)
	}
	return canonical(b)
}

// Do calls once.Do and records it: its claim and outcome, when the
// effect ran, or what it saw. client names the caller in the history
// (porcupine's ClientId). c must have been made with the Recorder's
// Hooks.
func Do[T any](ctx context.Context, r *Recorder, client int, c *once.Client, in once.Intent, fn func(context.Context, once.Attempt) (T, error), opts ...once.DoOption) (once.Result[T], error) {
	key, _, err := once.KeyOf(in)
	if err != nil {
		return once.Do(ctx, c, in, fn, opts...)
	}
	rec := c.Policy(in.Kind).Recovery
	tr := &trace{}
	ctx = context.WithValue(ctx, traceKey{}, tr)
	call := r.Now()
	res, err := once.Do(ctx, c, in, func(ctx context.Context, a once.Attempt) (T, error) {
		start := r.Now()
		r.mu.Lock()
		r.effects[Attempt{a.Key, a.Number}]++
		r.mu.Unlock()
		if !tr.claimed || tr.attempt != a.Number {
			r.problem("the effect of %.12s was handed attempt %d; the claim the hooks saw was %d", a.Key, a.Number, tr.attempt)
		}
		v, err := fn(ctx, a)
		tr.ran, tr.ranAt, tr.value, tr.effectErr = true, r.Now(), valueOf(v), err
		r.mu.Lock()
		r.ran[Attempt{a.Key, a.Number}] = Interval{start, tr.ranAt}
		r.mu.Unlock()
		return v, err
	}, opts...)
	ret := r.Now()
	base := Input{Key: key, Recovery: rec}
	if tr.resent {
		// The try given up on is a claim that may yet win, unseen by
		// this call: as a Do whose database was unreachable.
		in := base
		in.Op = OpAnswer
		r.add(porcupine.Operation{ClientId: client, Input: in, Call: call, Output: Output{Result: Unsure}, Return: Never, Metadata: "a claim's try given up on, sent again"})
	}
	note := "ok"
	if err != nil {
		note = err.Error()
	}
	if !tr.claimed {
		out, when := answerOf(res, err)
		if out.Result == 0 {
			r.problem("a Do of %.12s that ran nothing answered %v", key, err)
			return res, err
		}
		if when == 0 {
			when = ret
		}
		in := base
		in.Op = OpAnswer
		r.add(porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: when, Metadata: note})
		return res, err
	}
	claim := base
	claim.Op, claim.Attempt = OpClaim, tr.attempt
	r.add(porcupine.Operation{ClientId: client, Input: claim, Call: call, Output: Output{Result: Applied}, Return: tr.claimedAt, Metadata: "claimed"})
	ended := tr.claimedAt
	if tr.ran {
		ended = tr.ranAt
	}
	o := base
	o.Op, o.Attempt = OpOutcome, tr.attempt
	outcome, status, when := outcomeOf(err)
	if when == 0 {
		when = ret
	}
	o.Outcome = status
	if status == once.StatusSucceeded {
		o.Value = tr.value
	}
	switch {
	case outcome == 0:
		r.problem("a Do of %.12s attempt %d answered %v", key, tr.attempt, err)
		return res, err
	case err == nil && (res.Replayed || res.Attempt != tr.attempt || valueOf(res.Value) != tr.value):
		r.problem("a Do of %.12s that ran attempt %d returned %+v; want its own value, not replayed", key, tr.attempt, res)
	}
	r.add(porcupine.Operation{ClientId: client, Input: o, Call: ended, Output: Output{Result: outcome}, Return: when, Metadata: note})
	return res, err
}

// answerOf is what a Do that ran nothing saw. A zero Result means the
// model has no word for it. A non-zero time is the operation's return
// time (Never, when the call may yet take effect).
func answerOf[T any](res once.Result[T], err error) (Output, int64) {
	var (
		inFlight *once.InFlightError
		failed   *once.FailedError
		review   *once.ReviewError
		unknown  *once.UnknownOutcomeError
		fenced   *once.FencedError
		record   *once.RecordError
	)
	switch {
	case err == nil:
		if !res.Replayed {
			return Output{}, 0
		}
		return Output{Result: Saw, Status: once.StatusSucceeded, Attempt: res.Attempt, Value: valueOf(res.Value)}, 0
	case errors.As(err, &unknown), errors.As(err, &fenced), errors.As(err, &record):
		// Only an attempt that was claimed ends so, and none was.
		return Output{}, 0
	case errors.As(err, &inFlight):
		if inFlight.InTransaction {
			// No row was visible and the claim timed out: it may yet
			// commit.
			return Output{Result: Unsure}, Never
		}
		return Output{Result: Saw, Status: once.StatusInFlight, Attempt: inFlight.Attempt}, 0
	case errors.As(err, &failed):
		if !failed.Replayed {
			return Output{}, 0
		}
		return Output{Result: Saw, Status: once.StatusFailed, Attempt: failed.Attempt}, 0
	case errors.As(err, &review):
		return Output{Result: Saw, Status: once.StatusReview, Attempt: review.Attempt}, 0
	case errors.Is(err, once.ErrRetryLater):
		return Output{Result: Saw, Status: once.StatusReleased}, 0
	case errors.Is(err, once.ErrFingerprintMismatch), errors.Is(err, once.ErrInvalidIntent):
		return Output{}, 0
	}
	// The database could not be reached: a claim may have committed
	// with its reply lost, or may commit yet.
	return Output{Result: Unsure}, Never
}

// outcomeOf is how the outcome of a claimed attempt ended, and the
// status it records. A zero Result means the model has no word for it.
func outcomeOf(err error) (Result, once.Status, int64) {
	var (
		failed  *once.FailedError
		unknown *once.UnknownOutcomeError
		fenced  *once.FencedError
		record  *once.RecordError
	)
	switch {
	case err == nil:
		return Applied, once.StatusSucceeded, 0
	case errors.As(err, &record):
		// Not recorded in time; a try may still commit.
		return Unsure, record.Outcome, Never
	case errors.As(err, &fenced):
		return Refused, fenced.Outcome, 0
	case errors.As(err, &unknown):
		return Applied, unknown.Status, 0
	case errors.As(err, &failed):
		if failed.Replayed {
			return 0, "", 0
		}
		return Applied, once.StatusFailed, 0
	case errors.Is(err, once.ErrRetryLater):
		// The effect said it did not happen, or the attempt was
		// released unrun.
		return Applied, once.StatusReleased, 0
	case errors.Is(err, once.ErrResultTooLarge), errors.Is(err, once.ErrResultNotJSON), errors.Is(err, once.ErrFingerprintMismatch):
		return 0, "", 0
	}
	// Any other end before the effect (a lease that could not be
	// renewed, whose release was written, ends as ErrRetryLater above):
	// nothing ran and nothing was written.
	return Nothing, once.StatusInFlight, 0
}

// Resolve calls Client.Resolve with a person's decision and records it.
// A resolution refused before any I/O is not recorded.
func Resolve(ctx context.Context, r *Recorder, client int, c *once.Client, key once.Key, rec once.Recovery, res once.Resolution) (once.Action, error) {
	if err := c.ValidateResolution(res); err != nil {
		return once.Action{}, err
	}
	in := Input{Key: key, Op: OpResolve, Recovery: rec, Attempt: res.Attempt, Decision: res.Decision}
	if res.Decision == once.DecisionDone {
		in.Value = canonical(res.Result)
	}
	call := r.Now()
	a, err := c.Resolve(ctx, key, res)
	ret := r.Now()
	out := Output{Result: Applied}
	switch {
	case err == nil:
	case errors.Is(err, once.ErrConflict), errors.Is(err, once.ErrNotFound):
		out.Result = Refused
	default:
		out.Result, ret = Unsure, Never
	}
	note := "ok"
	if err != nil {
		note = err.Error()
	}
	r.add(porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret, Metadata: note})
	return a, err
}

// Get calls Client.Get and records what it read. A read that failed is
// not recorded: it changed nothing and saw nothing.
func Get(ctx context.Context, r *Recorder, client int, c *once.Client, key once.Key, rec once.Recovery) (once.Action, error) {
	call := r.Now()
	a, err := c.Get(ctx, key)
	ret := r.Now()
	out := Output{Result: Saw}
	switch {
	case err == nil:
		out.Status, out.Attempt = a.Status, a.Attempt
		if a.Status == once.StatusSucceeded {
			out.Value = canonical(a.Result)
		}
	case errors.Is(err, once.ErrNotFound):
	default:
		return a, err
	}
	r.add(porcupine.Operation{ClientId: client, Input: Input{Key: key, Op: OpRead, Recovery: rec}, Call: call, Output: out, Return: ret, Metadata: "get"})
	return a, err
}
