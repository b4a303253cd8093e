package once

import (
	"context"
	"errors"
	"fmt"
)

// PurgeOptions configures Client.Purge.
type PurgeOptions struct {
	// BatchSize caps the rows one store call deletes, so a large purge
	// does not hold long locks. Zero means 1000.
	BatchSize int
	// DryRun counts what would be deleted and deletes nothing.
	DryRun bool
	// Progress, if not nil, is called after every batch with the total
	// deleted so far.
	Progress func(deleted int)
}

// Purge deletes finished actions (succeeded, failed) older than their
// kind's Retention, and returns how many it deleted (or, with DryRun,
// would delete). It never touches in-flight, unknown, review or released
// actions: a released action is not finished, and its attempt number is
// what fences out an attempt that was presumed dead; purging it would let
// the next claim be attempt 1 again. Retention must exceed the longest time your queue may
// redeliver a job, or a late duplicate runs again.
func (c *Client) Purge(ctx context.Context, opts PurgeOptions) (int, error) {
	if opts.BatchSize < 0 {
		return 0, errors.New("once: PurgeOptions.BatchSize is negative; zero means 1000")
	}
	batch := orDefault(opts.BatchSize, 1000)
	total := 0
	named := make([]string, 0, len(c.kinds))
	for kind, p := range c.kinds {
		named = append(named, kind)
		if err := c.purge(ctx, PurgeRequest{Kinds: []string{kind}, OlderThan: p.Retention, Limit: batch, DryRun: opts.DryRun}, opts.Progress, &total); err != nil {
			return total, err
		}
	}
	err := c.purge(ctx, PurgeRequest{ExceptKinds: named, OlderThan: c.def.Retention, Limit: batch, DryRun: opts.DryRun}, opts.Progress, &total)
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
