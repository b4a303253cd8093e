package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncehq/once"
)

// actionColumns are the action table's columns fillScale writes; the
// others take their defaults, as they do for an action that succeeded on
// its first attempt.
var actionColumns = []string{"key", "fingerprint", "run_id", "step", "kind", "target", "payload", "status", "attempt",
	"result", "created_at", "claimed_at", "updated_at", "completed_at", "retain_until", "token"}

// fillScale fills the action log and the raw table with Scale finished
// rows each, by COPY. Of once's tables only the action log is filled:
// the scale is its size; the trail of events has what the arms write.
func (r *runner) fillScale(ctx context.Context) error {
	n := r.opts.Scale
	body, err := json.Marshal(payload)
	if err != nil {
		return err
	}
	now := time.Now()
	retain := now.Add(once.DefaultRetention)
	rng := newRand()
	run := "bench-" + r.tag + "-scale"

	r.setupNote(fmt.Sprintf("%d rows in the action log", n))
	i := 0
	_, err = r.pool.CopyFrom(ctx, pgx.Identifier{r.schema, "once_action"}, actionColumns, pgx.CopyFromFunc(func() ([]any, error) {
		if i == n {
			return nil, nil
		}
		i++
		return []any{randomKey(rng), randomKey(rng), run, int64(i), benchKind, benchTarget, body, "succeeded", 1,
			resultJSON, now, now, now, now, retain, randomKey(rng)[:32]}, nil
	}))
	if err != nil {
		return fmt.Errorf("filling the action log: %w", err)
	}

	r.setupNote(fmt.Sprintf("%d rows in the raw table", n))
	i = 0
	_, err = r.pool.CopyFrom(ctx, pgx.Identifier{r.schema, "raw_action"}, []string{"key", "status", "result", "created_at", "updated_at"},
		pgx.CopyFromFunc(func() ([]any, error) {
			if i == n {
				return nil, nil
			}
			i++
			return []any{randomKey(rng), "succeeded", resultJSON, now, now}, nil
		}))
	if err != nil {
		return fmt.Errorf("filling the raw table: %w", err)
	}
	return nil
}
