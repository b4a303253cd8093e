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

// fillScale fills s's action log and raw table with Scale finished rows
// each, by COPY. Of once's tables only the action log is filled: the
// scale is its size; the trail of events has what the arms write.
//
// The action log's rows are intents that succeeded, keyed as Do keys
// them, so that replay_do can replay them; ReplayKeys of them, and of
// the raw table's keys, evenly spread over the fill, are what the
// replay arms read: a replay at scale reads a row among all the others,
// not one written last, whose pages are the newest.
func (r *runner) fillScale(ctx context.Context, s *site) error {
	n := r.opts.Scale
	body, err := json.Marshal(payload)
	if err != nil {
		return err
	}
	now := time.Now()
	retain := now.Add(once.DefaultRetention)
	rng := newRand()
	// Row i is kept when i·k mod n < k: exactly k of the n rows, evenly
	// spread, the last among the fill's last n/k.
	k := int64(r.opts.ReplayKeys)
	kept := func(i int) bool { return int64(i)*k%int64(n) < k }
	s.replayRun = "bench-" + r.tag + "-scale"

	r.setupNote(fmt.Sprintf("%d rows in the action log", n))
	s.replaySteps = s.replaySteps[:0]
	i := 0
	_, err = r.pool.CopyFrom(ctx, pgx.Identifier{s.schema, "once_action"}, actionColumns, pgx.CopyFromFunc(func() ([]any, error) {
		if i == n {
			return nil, nil
		}
		in := once.Intent{Run: s.replayRun, Step: int64(i), Kind: benchKind, Target: benchTarget, Payload: payload}
		key, fp, err := once.KeyOf(in)
		if err != nil {
			return nil, err
		}
		if kept(i) {
			s.replaySteps = append(s.replaySteps, in.Step)
		}
		i++
		return []any{string(key), string(fp), in.Run, in.Step, benchKind, benchTarget, body, "succeeded", 1,
			resultJSON, now, now, now, now, retain, randomKey(rng)[:32]}, nil
	}))
	if err != nil {
		return fmt.Errorf("filling the action log: %w", err)
	}

	r.setupNote(fmt.Sprintf("%d rows in the raw table", n))
	s.replayKeys = s.replayKeys[:0]
	i = 0
	_, err = r.pool.CopyFrom(ctx, pgx.Identifier{s.schema, "raw_action"}, []string{"key", "status", "result", "created_at", "updated_at"},
		pgx.CopyFromFunc(func() ([]any, error) {
			if i == n {
				return nil, nil
			}
			key := randomKey(rng)
			if kept(i) {
				s.replayKeys = append(s.replayKeys, key)
			}
			i++
			return []any{key, "succeeded", resultJSON, now, now}, nil
		}))
	if err != nil {
		return fmt.Errorf("filling the raw table: %w", err)
	}
	return nil
}
