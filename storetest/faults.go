package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncehq/once"
)

// Faults are the partial failures a harness can put between one store
// (the faulted one Harness.Faults returns) and its database. Each is
// real: a connection that stops answering, a reply lost after the
// database committed, connections refused.
type Faults interface {
	// Hang makes calls over the faulted store hang instead of fail, until
	// Hang(false): a half-open partition. On a store whose database lives
	// in one file (SQLite) the hang is the database's write lock held by
	// another connection, and every store on the file hangs alike.
	Hang(on bool)
	// Refuse makes the faulted store's connections fail at once, open
	// ones and new ones, until Refuse(false). Needs Features.Refusal.
	Refuse(on bool)
	// End ends every connection the faulted store holds, open or idle,
	// at once, on the database's side (a DBA's pg_terminate_backend, an
	// idle-session timeout, a pooler's restart); new ones are accepted.
	// Needs Features.Refusal.
	End()
	// LoseReply arms a lost reply: the next statement of the faulted
	// store whose text contains marker is carried out and committed, and
	// its reply never arrives; with hang the connection then hangs
	// instead of closing. The channel closes when it happened. Needs
	// Features.LostReplies.
	LoseReply(marker string, hang bool) <-chan struct{}
	// Lock holds key's row locked, in a transaction of the harness's own
	// on the database, until unlock ends it: every write to the row
	// waits meanwhile, as behind a slow or long transaction. On a store
	// whose database has one write lock (SQLite) every write waits.
	Lock(ctx context.Context, key once.Key) (unlock func() error, err error)
}

// Markers name the statements LoseReply can aim at, in the store's own
// SQL; a harness with Features.LostReplies sets them.
type Markers struct {
	// Claim is text found only in the claim of a new key.
	Claim string
	// Transition is text found only in Store.Transition's statement.
	Transition string
	// Events is text found only in Store.Events' read of the trail.
	Events string
	// Recoverable is text found only in Store.Recoverable's statement
	// that takes a batch (RecoverRequest.Key empty).
	Recoverable string
	// AppendEvent is text found only in Store.AppendEvent's statement.
	AppendEvent string
	// Reclaim is text found only in the claim of a released or approved
	// key, as the next attempt.
	Reclaim string
}

// faultTests are the partial-failure cases: every one needs
// Harness.Faults, and some a feature more.
func faultTests() []namedTest {
	return []namedTest{
		{name: "FaultHungConnectionStopsTheEffect", fn: testFaultHung, needs: needFaults},
		{name: "FaultRefusedConnectionStopsTheEffect", fn: testFaultRefused, needs: needFaults | needRefusal},
		{name: "FaultClaimReplyLost", fn: testFaultClaimReplyLost, needs: needFaults | needLostReplies},
		{name: "FaultClaimWonAfterCallerGaveUp", fn: testFaultClaimWonAfterCallerGaveUp, needs: needFaults | needLostReplies},
		{name: "FaultResolveReplyLost", fn: testFaultResolveReplyLost, needs: needFaults | needLostReplies},
		{name: "FaultOutcomeReplyLost", fn: testFaultOutcomeReplyLost, needs: needFaults | needLostReplies},
		{name: "FaultVerifiedBeforeRunReplyLost", fn: testFaultVerifiedBeforeRunReplyLost, needs: needFaults | needLostReplies},
		{name: "FaultVerifiedBeforeRunHangs", fn: testFaultVerifiedBeforeRunHangs, needs: needFaults},
		{name: "FaultFailureReplyLostThenDecided", fn: testFaultFailureReplyLostThenDecided, needs: needFaults | needLostReplies},
		{name: "FaultClaimOnKeyHeldByOpenTx", fn: testFaultClaimOnKeyHeldByOpenTx, needs: needTx},
	}
}

// faultClients returns a client over a faulted store, a client over the
// harness's own store on the same database, and the faults.
func faultClients(t *testing.T, h Harness, cfg once.Config) (cut, direct *once.Client, s once.Store, f Faults) {
	t.Helper()
	s, spec := newStore(t, h)
	fs, f := h.Faults(t, spec)
	cfg.Store = fs
	cut, err := once.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Store = s
	direct, err = once.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cut, direct, s, f
}

// interval is when one attempt's effect ran, by this process's clock.
type interval struct {
	attempt    int
	start, end time.Time
}

type intervals struct {
	mu  sync.Mutex
	all []interval
}

func (r *intervals) add(i interval) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, i)
}

func (r *intervals) get() []interval {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]interval(nil), r.all...)
}

// A worker cut off from the database by a half-open partition must stop
// its effect before recovery lets a second attempt run: two attempts
// never overlap. The heartbeat's calls hang rather than fail, so only a
// deadline on each call and a timer of its own can stop the effect in
// time.
func testFaultHung(t *testing.T, h Harness) {
	for _, rec := range []once.Recovery{once.RetryWithProviderKey, once.VerifyThenDecide} {
		t.Run(rec.String(), func(t *testing.T) {
			cutOff(t, h, rec, func(f Faults, on bool) { f.Hang(on) })
		})
	}
}

// Refused connections fail fast instead; the effect must still stop
// before recovery, not a heartbeat period after the lease ended.
func testFaultRefused(t *testing.T, h Harness) {
	for _, rec := range []once.Recovery{once.RetryWithProviderKey, once.VerifyThenDecide} {
		t.Run(rec.String(), func(t *testing.T) {
			cutOff(t, h, rec, func(f Faults, on bool) { f.Refuse(on) })
		})
	}
}

// cutOff runs the cut-off-worker scenario with fault applying the cut.
// Attempt 1 runs on the faulted store and is cut off inside its effect,
// which runs until its context ends, as a long call that honours its
// context does. A redelivered job on the harness's own store comes back
// until it runs as attempt 2. The cut ends once attempt 1's effect has
// returned (a store whose cut holds up every connection, SQLite's lock,
// needs that to let attempt 2 run at all) or after a while.
func cutOff(t *testing.T, h Harness, rec once.Recovery, fault func(Faults, bool)) {
	pol := once.KindPolicy{Recovery: rec, Lease: 600 * time.Millisecond, MaxExecution: 30 * time.Second}
	if rec == once.VerifyThenDecide {
		pol.Verifier = func(context.Context, once.Action) (bool, json.RawMessage, error) { return false, nil, nil }
	}
	worker1, worker2, st, f := faultClients(t, h, once.Config{Default: pol, RecordTimeout: time.Second, ClaimTimeout: time.Second})
	defer func() {
		// The trail, for a reader of a failure.
		evs, _ := st.Events(context.Background(), keyOf(t, once.Intent{Run: "partition", Kind: "post_message", Target: "#general"}))
		for _, e := range evs {
			t.Logf("%s %s attempt %d: %s", e.At.Format("15:04:05.000"), e.Type, e.Attempt, e.Note)
		}
	}()
	in := once.Intent{Run: "partition", Kind: "post_message", Target: "#general"}
	var log intervals
	cut := make(chan struct{})
	returned := make(chan struct{})
	effect := func(ctx context.Context, a once.Attempt) (string, error) {
		i := interval{attempt: a.Number, start: time.Now()}
		if a.Number == 1 {
			fault(f, true)
			close(cut)
			<-ctx.Done()
		}
		i.end = time.Now()
		log.add(i)
		if a.Number == 1 {
			close(returned)
		}
		return "posted", ctx.Err()
	}
	done := make(chan error, 1)
	go func() {
		_, err := once.Do(context.Background(), worker1, in, effect)
		done <- err
	}()
	<-cut
	go func() {
		// The cut lasts past the lease, so a second attempt on a store
		// the cut does not hold up (another machine's connection) is
		// recovery's doing, not the first worker's own record.
		select {
		case <-returned:
			time.Sleep(2 * pol.Lease)
		case <-time.After(15 * time.Second):
		}
		fault(f, false)
	}()
	deadline := time.Now().Add(40 * time.Second)
	for {
		res, err := once.Do(ctx(t), worker2, in, effect)
		if err == nil && res.Attempt >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no second attempt within 40s: last %v", err)
		}
		// In flight, awaiting recovery, or the database held up: the
		// job goes back to its queue.
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the cut-off worker's effect was still running after a second attempt ran")
	}
	got := log.get()
	if len(got) != 2 {
		t.Fatalf("effect intervals = %+v, want two attempts", got)
	}
	first, second := got[0], got[1]
	if first.attempt != 1 {
		first, second = second, first
	}
	t.Logf("attempt 1 ran %s–%s, attempt 2 started %s", first.start.Format("15:04:05.000"), first.end.Format("15:04:05.000"), second.start.Format("15:04:05.000"))
	if !first.end.Before(second.start) {
		t.Fatalf("attempt 1 ran until %s, attempt 2 started at %s: two attempts ran at once",
			first.end.Format("15:04:05.000"), second.start.Format("15:04:05.000"))
	}
}

// The claim commits and its reply is lost. The worker must find out that
// the claim is its own and carry on: one execution, recorded, and no
// person paged for an effect that never started.
func testFaultClaimReplyLost(t *testing.T, h Harness) {
	c, _, s, f := faultClients(t, h, once.Config{Default: once.KindPolicy{Lease: 2 * time.Second}})
	in := once.Intent{Run: "lost-claim", Kind: "send_email", Target: "ada@example.com"}
	lost := f.LoseReply(h.Markers.Claim, false)
	ran := 0
	res, err := once.Do(ctx(t), c, in, func(context.Context, once.Attempt) (string, error) {
		ran++
		return "sent", nil
	})
	select {
	case <-lost:
	default:
		t.Fatal("the claim's reply was never lost")
	}
	if err != nil || res.Value != "sent" || ran != 1 {
		t.Fatalf("Do after a lost claim reply = %+v, %v (ran %d); want the effect run once and recorded", res, err, ran)
	}
	if a := mustGet(t, s, keyOf(t, in)); a.Status != once.StatusSucceeded || a.Attempt != 1 {
		t.Fatalf("stored %s attempt %d", a.Status, a.Attempt)
	}
}

// The claim commits, its reply never comes, and the caller gives up
// waiting (its context ends). The claim is found to be this caller's,
// and since the caller is gone it is released unrun: the next delivery
// runs the effect, instead of meeting a claim nobody holds.
func testFaultClaimWonAfterCallerGaveUp(t *testing.T, h Harness) {
	c, direct, s, f := faultClients(t, h, once.Config{Default: once.KindPolicy{Lease: time.Minute}})
	in := once.Intent{Run: "gave-up", Kind: "send_email", Target: "ada@example.com"}
	hung := f.LoseReply(h.Markers.Claim, true)
	cctx, cancel := context.WithCancel(ctx(t))
	go func() {
		<-hung
		cancel()
	}()
	ran := 0
	_, err := once.Do(cctx, c, in, func(context.Context, once.Attempt) (string, error) {
		ran++
		return "sent", nil
	})
	if !errors.Is(err, once.ErrRetryLater) || ran != 0 || once.Dispose(err).Action != once.JobRetry {
		t.Fatalf("Do whose caller gave up = %v (ran %d); want the claim released unrun (ErrRetryLater)", err, ran)
	}
	if a := mustGet(t, s, keyOf(t, in)); a.Status != once.StatusReleased {
		t.Fatalf("stored %s; want released", a.Status)
	}
	res, err := once.Do(ctx(t), direct, in, func(context.Context, once.Attempt) (string, error) {
		ran++
		return "sent", nil
	})
	if err != nil || ran != 1 || res.Attempt != 2 {
		t.Fatalf("next delivery = %+v, %v (ran %d); want it to run as attempt 2", res, err, ran)
	}
}

// A person's decision commits and its reply is lost: Resolve must report
// the decision applied, not refused, and the trail must not say it was.
func testFaultResolveReplyLost(t *testing.T, h Harness) {
	c, direct, s, f := faultClients(t, h, once.Config{})
	in := once.Intent{Run: "lost-resolve", Kind: "send_email", Target: "ada@example.com"}
	if _, err := once.Do(ctx(t), direct, in, func(context.Context, once.Attempt) (int, error) { return 0, errors.New("timeout after DATA") }); !errors.Is(err, once.ErrReview) {
		t.Fatalf("Do = %v, want review", err)
	}
	k := keyOf(t, in)
	lost := f.LoseReply(h.Markers.Transition, false)
	a, err := c.Resolve(ctx(t), k, once.Resolution{Decision: once.DecisionDone, By: "ada", Note: "in the mail log"})
	select {
	case <-lost:
	default:
		t.Fatal("the resolution's reply was never lost")
	}
	if err != nil || a.Status != once.StatusSucceeded {
		t.Fatalf("Resolve after a lost reply = %s, %v; want the decision reported applied", a.Status, err)
	}
	if tr := trail(t, s, k); tr != "claimed,review,resolved" {
		t.Fatalf("trail %s; want the person's decision, and no refusal", tr)
	}
}

// A plain Do on a key that an open DoTx has claimed must not wait for as
// long as the transaction lasts (holding a connection all the while): it
// answers in flight after Config.ClaimTimeout, runs nothing, and the job
// goes back to its queue. (On SQLite the open transaction holds the
// whole file's write lock, so the same answer comes for any key.)
func testFaultClaimOnKeyHeldByOpenTx(t *testing.T, h Harness) {
	_, c, th := txSetup(t, h, once.Config{ClaimTimeout: time.Second})
	var effects atomic.Int64
	tx := begin(t, th)
	defer tx.rollback(context.Background())
	if _, err := tx.do(ctx(t), c, txIntent, writeOutbox(&effects)); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := once.Do(ctx(t), c, txIntent, func(context.Context, once.Attempt) (string, error) {
			t.Error("ran the effect of an action an open transaction holds")
			return "", nil
		})
		done <- err
	}()
	select {
	case err := <-done:
		var inFlight *once.InFlightError
		if !errors.As(err, &inFlight) || !inFlight.InTransaction || once.Dispose(err).Action != once.JobRetry {
			t.Fatalf("Do on a key held by an open transaction = %v; want *InFlightError (InTransaction)", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Do waited on the open transaction for 30s")
	}
	commit(t, tx)
	if res, err := once.Do(ctx(t), c, txIntent, (&counter{}).fn("x")); err != nil || !res.Replayed {
		t.Fatalf("after the commit = %+v, %v; want the transaction's result replayed", res, err)
	}
}

// The outcome's record commits and its reply is lost: the worker tries
// again, finds the row moved on, reads it back, and knows from its token
// that the write was its own. Do reports the success, once, and nothing
// runs again.
func testFaultOutcomeReplyLost(t *testing.T, h Harness) {
	c, direct, s, f := faultClients(t, h, once.Config{})
	in := once.Intent{Run: "lost-outcome", Kind: "send_email", Target: "ada@example.com"}
	var lost <-chan struct{}
	ran := 0
	res, err := once.Do(ctx(t), c, in, func(context.Context, once.Attempt) (string, error) {
		ran++
		lost = f.LoseReply(h.Markers.Transition, false)
		return "250 queued", nil
	})
	select {
	case <-lost:
	default:
		t.Fatal("the outcome's reply was never lost")
	}
	if err != nil || res.Value != "250 queued" || ran != 1 {
		t.Fatalf("Do after a lost outcome reply = %+v, %v (ran %d); want the success reported", res, err, ran)
	}
	if tr := trail(t, s, keyOf(t, in)); tr != "claimed,succeeded" {
		t.Fatalf("trail %s; want the outcome recorded once", tr)
	}
	dup, err := once.Do(ctx(t), direct, in, func(context.Context, once.Attempt) (string, error) {
		ran++
		return "", nil
	})
	if err != nil || !dup.Replayed || dup.Value != "250 queued" || ran != 1 {
		t.Fatalf("redelivery = %+v, %v (ran %d); want the result replayed", dup, err, ran)
	}
}

// The answer a released action's next attempt got from the verifier
// (landed) commits, and its reply is lost: the worker reads the row back
// by its token, finds its write applied, and reports the verifier's
// result; nothing ran, and a duplicate replays it.
func testFaultVerifiedBeforeRunReplyLost(t *testing.T, h Harness) {
	var asked atomic.Int64
	var f Faults
	var lost <-chan struct{}
	c, direct, s, f := faultClients(t, h, once.Config{Default: once.KindPolicy{Recovery: once.VerifyThenDecide,
		Verifier: func(context.Context, once.Action) (bool, json.RawMessage, error) {
			if asked.Add(1) == 1 {
				return false, nil, nil // the reaper's: no trace
			}
			lost = f.LoseReply(h.Markers.Transition, false)
			return true, json.RawMessage(`"v"`), nil
		}}})
	in := once.Intent{Run: "lost-verified", Kind: "send_email", Target: "ada@example.com"}
	reapedNoTrace(t, s, direct, in)
	var effects counter
	res, err := once.Do(ctx(t), c, in, effects.fn("x"))
	select {
	case <-lost:
	default:
		t.Fatal("the reply of the verifier's answer was never lost")
	}
	if err != nil || res.Value != "v" || !res.Replayed || effects.n.Load() != 0 {
		t.Fatalf("Do after a lost reply = %+v, %v (ran %d); want the verifier's result, nothing run", res, err, effects.n.Load())
	}
	dup, err := once.Do(ctx(t), direct, in, effects.fn("x"))
	if err != nil || !dup.Replayed || dup.Value != "v" || effects.n.Load() != 0 {
		t.Fatalf("redelivery = %+v, %v (ran %d); want the result replayed", dup, err, effects.n.Load())
	}
}

// The database hangs (a half-open connection; SQLite's lock held) just
// as a released action's next attempt records the verifier's answer: the
// record gives up within RecordTimeout and says it was not recorded, and
// nothing ran. The attempt stays in flight; once the database answers
// again and its lease lapses, the next delivery recovers it, asks the
// verifier, and stores the effect as landed, run by no one.
func testFaultVerifiedBeforeRunHangs(t *testing.T, h Harness) {
	var asked atomic.Int64
	var f Faults
	c, direct, s, f := faultClients(t, h, once.Config{RecordTimeout: time.Second, Default: once.KindPolicy{Recovery: once.VerifyThenDecide, Lease: 600 * time.Millisecond,
		Verifier: func(context.Context, once.Action) (bool, json.RawMessage, error) {
			switch asked.Add(1) {
			case 1:
				return false, nil, nil // the reaper's: no trace
			case 2:
				f.Hang(true)
			}
			return true, json.RawMessage(`"v"`), nil
		}}})
	in := once.Intent{Run: "hung-verified", Kind: "send_email", Target: "ada@example.com"}
	k := keyOf(t, in)
	reapedNoTrace(t, s, direct, in)
	var effects counter
	_, err := once.Do(ctx(t), c, in, effects.fn("x"))
	f.Hang(false)
	if effects.n.Load() != 0 || !errors.Is(err, once.ErrNotRecorded) {
		t.Fatalf("Do while the database hangs = %v (ran %d); want nothing run, and the answer not recorded", err, effects.n.Load())
	}
	lapse(t, s, k)
	res, err := once.Do(ctx(t), direct, in, effects.fn("x"))
	if err != nil || res.Value != "v" || !res.Replayed || effects.n.Load() != 0 {
		t.Fatalf("the next delivery = %+v, %v (ran %d); want the verifier's result, nothing run", res, err, effects.n.Load())
	}
}

// A worker's permanent failure of a first attempt commits and its reply
// is lost; while the worker tries again, a person decides on the
// failure (retry). The worker's next try is refused, and reading back
// whether its lost try applied must still find the failure in the
// trail, though the decision changed the row (and its token): the
// worker reports the failure it recorded, not a refused outcome, and the
// trail holds the failure once, then the decision.
func testFaultFailureReplyLostThenDecided(t *testing.T, h Harness) {
	c, direct, s, f := faultClients(t, h, once.Config{})
	in := once.Intent{Run: "lost-failure", Kind: "send_email", Target: "ada@example.com"}
	k := keyOf(t, in)
	lost := make(chan (<-chan struct{}), 1)
	done := make(chan error, 1)
	go func() {
		_, err := once.Do(ctx(t), c, in, func(context.Context, once.Attempt) (string, error) {
			lost <- f.LoseReply(h.Markers.Transition, true)
			return "", once.Permanent(errors.New("550 mailbox does not exist"))
		})
		done <- err
	}()
	select {
	case <-(<-lost):
	case err := <-done:
		t.Fatalf("Do returned %v before its outcome's reply was lost", err)
	}
	// The failure is committed: the person sees it and decides.
	if a := mustGet(t, s, k); a.Status != once.StatusFailed || a.Attempt != 1 {
		t.Fatalf("stored %s attempt %d, want the failure of attempt 1 committed", a.Status, a.Attempt)
	}
	if _, err := direct.Resolve(ctx(t), k, once.Resolution{Decision: once.DecisionRetry, By: "ops", Note: "address fixed", Attempt: 1}); err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	f.Hang(false)
	err := <-done
	var failed *once.FailedError
	if !errors.As(err, &failed) {
		t.Fatalf("Do = %v; want the failure it recorded reported (*once.FailedError)", err)
	}
	if tr := trail(t, s, k); tr != "claimed,failed,resolved" {
		t.Fatalf("trail %s; want the failure once, then the decision, and no refusal", tr)
	}
}
