package postgres

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/oncehq/once"
)

// Group commit.
//
// Every Claim and Transition of a Do is a write that commits, and a
// commit waits for the write-ahead log to reach the disk. Alone, each
// call pays a round trip, a statement and a flush of its own, and the
// server's commits, not its statements, then cap how many actions a
// second one pool records. A store (unless Config.Unbatched) therefore
// queues its claims and outcomes: a few runners (Config.BatchesInFlight)
// each take what has queued up (up to Config.MaxBatch) and send it as
// one transaction in one round trip: a statement for its claims and
// one for its outcomes, each taking its requests as arrays (batch.go).
// A request that finds nothing in flight is sent at once, alone, on its
// caller's goroutine, as the statement it runs with Config.Unbatched:
// nothing waits to fill a batch, so one worker sees no added latency,
// and requests are batched only when they queued behind batches in
// flight.
//
// Each request's answer is what its statement alone would have given:
// the batch statements do, row by row, what the statements for one key
// do, with the same conditions (fencing on the attempt, the hold token)
// and the same writes (token, event, notification). Two requests for
// one key go into successive statements of the batch, in the order
// they came, so the second reads what the first wrote, as it would
// have had they run one after the other. Rows are taken in the order
// of their keys, so two batches do not wait on each other in a cycle.
//
// What one request does cannot decide another's answer: a batch that
// PostgreSQL refuses because of one request's data, that waited on a
// lock too long (a lock_timeout set for the batch's transaction, or a
// shorter statement_timeout of the role's), that met a deadlock, or
// that lacked a resource one of its writes needed (a full disk, which
// refuses a new key's row but not a replay), rolled back whole, and its
// requests are each sent again alone. A batch whose connection failed after it was sent
// (or that met an error ending the session, which a pooler sends when its
// link to the server drops) may have committed or not: every request in it gets the connection's
// error, which is what a statement of its own whose reply was lost
// gets, and the engine reads the row back by the request's token. A
// caller whose context ends stops waiting; its request stays in the
// batch, whose answer it then does not hear, as with a reply lost; the
// batch is cancelled only when all its callers have stopped waiting. A
// request whose caller stopped waiting before a runner took it is not
// sent.

// Defaults of the batching settings.
const (
	defaultMaxBatch        = 128
	defaultBatchesInFlight = 4
)

// spareRunnerQueue is how many requests must wait before another runner
// starts beside those in flight. Fewer wait for the batch in flight to
// end, and go together in the next: a batch costs the server a commit
// and a round trip whatever it carries, and a request waits for at most
// one batch either way.
const spareRunnerQueue = 16

// stallAfter is how long requests may wait with no runner taking any
// before one more runner starts beside those in flight. A batch in
// flight on a connection that hangs (black-holed, its reply lost)
// holds the requests queued behind it until its callers' deadlines,
// seconds; requests that could go on another connection of the pool
// then go there (TestClient/HungLoneOutcomeHoldsNoClaim). It is
// longer than a batch's lock timeout, so a batch that merely waits on a
// lock does not start one. At most twice Config.BatchesInFlight run.
const stallAfter = 250 * time.Millisecond

// request is one Claim or Transition waiting for, or riding in, a batch.
type request struct {
	ctx context.Context
	// claim or transition is what to run; the other is nil.
	claim      *once.ClaimRequest
	transition *once.Transition
	// Set by the batch before done is closed.
	// cr is the claim statement's answer; err pgx.ErrNoRows when it
	// returned no row (claimRest reads it again).
	cr      once.ClaimResult
	applied bool // the transition matched
	err     error
	// alone says the batch rolled back for a reason that may be another
	// request's: the caller sends its request again on its own.
	alone bool
	done  chan struct{}
}

// key orders a batch's requests.
func (r *request) key() once.Key {
	if r.claim != nil {
		return r.claim.Key
	}
	return r.transition.Key
}

// batcher queues a store's requests and runs them in batches. The
// stores BindTx makes share it but never use it: inside a caller's
// transaction every statement runs in that transaction.
type batcher struct {
	// s is the store that made it, whose statements run on its pool.
	s        *Store
	maxBatch int
	runners  int

	mu      sync.Mutex
	queue   []*request
	running int
	// taken counts the batches runners took off the queue; watching
	// says a stall check is armed (stalled).
	taken    uint64
	watching bool

	// beforeBatch, when set (by tests), runs before each batch a runner
	// took, with the batch's size.
	beforeBatch func(n int)
}

// submit queues reqs and waits for their answers, or for ctx to end;
// reqs queued together are taken together when they fit in a batch.
// It returns ctx's error when the caller stopped waiting.
func (b *batcher) submit(ctx context.Context, reqs ...*request) error {
	for _, r := range reqs {
		r.ctx, r.done = ctx, make(chan struct{})
	}
	b.mu.Lock()
	if len(reqs) == 1 && b.running == 0 && len(b.queue) == 0 && !noDeadline(reqs[0]) {
		b.running++
		b.mu.Unlock()
		b.lone(reqs[0])
		return nil
	}
	b.queue = append(b.queue, reqs...)
	b.watch()
	b.startRunners()
	for _, r := range reqs {
		select {
		case <-r.done:
		case <-ctx.Done():
			select {
			case <-r.done:
			default:
				return ctx.Err()
			}
		}
	}
	return nil
}

// lone sends r, which found nothing queued and nothing in flight, at
// once, on its caller's goroutine: a lone caller pays no handing over
// to a runner and back. While r is sent it counts as a batch in flight
// (submit counted it), so that requests made meanwhile queue up behind
// it, as behind a runner's batch, and go together when it is answered.
// Only a request with a deadline is sent so: one without would hold
// those behind it as long as a connection that hangs does, and is sent
// beside the runners instead (run).
func (b *batcher) lone(r *request) {
	// Deferred: a caller that recovers from a panic under the statement
	// must not leave a batch counted in flight for ever, with requests
	// queued behind it and no runner to take them.
	defer b.loneDone()
	if b.beforeBatch != nil {
		b.beforeBatch(1)
	}
	if err := r.ctx.Err(); err != nil {
		r.err = err
	} else if r.claim != nil {
		r.cr, r.err = b.s.claimOne(r.ctx, *r.claim)
	} else {
		r.applied, r.err = b.s.transitionOne(r.ctx, *r.transition)
	}
	close(r.done)
}

// loneDone ends a lone request's turn in flight, and starts runners for
// the requests that queued up behind it.
func (b *batcher) loneDone() {
	b.mu.Lock()
	b.running--
	b.startRunners()
}

// startRunners starts the runners the queue calls for beside those in
// flight: one while none is, another for each spareRunnerQueue
// requests waiting, up to b.runners. It is called with b.mu held, and
// releases it.
func (b *batcher) startRunners() {
	start := 0
	if len(b.queue) > 0 {
		start = max(0, min(b.runners, 1+len(b.queue)/spareRunnerQueue)-b.running)
	}
	b.running += start
	b.mu.Unlock()
	for range start {
		go b.run()
	}
}

// watch arms a stall check, unless one is armed: if in stallAfter no
// runner has taken a batch and requests still wait, stalled starts
// another. It is called with b.mu held.
func (b *batcher) watch() {
	if b.watching {
		return
	}
	b.watching = true
	seen := b.taken
	time.AfterFunc(stallAfter, func() { b.stalled(seen) })
}

// stalled starts one more runner when requests still wait and none was
// taken since the check was armed (taken is still seen): every batch in
// flight is held up, by a connection that hangs or a slow server, and
// the queue goes on another connection. It re-arms while requests wait.
func (b *batcher) stalled(seen uint64) {
	b.mu.Lock()
	b.watching = false
	if len(b.queue) == 0 {
		b.mu.Unlock()
		return
	}
	start := b.taken == seen && b.running < 2*b.runners
	if start {
		b.running++
	}
	b.watch()
	b.mu.Unlock()
	if start {
		go b.run()
	}
}

// run takes batches off the queue until it is empty.
func (b *batcher) run() {
	for {
		b.mu.Lock()
		n := min(len(b.queue), b.maxBatch)
		if n == 0 {
			b.running--
			b.mu.Unlock()
			return
		}
		batch := slices.Clone(b.queue[:n])
		b.queue = slices.Delete(b.queue, 0, n)
		b.taken++
		b.mu.Unlock()
		// A request whose caller stopped waiting before it was sent is
		// not sent: it did not happen, which its caller may read back.
		live := batch[:0]
		for _, r := range batch {
			if err := r.ctx.Err(); err != nil {
				r.err = err
				close(r.done)
				continue
			}
			live = append(live, r)
		}
		if len(live) == 0 {
			continue
		}
		if b.beforeBatch != nil {
			b.beforeBatch(len(live))
		}
		if slices.ContainsFunc(live, noDeadline) {
			// A caller that set no deadline waits as long as a
			// connection that hangs (black-holed, not refused) does:
			// forever, and so would the runner, and every request
			// queued behind it. Its batch is sent beside the runners,
			// as its statements would have been without batching.
			go b.exec(live)
			continue
		}
		b.exec(live)
	}
}

// noDeadline reports whether r's caller set no deadline.
func noDeadline(r *request) bool {
	_, ok := r.ctx.Deadline()
	return !ok
}

// queued is how many requests wait for a runner.
func (b *batcher) queued() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}

// batched reports whether s sends its claims and outcomes through its
// batcher.
func (s *Store) batched() bool { return s.batch != nil && !s.inTx }

// ClaimMany claims many keys at once, for a caller that has them all
// in hand (a consumer that took a batch of messages off its queue): its
// requests are sent in as few batches as fit (Config.MaxBatch each),
// sharing round trips and commits. Each result and error is the one
// Claim would have given for the request at the same index; in
// particular an error may mean the claim's reply was lost after it
// committed, and the row carries req.Token if it did. Two requests for
// one key are answered as if made one after the other: the first may
// win, the second then finds its claim. With Config.Unbatched, or
// inside a caller's transaction, the claims are made one by one.
func (s *Store) ClaimMany(ctx context.Context, reqs []once.ClaimRequest) ([]once.ClaimResult, []error) {
	res, errs := make([]once.ClaimResult, len(reqs)), make([]error, len(reqs))
	if !s.batched() {
		for i, req := range reqs {
			res[i], errs[i] = s.Claim(ctx, req)
		}
		return res, errs
	}
	for _, wave := range waves(len(reqs), func(i int) once.Key { return reqs[i].Key }) {
		rs := make([]*request, len(wave))
		for j, i := range wave {
			rs[j] = &request{claim: &reqs[i]}
		}
		err := s.batch.submit(ctx, rs...)
		s.batch.answerAll(len(rs),
			func(j int) bool {
				r := rs[j]
				return (err == nil || isDone(r)) && (r.alone || r.err != nil || (!r.cr.Claimed && r.cr.Action.Status.Claimable()))
			},
			func(j int) {
				if i, r := wave[j], rs[j]; err != nil && !isDone(r) {
					errs[i] = s.wrap(err)
				} else {
					res[i], errs[i] = s.claimAnswer(ctx, reqs[i], r)
				}
			})
	}
	return res, errs
}

// TransitionMany applies many transitions at once, sharing round trips
// and commits as ClaimMany does. Each result and error is the one
// Transition would have given for the transition at the same index; an
// error may mean the reply was lost after the transition committed,
// and the row then carries its Token. Two transitions of one key apply
// in the order given.
func (s *Store) TransitionMany(ctx context.Context, ts []once.Transition) ([]bool, []error) {
	ok, errs := make([]bool, len(ts)), make([]error, len(ts))
	if !s.batched() {
		for i, t := range ts {
			ok[i], errs[i] = s.Transition(ctx, t)
		}
		return ok, errs
	}
	for _, wave := range waves(len(ts), func(i int) once.Key { return ts[i].Key }) {
		rs := make([]*request, 0, len(wave))
		at := make([]int, 0, len(wave)) // rs[j] is ts[at[j]]
		for _, i := range wave {
			// A decision on a failed first attempt writes the failure out
			// first (keepOutcome); one that cannot is not sent.
			if errs[i] = s.keepOutcome(ctx, ts[i]); errs[i] == nil {
				rs = append(rs, &request{transition: &ts[i]})
				at = append(at, i)
			}
		}
		var err error
		if len(rs) > 0 {
			err = s.batch.submit(ctx, rs...)
		}
		s.batch.answerAll(len(rs),
			func(j int) bool { return (err == nil || isDone(rs[j])) && rs[j].alone },
			func(j int) {
				if i, r := at[j], rs[j]; err != nil && !isDone(r) {
					errs[i] = s.wrap(err)
				} else {
					ok[i], errs[i] = s.transitionAnswer(ctx, ts[i], r)
				}
			})
	}
	return ok, errs
}

// waves splits n requests, keyed by key, into waves: the first request
// for each key in the first, the second in the next, and so on, each in
// the order given. ClaimMany and TransitionMany send a wave, and answer
// it, before the next: within one wave, Config.MaxBatch may put
// requests in batches that run at once, and a batch that rolled back
// is sent again one request at a time after the others were answered,
// so two requests for one key are kept in order only by going in two
// waves (TestGroupCommitManyKeepsOneKeysOrderAcrossBatches). A
// decision on an outcome given in the same call then finds it applied,
// and writes it out to the trail first, as when made after it
// (TestGroupCommitTransitionManyKeepsTheOutcomeBeforeADecision).
// Requests for distinct keys make one wave; a key given n times costs n
// round trips, as n calls would.
func waves(n int, key func(int) once.Key) [][]int {
	seen := make(map[once.Key]int, n)
	var ws [][]int
	for i := range n {
		k := key(i)
		w := seen[k]
		seen[k] = w + 1
		if w == len(ws) {
			var wave []int
			if w == 0 {
				wave = make([]int, 0, n)
			}
			ws = append(ws, wave)
		}
		ws[w] = append(ws[w], i)
	}
	return ws
}

// answerAll finishes n requests of one wave (waves: their keys are
// distinct) from their batch's answers with answer(i). A request that
// must be sent again alone, or read again (slow), may wait on a lock,
// so they are finished side by side, and the others do not wait behind
// them; but at most as many at once as the store has runners, since
// each holds a connection while it waits, and the rest of the pool is
// for heartbeats, reads and recovery.
func (b *batcher) answerAll(n int, slow func(int) bool, answer func(int)) {
	free := make(chan struct{}, b.runners)
	var wg sync.WaitGroup
	for i := range n {
		if !slow(i) {
			answer(i)
			continue
		}
		free <- struct{}{}
		wg.Go(func() {
			defer func() { <-free }()
			answer(i)
		})
	}
	wg.Wait()
}

// isDone reports whether r's batch has answered it.
func isDone(r *request) bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}
