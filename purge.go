package once

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// PurgeOptions configures Client.Purge.
type PurgeOptions struct {
	// BatchSize caps the rows one store call deletes, so a large purge
	// does not hold long locks. Zero means 1000.
	BatchSize int
	// DryRun counts what would be deleted and deletes nothing.
	DryRun bool
	// OlderThan, when positive, purges finished actions not updated for
	// this long, whatever retention their kind recorded. Zero (the
	// default) keeps to each action's own deadline.
	OlderThan time.Duration
	// Progress, if not nil, is called after every batch with the total
	// deleted so far.
	Progress func(deleted int)
}

// Purge deletes finished actions (succeeded, failed) past their own
// retention deadline, and returns how many it deleted (or, with DryRun,
// would delete). The deadline was set from the retention their kind had
// when they were claimed, so a process that knows none of the
// application's kinds purges by the application's rules. It never
// touches in-flight, unknown, review or released actions: a released
// action is not finished, and its attempt number is what fences out an
// attempt that was presumed dead; purging it would let the next claim be
// attempt 1 again. Retention must exceed the longest time your queue may
// redeliver a job, or a late duplicate runs again.
func (c *Client) Purge(ctx context.Context, opts PurgeOptions) (int, error) {
	if opts.BatchSize < 0 || opts.OlderThan < 0 {
		return 0, errors.New("once: PurgeOptions.BatchSize and OlderThan must not be negative; zero means the default")
	}
	total := 0
	err := c.purge(ctx, PurgeRequest{OlderThan: opts.OlderThan, Limit: orDefault(opts.BatchSize, 1000), DryRun: opts.DryRun}, opts.Progress, &total)
	return total, err
}

// purge repeats one request until a batch comes back short, adding to
// total as it goes.
func (c *Client) purge(ctx context.Context, req PurgeRequest, progress func(int), total *int) error {
	for {
		n, err := c.store.Purge(ctx, req)
		if err != nil {
			return fmt.Errorf("once: purge: %w", err)
		}
		*total += n
		if progress != nil && n > 0 {
			progress(*total)
		}
		if req.DryRun || n < req.Limit {
			return nil
		}
	}
}
