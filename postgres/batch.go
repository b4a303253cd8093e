package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncehq/once"
	"github.com/oncehq/once/storekit"
)

// batchLockTimeout bounds each lock wait of a batch's statements. A
// batch that waits behind another transaction (a DoTx holding a key, a
// person's resolution) holds up every request in it; past this it rolls
// back and its requests are sent alone, where only the one that must
// wait does.
const batchLockTimeout = "100ms"

// batchSettingsSQL sets, for the batch's transaction only (SET LOCAL,
// as a function, which an implicit transaction takes), the lock timeout,
// and sequential scans off. The statements after it are planned with
// the setting, and PostgreSQL keeps their plans. A plan made while the
// log was small (never analyzed, or analyzed after its first rows),
// where scanning its few pages costs less than reading a key through
// the primary key, would otherwise be kept as the log grew, until the
// next analyze replaced it, and every batch would read the whole log.
// With the scans off, and the statements naming their keys on every
// read of the table (key = ANY), each batch reads only its keys' rows
// (TestGroupCommitReadsByKeyAsTheLogGrows).
const batchSettingsSQL = `SELECT set_config('lock_timeout', '` + batchLockTimeout + `', true), set_config('enable_seqscan', 'off', true)`

// exec runs reqs, alone or as one transaction, and answers each.
func (b *batcher) exec(reqs []*request) {
	ctx, cancel := batchContext(reqs)
	defer cancel()
	if len(reqs) == 1 {
		// Nothing queued up behind a batch: the request's own statement,
		// with no transaction around it, is the cheapest there is.
		r := reqs[0]
		if r.claim != nil {
			r.cr, r.err = b.s.claimOne(ctx, *r.claim)
		} else {
			r.applied, r.err = b.s.transitionOne(ctx, *r.transition)
		}
		close(r.done)
		return
	}
	// Rows are locked in the order of their keys, so two batches, each
	// holding some of the other's rows, never wait on each other. The
	// sort is stable: two requests for one key run in the order they
	// came.
	slices.SortStableFunc(reqs, func(x, y *request) int { return strings.Compare(string(x.key()), string(y.key())) })
	b.send(ctx, reqs)
	for _, r := range reqs {
		close(r.done)
	}
}

// batchContext is the context a batch runs under: not any one caller's,
// so that a caller who stops waiting cancels nothing for the others; it
// ends when every caller in the batch has stopped waiting.
func batchContext(reqs []*request) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	var left atomic.Int64
	left.Store(int64(len(reqs)))
	stops := make([]func() bool, len(reqs))
	for i, r := range reqs {
		stops[i] = context.AfterFunc(r.ctx, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}

// send runs reqs as one transaction in one round trip: a lock timeout
// and each round's statements, pipelined. They are sent with no BEGIN
// and no COMMIT: PostgreSQL runs the statements of a pipeline, up to its
// end (Sync), as one implicit transaction, which commits at the end if
// no statement failed; one that fails rolls it back, and the server
// skips the rest. send sets each request's answer: its statement's,
// when the batch committed; alone, when the batch surely rolled back
// for a reason that may be one request's; the error, when the batch
// failed otherwise, committed or not.
func (b *batcher) send(ctx context.Context, reqs []*request) {
	s := b.s
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		for _, r := range reqs {
			r.err = err
		}
		return
	}
	defer s.conns.release(conn)
	batch := &pgx.Batch{}
	batch.Queue(batchSettingsSQL)
	rounds := roundsOf(reqs)
	for _, rd := range rounds {
		if len(rd.claims) > 0 {
			batch.Queue(s.q.claims, claimsArgs(rd.claims)...)
		}
		if len(rd.transitions) > 0 {
			batch.Queue(s.q.transitions, transitionsArgs(rd.transitions)...)
		}
	}
	br := conn.SendBatch(ctx, batch)
	_, failed := br.Exec()
	for _, rd := range rounds {
		if failed != nil {
			break
		}
		if len(rd.claims) > 0 {
			failed = readClaims(br, rd.claims)
		}
		if failed == nil && len(rd.transitions) > 0 {
			failed = readTransitions(br, rd.transitions)
		}
	}
	// Close reads the pipeline's end: the answer to the commit.
	if err := br.Close(); failed == nil {
		failed = err
	}
	if failed == nil {
		return
	}
	for _, r := range reqs {
		r.cr, r.err, r.applied = once.ClaimResult{}, nil, false
	}
	if !rolledBack(failed) {
		// The batch was sent and its end not heard: it may have
		// committed. Every request gets the error a statement of its own
		// gets when its reply is lost, and is read back by its token.
		for _, r := range reqs {
			r.err = failed
		}
		return
	}
	again := sendAlone(failed)
	for _, r := range reqs {
		if again {
			r.alone = true
		} else {
			r.err = failed
		}
	}
}

// rolledBack reports whether a batch that failed with err surely wrote
// nothing: PostgreSQL answered with an error (it then skips the rest of
// the pipeline and rolls its transaction back, or the error is the
// commit's own), or nothing was sent. An error that ends the session
// (FATAL or PANIC) is not such an answer: a pooler sends one when its
// link to the server drops ("server conn crashed?", 08P01), and the
// server one when it is shut down, either of which may come after the
// commit (TestGroupCommitPoolerCrashAfterCommitReadsBack).
func rolledBack(err error) bool {
	var pe *pgconn.PgError
	var pre pgx.ErrPreprocessingBatch
	if errors.As(err, &pe) {
		return !endsSession(pe)
	}
	return errors.As(err, &pre) || pgconn.SafeToRetry(err)
}

// endsSession reports whether pe is an error after which the server, or
// a pooler in front of it, closes the connection.
func endsSession(pe *pgconn.PgError) bool {
	sev := pe.SeverityUnlocalized
	if sev == "" {
		sev = pe.Severity
	}
	return sev == "FATAL" || sev == "PANIC"
}

// sendAlone reports whether a batch that rolled back with err is sent
// again request by request, where each then gets its own answer. The
// error may be about one request's data (a data exception, an integrity
// or syntax rule, class 22, 23 or 42; a protocol violation, 08P01, such
// as a value the protocol cannot carry); about the batch as a whole
// having waited (a lock timeout, 55P03, a deadlock, 40P01, a
// serialization failure, 40001, or a role's statement_timeout shorter
// than the lock timeout, 57014: TestGroupCommitStatementTimeoutSendsAlone);
// or about what one of its writes needed (insufficient resources, class
// 53: a full disk refuses a new key's row, 53100, while a replay, which
// writes nothing, or an outcome, which may fit where the row is, goes
// through: TestDiskFullBatchedReplayAnswersBesideFailingClaims,
// TestDiskFullBatchedOutcomeFitsWhereClaimsDoNot). Anything else (the
// server shutting down, the connection lost before anything was sent)
// would fail the requests alone too; they get the error.
func sendAlone(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case pgerrcode.LockNotAvailable, pgerrcode.DeadlockDetected, pgerrcode.SerializationFailure, pgerrcode.ProtocolViolation,
			pgerrcode.QueryCanceled:
			return true
		}
		return pgerrcode.IsDataException(pe.Code) || pgerrcode.IsIntegrityConstraintViolation(pe.Code) ||
			pgerrcode.IsSyntaxErrororAccessRuleViolation(pe.Code) || pgerrcode.IsInsufficientResources(pe.Code)
	}
	var pre pgx.ErrPreprocessingBatch
	return errors.As(err, &pre)
}

// round is what one pair of statements of a batch carries: claims and
// transitions, at most one request per key, in the order of their keys.
type round struct {
	claims, transitions []*request
}

// roundsOf splits reqs, sorted by key, into rounds: the first request
// for each key in the first, the second in the next, and so on, so two
// requests for one key run one after the other, in the order they came.
func roundsOf(reqs []*request) []round {
	var rounds []round
	n := 0
	for i, r := range reqs {
		if i > 0 && r.key() == reqs[i-1].key() {
			n++
		} else {
			n = 0
		}
		if n == len(rounds) {
			rounds = append(rounds, round{})
		}
		if r.claim != nil {
			rounds[n].claims = append(rounds[n].claims, r)
		} else {
			rounds[n].transitions = append(rounds[n].transitions, r)
		}
	}
	return rounds
}

// readClaims reads the claims statement's rows into reqs' answers: a
// request whose key came back with no row gets pgx.ErrNoRows, which
// claimRest answers by reading again.
func readClaims(br pgx.BatchResults, reqs []*request) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	for _, r := range reqs {
		r.err = pgx.ErrNoRows
	}
	for rows.Next() {
		var res once.ClaimResult
		var i int64
		if err := scanAction(rows, &res.Action, &res.Claimed, &res.Now, &i); err != nil {
			return err
		}
		if i < 1 || i > int64(len(reqs)) {
			return fmt.Errorf("the claims statement answered for request %d of %d", i, len(reqs))
		}
		reqs[i-1].cr, reqs[i-1].err = res, nil
	}
	return rows.Err()
}

// readTransitions reads which of reqs applied.
func readTransitions(br pgx.BatchResults, reqs []*request) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var i, notified int64
		if err := rows.Scan(&i, &notified); err != nil {
			return err
		}
		if i < 1 || i > int64(len(reqs)) {
			return fmt.Errorf("the transitions statement answered for request %d of %d", i, len(reqs))
		}
		reqs[i-1].applied = true
	}
	return rows.Err()
}

// claimsArgs are the claims statement's arguments: one array per
// column.
func claimsArgs(reqs []*request) []any {
	n := len(reqs)
	var (
		keys, fps, runs, kinds, targets, tokens, recoveries, origins = make([]string, n), make([]string, n), make([]string, n),
			make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		steps, leases             = make([]int64, n), make([]int64, n)
		payloads                  = make([][]byte, n)
		retentions, redriveAfters = make([]*int64, n), make([]*int64, n)
		redrives                  = make([]bool, n)
		approvals                 = make([]int64, n)
		onExpiry                  = make([]string, n)
	)
	for i, r := range reqs {
		c := r.claim
		approvals[i], onExpiry[i] = c.Approval.Microseconds(), string(c.OnExpiry)
		keys[i], fps[i], runs[i], kinds[i], targets[i] = string(c.Key), string(c.Fingerprint), c.Run, c.Kind, c.Target
		tokens[i], recoveries[i], origins[i] = c.Token, storekit.RecoveryText(c.Recovery), c.Origin
		steps[i], leases[i], payloads[i], redrives[i] = c.Step, c.Lease.Microseconds(), c.Payload, c.Redrive
		retentions[i], redriveAfters[i] = optMicrosPtr(c.Retention), optMicrosPtr(c.RedriveAfter)
	}
	return []any{keys, fps, runs, steps, kinds, targets, payloads, leases, tokens, recoveries, retentions, redriveAfters, redrives, origins,
		approvals, onExpiry}
}

// transitionsArgs are the transitions statement's arguments: one array
// per column, and the default retention.
func transitionsArgs(reqs []*request) []any {
	n := len(reqs)
	var (
		keys, tos, errs, resolvedBy, notes, froms, holds = make([]string, n), make([]string, n), make([]string, n),
			make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		evTypes, evFroms, actors, evNotes, tokens, origins = make([]string, n), make([]string, n), make([]string, n),
			make([]string, n), make([]string, n), make([]string, n)
		attempts, leases, failures = make([]int64, n), make([]int64, n), make([]int64, n)
		results                    = make([]*string, n)
		newAttempts, waiting       = make([]bool, n), make([]bool, n)
		fingerprints               = make([]string, n)
		unexpired, expired         = make([]bool, n), make([]bool, n)
	)
	for i, r := range reqs {
		t := r.transition
		if len(t.Result) > 0 {
			res := string(t.Result)
			results[i] = &res
		}
		event := storekit.EventToWrite(*t)
		keys[i], attempts[i], tos[i], errs[i], newAttempts[i] = string(t.Key), int64(t.Attempt), string(t.To), t.Error, t.NewAttempt
		leases[i], failures[i], resolvedBy[i], notes[i] = t.Lease.Microseconds(), int64(t.VerifyFailures), t.ResolvedBy, t.ResolveNote
		froms[i], holds[i] = strings.Join(statuses(t.From), ","), t.Hold
		evTypes[i], evFroms[i], actors[i], evNotes[i] = event, string(t.Event.From), t.Event.Actor, t.Event.Note
		tokens[i], origins[i], waiting[i] = t.Token, t.Event.Origin, t.Waiting
		fingerprints[i], unexpired[i], expired[i] = string(t.Fingerprint), t.Unexpired, t.Expired
	}
	return []any{keys, attempts, tos, results, errs, newAttempts, leases, failures, resolvedBy, notes, froms, holds,
		evTypes, evFroms, actors, evNotes, tokens, once.DefaultRetention.Microseconds(), origins,
		waiting, once.DefaultRedriveAfter.Microseconds(), fingerprints, unexpired, expired}
}

// optMicrosPtr is a duration in microseconds, zero as NULL.
func optMicrosPtr(d time.Duration) *int64 {
	if d == 0 {
		return nil
	}
	us := d.Microseconds()
	return &us
}

// claimArgs are the claim statement's arguments.
func claimArgs(req once.ClaimRequest) []any {
	return []any{string(req.Key), string(req.Fingerprint), req.Run, req.Step, req.Kind, req.Target, req.Payload, req.Lease.Microseconds(), req.Token,
		storekit.RecoveryText(req.Recovery), optMicros(req.Retention), optMicros(req.RedriveAfter), req.Redrive, req.Origin,
		req.Approval.Microseconds(), string(req.OnExpiry)}
}

// transitionArgs are the transition statement's arguments.
func transitionArgs(t once.Transition) []any {
	var result any
	if len(t.Result) > 0 {
		result = string(t.Result)
	}
	event := storekit.EventToWrite(t)
	return []any{string(t.Key), t.Attempt, string(t.To), result, t.Error,
		t.NewAttempt, t.Lease.Microseconds(), t.VerifyFailures, t.ResolvedBy, t.ResolveNote,
		statuses(t.From), t.Hold, event, string(t.Event.From), t.Event.Actor, t.Event.Note, t.Token,
		once.DefaultRetention.Microseconds(), t.Event.Origin, t.Waiting, once.DefaultRedriveAfter.Microseconds(),
		string(t.Fingerprint), t.Unexpired, t.Expired}
}
