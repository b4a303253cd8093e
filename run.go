package once

import (
	"cmp"
	"context"
	"slices"
	"sync"
)

// Run is a handle on one run — an agent run, a job — that numbers its
// steps in call order. One key per external call, not one per run: an
// agent run that sends three emails and writes two records has five keys,
// and when it dies after the fourth, running it again re-executes only
// the fifth; the first four replay their stored results.
//
// The numbering is deterministic as long as the run makes its calls in
// the same order each time, which is what "resuming" means. A run whose
// path depends on something that changes between tries should name its
// steps with Do and an explicit Intent.Step instead.
type Run struct {
	c    *Client
	id   string
	mu   sync.Mutex
	next int64
}

// Run returns a handle on the run id, starting at step 0.
func (c *Client) Run(id string) *Run { return &Run{c: c, id: id} }

// ID returns the run id.
func (r *Run) ID() string { return r.id }

// Step runs the run's next step through Do: kind, target and payload as in
// Intent, the step number taken from the handle.
func Step[T any](ctx context.Context, r *Run, kind, target string, payload any, fn func(context.Context, Attempt) (T, error)) (Result[T], error) {
	r.mu.Lock()
	step := r.next
	r.next++
	r.mu.Unlock()
	return Do(ctx, r.c, Intent{Run: r.id, Step: step, Kind: kind, Target: target, Payload: payload}, fn)
}

// Steps returns the run's actions in step order, with their statuses.
func (r *Run) Steps(ctx context.Context) ([]Action, error) {
	return r.c.RunSteps(ctx, r.id)
}

// RunSteps returns the actions of run id in step order.
func (c *Client) RunSteps(ctx context.Context, id string) ([]Action, error) {
	acts, err := c.store.List(ctx, Filter{Run: id, Limit: 10000})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(acts, func(a, b Action) int { return cmp.Compare(a.Step, b.Step) })
	return acts, nil
}
