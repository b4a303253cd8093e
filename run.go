package once

import (
	"context"
	"sync"
)

// Run is a handle on one run — an agent run, a job — that numbers its
// steps in call order (Run.Next). One key per external call, not one per run: an
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

// Next hands out the run's next intent: in with Run set to the run's id
// and Step to the next number, whatever they held. Pass it to Do:
//
//	res, err := once.Do(ctx, c, run.Next(once.Intent{Kind: "send_email", Target: to, Payload: msg}), send)
func (r *Run) Next(in Intent) Intent {
	r.mu.Lock()
	defer r.mu.Unlock()
	in.Run, in.Step = r.id, r.next
	r.next++
	return in
}

// Steps returns the run's actions in step order, with their statuses.
func (r *Run) Steps(ctx context.Context) ([]Action, error) {
	return r.c.RunSteps(ctx, r.id)
}
