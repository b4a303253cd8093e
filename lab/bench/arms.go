package bench

import (
	"context"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/oncehq/once"
)

// work does one unit of an arm's work and says how many actions it was:
// one, or a batch's 64 for raw_batched.
type work func(ctx context.Context) (int, error)

// batchSize is how many actions raw_batched writes in one pair of
// statements.
const batchSize = 64

// What every arm's action carries: an email to send, whose effect
// returns a message id. The raw arms store the same result the Do arms
// store.
const (
	benchKind   = "send_email"
	benchTarget = "ada@example.com"
	resultJSON  = `{"id":"msg-0123456789"}`
)

type message struct {
	To      string `json:"to"`
	Subject string `json:"subject"`
}

type receipt struct {
	ID string `json:"id"`
}

var payload = message{To: benchTarget, Subject: "hello"}

// send is the Do arms' effect: nothing, and a small result.
func send(context.Context, once.Attempt) (receipt, error) {
	return receipt{ID: "msg-0123456789"}, nil
}

// statements are the raw arms' SQL, for the run's schema.
type statements struct {
	createRaw, insert, update, insertBatch, updateBatch, read, fillRaw, vacuum string
}

func newStatements(schema string) statements {
	raw := pgx.Identifier{schema, "raw_action"}.Sanitize()
	action := pgx.Identifier{schema, "once_action"}.Sanitize()
	event := pgx.Identifier{schema, "once_event"}.Sanitize()
	return statements{
		// The least a hand-written record of an effect needs.
		createRaw: `CREATE TABLE ` + raw + ` (
    key        text        PRIMARY KEY,
    status     text        NOT NULL,
    result     json,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
)`,
		// The seed's two statements: claim the key, then record the
		// outcome, each its own commit.
		insert: `INSERT INTO ` + raw + ` (key, status) VALUES ($1, 'in_flight') ON CONFLICT (key) DO NOTHING`,
		update: `UPDATE ` + raw + ` SET status = 'succeeded', result = $2, updated_at = now() WHERE key = $1`,
		// The same for a batch of keys, in two statements over arrays.
		insertBatch: `INSERT INTO ` + raw + ` (key, status) SELECT k, 'in_flight' FROM unnest($1::text[]) AS k ON CONFLICT (key) DO NOTHING`,
		updateBatch: `UPDATE ` + raw + ` AS t SET status = 'succeeded', result = b.result, updated_at = now()
FROM unnest($1::text[], $2::json[]) AS b(key, result) WHERE t.key = b.key`,
		read:    `SELECT status, result FROM ` + raw + ` WHERE key = $1`,
		fillRaw: `INSERT INTO ` + raw + ` (key, status, result) SELECT k, 'succeeded', $2::json FROM unnest($1::text[]) AS k`,
		vacuum:  `VACUUM (ANALYZE) ` + raw + `, ` + action + `, ` + event,
	}
}

// newRand returns a generator for one goroutine.
func newRand() *rand.Rand { return rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())) }

// randomKey returns 64 random hex digits: shaped as once's keys are, so
// the raw table's index takes them in the same random order.
func randomKey(rng *rand.Rand) string {
	var b [32]byte
	for i := 0; i < len(b); i += 8 {
		v := rng.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return hex.EncodeToString(b[:])
}

// worker returns the work of one goroutine of arm.
func (r *runner) worker(arm string) work {
	rng := newRand()
	run := fmt.Sprintf("bench-%s-%s-%d", r.tag, arm, r.serial.Add(1))
	site, arm := r.siteOf(arm)
	switch arm {
	case ArmRaw:
		return func(ctx context.Context) (int, error) {
			key := randomKey(rng)
			if _, err := r.pool.Exec(ctx, site.sql.insert, key); err != nil {
				return 0, err
			}
			tag, err := r.pool.Exec(ctx, site.sql.update, key, resultJSON)
			if err == nil && tag.RowsAffected() != 1 {
				err = fmt.Errorf("the update of %s changed %d rows, not 1", key, tag.RowsAffected())
			}
			return 1, err
		}
	case ArmRawBatched:
		keys := make([]string, batchSize)
		results := make([]string, batchSize)
		for i := range results {
			results[i] = resultJSON
		}
		return func(ctx context.Context) (int, error) {
			for i := range keys {
				keys[i] = randomKey(rng)
			}
			if _, err := r.pool.Exec(ctx, site.sql.insertBatch, keys); err != nil {
				return 0, err
			}
			tag, err := r.pool.Exec(ctx, site.sql.updateBatch, keys, results)
			if err == nil && tag.RowsAffected() != batchSize {
				err = fmt.Errorf("the batch's update changed %d rows, not %d", tag.RowsAffected(), batchSize)
			}
			return batchSize, err
		}
	case ArmDoUnbatched:
		return doNew(site.doUnbatched, run)
	case ArmDo:
		return doNew(site.do, run)
	case ArmSQLiteDoUnbatched:
		return doNew(r.sqliteDoUnbatched, run)
	case ArmSQLiteDo:
		return doNew(r.sqliteDo, run)
	case ArmReplayRaw:
		return func(ctx context.Context) (int, error) {
			key := site.replayKeys[rng.IntN(len(site.replayKeys))]
			var status, result string
			if err := r.pool.QueryRow(ctx, site.sql.read, key).Scan(&status, &result); err != nil {
				return 0, err
			}
			if status != "succeeded" {
				return 0, fmt.Errorf("the replayed key %s is %s, not succeeded", key, status)
			}
			return 1, nil
		}
	case ArmReplayDo:
		return func(ctx context.Context) (int, error) {
			res, err := once.Do(ctx, site.do, site.replayIntent(rng.IntN(len(site.replaySteps))), send)
			if err == nil && (!res.Replayed || res.Value.ID == "") {
				err = fmt.Errorf("%s was not replayed with its result (replayed %v, result %+v)", res.Key, res.Replayed, res.Value)
			}
			return 1, err
		}
	case ArmSQLiteRaw:
		return r.sqliteRaw.worker(rng)
	case ArmProtocol:
		return r.protocolNew(site.protocol, run)
	case ArmReplayProtocol:
		return r.protocolReplay(site.protocol, site, rng)
	case ArmSQLiteProtocol:
		return r.protocolNew(r.sqliteProtocol, run)
	}
	return func(context.Context) (int, error) { return 0, fmt.Errorf("no arm %q", arm) }
}

// doNew runs Do on a new intent each time: the run is the worker's own,
// the step counts up.
func doNew(c *once.Client, run string) work {
	var step int64
	return func(ctx context.Context) (int, error) {
		in := once.Intent{Run: run, Step: step, Kind: benchKind, Target: benchTarget, Payload: payload}
		step++
		res, err := once.Do(ctx, c, in, send)
		if err == nil && res.Replayed {
			err = fmt.Errorf("%s step %d was replayed, but its key is new", run, in.Step)
		}
		return 1, err
	}
}

// prefillReplayRaw writes replay_raw's finished keys into s, a thousand
// a statement.
func (r *runner) prefillReplayRaw(ctx context.Context, s *site) error {
	rng := newRand()
	s.replayKeys = make([]string, r.opts.ReplayKeys)
	for i := range s.replayKeys {
		s.replayKeys[i] = randomKey(rng)
	}
	for i := 0; i < len(s.replayKeys); i += 1000 {
		if _, err := r.pool.Exec(ctx, s.sql.fillRaw, s.replayKeys[i:min(i+1000, len(s.replayKeys))], resultJSON); err != nil {
			return err
		}
	}
	return nil
}

// prefillReplayDo runs replay_do's intents through Do on s, as many at
// once as the pool allows.
func (r *runner) prefillReplayDo(ctx context.Context, s *site) error {
	n := r.opts.ReplayKeys
	s.replayRun = "bench-" + r.tag + "-replay"
	s.replaySteps = make([]int64, n)
	for i := range s.replaySteps {
		s.replaySteps[i] = int64(i)
	}
	par := min(int(r.pool.Config().MaxConns), 16, n)
	var wg sync.WaitGroup
	errs := make([]error, par)
	for p := range par {
		wg.Go(func() {
			for i := p; i < n && errs[p] == nil; i += par {
				_, errs[p] = once.Do(ctx, s.do, s.replayIntent(i), send)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
