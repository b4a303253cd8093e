package storetest

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncehq/once"
)

// Do and DoTx made with WaitFor: a duplicate that meets a live claim
// waits for its outcome.

func waitTests() []namedTest {
	return []namedTest{
		{name: "WaitReplaysSuccess", fn: testWaitReplays},
		{name: "WaitGetsPermanentFailure", fn: testWaitFailed},
		{name: "WaitClaimsReleased", fn: testWaitReleased},
		{name: "WaitTimesOut", fn: testWaitTimesOut},
		{name: "WaitEndsWithContext", fn: testWaitContext},
		{name: "WaitRecoversLapsedClaim", fn: testWaitLapsed},
		{name: "WaitManyWaiters", fn: testWaitMany},
		{name: "WaitOnlyForLiveClaims", fn: testWaitOnlyLive},
		{name: "WaitWithoutStoreWaiter", fn: testWaitPlainStore},
		{name: "WaitForUncommittedTx", fn: testWaitUncommitted, needs: needTx},
		{name: "WaitForRolledBackTx", fn: testWaitRolledBack, needs: needTx},
		{name: "WaitForReclaimingTx", fn: testWaitReclaimingTx, needs: needTx},
		{name: "DoTxWaitFor", fn: testDoTxWait, needs: needTx},
	}
}

// patience bounds every wait of these tests for something that must
// happen; the waits under test are longer, so a call that returned early
// is told from one woken by what it waited for.
const patience = 30 * time.Second

// recv receives from ch, failing the test after patience.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(patience):
		t.Fatalf("%s did not happen within %v", what, patience)
		panic("unreachable")
	}
}

// waitSetup is setup with a hook that sends every EventWaiting
// observation on the returned channel.
func waitSetup(t *testing.T, h Harness, cfg once.Config) (once.Store, *once.Client, <-chan once.Observation) {
	t.Helper()
	waits := watchWaits(&cfg)
	s, c, _ := setup(t, h, cfg)
	return s, c, waits
}

// watchWaits sets cfg's hooks to send every EventWaiting observation on
// the returned channel.
func watchWaits(cfg *once.Config) <-chan once.Observation {
	waits := make(chan once.Observation, 64)
	cfg.Hooks.OnEvent = func(_ context.Context, o once.Observation) {
		if o.Type == once.EventWaiting {
			waits <- o
		}
	}
	return waits
}

type doResult struct {
	res once.Result[string]
	err error
}

// goDo runs Do in a goroutine.
func goDo(ctx context.Context, c *once.Client, in once.Intent, fn func(context.Context, once.Attempt) (string, error), opts ...once.DoOption) <-chan doResult {
	out := make(chan doResult, 1)
	go func() {
		res, err := once.Do(ctx, c, in, fn, opts...)
		out <- doResult{res, err}
	}()
	return out
}

// blocked is a first attempt whose effect runs until finish says how it
// ends.
type blocked struct {
	t    *testing.T
	end  chan doResult
	done <-chan doResult
}

// startBlocked starts Do on in and returns once its effect runs.
func startBlocked(t *testing.T, c *once.Client, in once.Intent) *blocked {
	t.Helper()
	started := make(chan struct{})
	b := &blocked{t: t, end: make(chan doResult, 1)}
	b.done = goDo(ctx(t), c, in, func(ctx context.Context, a once.Attempt) (string, error) {
		close(started)
		e := <-b.end
		return e.res.Value, e.err
	})
	recv(t, started, "the first attempt's effect starting")
	return b
}

// finish makes the effect return v and err, and returns what the first
// Do returned.
func (b *blocked) finish(v string, err error) doResult {
	b.t.Helper()
	b.end <- doResult{res: once.Result[string]{Value: v}, err: err}
	return recv(b.t, b.done, "the first Do returning")
}

func mustNotRun(t *testing.T) func(context.Context, once.Attempt) (string, error) {
	return func(context.Context, once.Attempt) (string, error) {
		t.Error("the waiting duplicate ran the effect")
		return "", nil
	}
}

func testWaitReplays(t *testing.T, h Harness) {
	_, c, waits := waitSetup(t, h, once.Config{})
	first := startBlocked(t, c, intent(1))
	second := goDo(ctx(t), c, intent(1), mustNotRun(t), once.WaitFor(time.Hour))
	w := recv(t, waits, "the duplicate waiting")
	if w.Key != keyOf(t, intent(1)) || w.Attempt != 1 || w.From != once.StatusInFlight || w.Kind != intent(1).Kind {
		t.Fatalf("waiting observation %+v", w)
	}
	if o := first.finish("msg-42", nil); o.err != nil || o.res.Replayed {
		t.Fatalf("first Do = %+v, %v", o.res, o.err)
	}
	o := recv(t, second, "the waiting duplicate returning")
	if o.err != nil || !o.res.Replayed || o.res.Value != "msg-42" || o.res.Attempt != 1 {
		t.Fatalf("waiting duplicate = %+v, %v; want the first's result replayed", o.res, o.err)
	}
}

func testWaitFailed(t *testing.T, h Harness) {
	_, c, waits := waitSetup(t, h, once.Config{})
	first := startBlocked(t, c, intent(1))
	second := goDo(ctx(t), c, intent(1), mustNotRun(t), once.WaitFor(time.Hour))
	recv(t, waits, "the duplicate waiting")
	cause := errors.New("550 no such mailbox")
	if o := first.finish("", once.Permanent(cause)); !errors.Is(o.err, once.ErrFailed) {
		t.Fatalf("first Do = %v, want ErrFailed", o.err)
	}
	o := recv(t, second, "the waiting duplicate returning")
	var fe *once.FailedError
	if !errors.As(o.err, &fe) || !fe.Replayed || fe.Message != cause.Error() || fe.Attempt != 1 {
		t.Fatalf("waiting duplicate = %v; want the stored *FailedError", o.err)
	}
}

// Released by its effect, the action is the duplicate's to run, as it
// would be a later delivery's.
func testWaitReleased(t *testing.T, h Harness) {
	s, c, waits := waitSetup(t, h, once.Config{})
	first := startBlocked(t, c, intent(1))
	var provider atomic.Value
	second := goDo(ctx(t), c, intent(1), func(_ context.Context, a once.Attempt) (string, error) {
		provider.Store(a.ProviderKey)
		if a.Number != 2 {
			t.Errorf("the duplicate ran attempt %d, want 2", a.Number)
		}
		return "sent by the duplicate", nil
	}, once.WaitFor(time.Hour))
	recv(t, waits, "the duplicate waiting")
	if o := first.finish("", once.RetryLater(errors.New("429 too many requests"))); !errors.Is(o.err, once.ErrRetryLater) {
		t.Fatalf("first Do = %v, want ErrRetryLater", o.err)
	}
	o := recv(t, second, "the waiting duplicate returning")
	if o.err != nil || o.res.Replayed || o.res.Value != "sent by the duplicate" || o.res.Attempt != 2 {
		t.Fatalf("waiting duplicate = %+v, %v; want it to claim and run the released action", o.res, o.err)
	}
	k := keyOf(t, intent(1))
	if provider.Load() != string(k) {
		t.Fatalf("provider key %v, want the action's", provider.Load())
	}
	if a := mustGet(t, s, k); a.Status != once.StatusSucceeded || a.Attempt != 2 {
		t.Fatalf("stored %+v", a)
	}
}

// A first attempt that runs past the wait: the duplicate gets the
// *InFlightError it would have got at once, with the lease as it stands
// after the first's heartbeats, and how long it waited.
func testWaitTimesOut(t *testing.T, h Harness) {
	s, c, waits := waitSetup(t, h, once.Config{Default: once.KindPolicy{Lease: heartbeatLease}})
	first := startBlocked(t, c, intent(1))
	k := keyOf(t, intent(1))
	before := mustGet(t, s, k).LeaseUntil
	limit := 2 * heartbeatLease
	second := goDo(ctx(t), c, intent(1), mustNotRun(t), once.WaitFor(limit))
	recv(t, waits, "the duplicate waiting")
	o := recv(t, second, "the waiting duplicate giving up")
	var ife *once.InFlightError
	if !errors.As(o.err, &ife) || ife.Expired || ife.Attempt != 1 || ife.Key != k {
		t.Fatalf("waiting duplicate = %v; want an unexpired *InFlightError", o.err)
	}
	if ife.Waited < limit || !strings.Contains(ife.Error(), "after waiting") {
		t.Fatalf("Waited = %v (%q); want at least the %v asked for, said", ife.Waited, ife.Error(), limit)
	}
	if !ife.LeaseUntil.After(before) {
		t.Fatalf("LeaseUntil %v, not after %v: not read afresh when the wait ended", ife.LeaseUntil, before)
	}
	if errors.Is(o.err, context.Canceled) || errors.Is(o.err, context.DeadlineExceeded) {
		t.Fatalf("a wait that ran out says the context ended: %v", o.err)
	}
	if d := once.Dispose(o.err); d.Action != once.JobRetry {
		t.Fatalf("Dispose = %+v, want retry", d)
	}
	if r := first.finish("done", nil); r.err != nil {
		t.Fatalf("first Do = %v", r.err)
	}
}

func testWaitContext(t *testing.T, h Harness) {
	_, c, waits := waitSetup(t, h, once.Config{})
	first := startBlocked(t, c, intent(1))
	wctx, cancel := context.WithCancel(ctx(t))
	second := goDo(wctx, c, intent(1), mustNotRun(t), once.WaitFor(time.Hour))
	recv(t, waits, "the duplicate waiting")
	cancel()
	// The first is still running: only the context can end the wait.
	o := recv(t, second, "the waiting duplicate returning after its context ended")
	var ife *once.InFlightError
	if !errors.As(o.err, &ife) || !errors.Is(o.err, context.Canceled) || ife.Waited <= 0 {
		t.Fatalf("waiting duplicate = %v; want the *InFlightError, matching context.Canceled, with Waited", o.err)
	}
	if r := first.finish("done", nil); r.err != nil {
		t.Fatalf("first Do = %v", r.err)
	}
}

// A first attempt whose worker died: its lease runs out while the
// duplicate waits, and the kind's recovery applies inline, as on a later
// delivery. Under RetryWithProviderKey the duplicate takes it over and
// runs it; under AskPerson it is put up for review.
func testWaitLapsed(t *testing.T, h Harness) {
	s, c, waits := waitSetup(t, h, once.Config{Kinds: map[string]once.KindPolicy{"charge_card": {Recovery: once.RetryWithProviderKey}}})
	// Long enough to be live when the duplicate claims, on a loaded
	// machine too.
	const lease = 2 * time.Second
	retry := intent(1)
	retry.Kind = "charge_card"
	ask := intent(2)
	mustClaim(t, s, claimReq(t, retry, lease))
	mustClaim(t, s, claimReq(t, ask, lease))
	retried := goDo(ctx(t), c, retry, func(_ context.Context, a once.Attempt) (string, error) {
		return "charged", nil
	}, once.WaitFor(time.Hour))
	reviewed := goDo(ctx(t), c, ask, mustNotRun(t), once.WaitFor(time.Hour))
	recv(t, waits, "a duplicate waiting")
	recv(t, waits, "the other duplicate waiting")
	o := recv(t, retried, "the duplicate of the retried kind returning")
	if o.err != nil || o.res.Value != "charged" || o.res.Attempt != 2 || o.res.Replayed {
		t.Fatalf("duplicate under RetryWithProviderKey = %+v, %v; want it to take the lapsed claim over and run it", o.res, o.err)
	}
	o = recv(t, reviewed, "the duplicate of the reviewed kind returning")
	if !errors.Is(o.err, once.ErrReview) {
		t.Fatalf("duplicate under AskPerson = %v; want ErrReview", o.err)
	}
	if a := mustGet(t, s, keyOf(t, ask)); a.Status != once.StatusReview || a.Attempt != 1 {
		t.Fatalf("stored %+v", a)
	}
}

func testWaitMany(t *testing.T, h Harness) {
	_, c, waits := waitSetup(t, h, once.Config{})
	first := startBlocked(t, c, intent(1))
	const n = 8
	var outs []<-chan doResult
	for range n {
		outs = append(outs, goDo(ctx(t), c, intent(1), mustNotRun(t), once.WaitFor(time.Hour)))
	}
	for range n {
		recv(t, waits, "every duplicate waiting")
	}
	first.finish("once", nil)
	for _, out := range outs {
		if o := recv(t, out, "a waiting duplicate returning"); o.err != nil || !o.res.Replayed || o.res.Value != "once" {
			t.Fatalf("waiting duplicate = %+v, %v", o.res, o.err)
		}
	}
}

// What is not a live claim is answered at once, as without waiting, and
// a bad wait is refused before any I/O.
func testWaitOnlyLive(t *testing.T, h Harness) {
	s, c, waits := waitSetup(t, h, once.Config{})
	if _, err := once.Do(ctx(t), c, intent(1), mustNotRun(t), once.WaitFor(-time.Second)); err == nil || !strings.Contains(err.Error(), "WaitFor") {
		t.Fatalf("WaitFor(-1s) = %v; want an error naming WaitFor", err)
	}
	if _, err := s.Get(ctx(t), keyOf(t, intent(1))); !isNotFound(err) {
		t.Fatalf("a refused call wrote: %v", err)
	}
	held := claimReq(t, intent(1), time.Hour)
	mustClaim(t, s, held)
	changed := intent(1)
	changed.Payload = "another body"
	if _, err := once.Do(ctx(t), c, changed, mustNotRun(t), once.WaitFor(time.Hour)); !errors.Is(err, once.ErrFingerprintMismatch) {
		t.Fatalf("a different payload = %v; want ErrFingerprintMismatch at once", err)
	}
	var ife *once.InFlightError
	if _, err := once.Do(ctx(t), c, intent(1), mustNotRun(t), once.WaitFor(0)); !errors.As(err, &ife) || ife.Waited != 0 {
		t.Fatalf("WaitFor(0) = %v; want the *InFlightError at once", err)
	}
	if _, err := once.Do(ctx(t), c, intent(1), mustNotRun(t), nil); !errors.As(err, &ife) {
		t.Fatalf("a nil option = %v; want it skipped", err)
	}
	settle(t, s, held.Key, once.StatusReview)
	if _, err := once.Do(ctx(t), c, intent(1), mustNotRun(t), once.WaitFor(time.Hour)); !errors.Is(err, once.ErrReview) {
		t.Fatalf("an action in review = %v; want ErrReview at once", err)
	}
	select {
	case o := <-waits:
		t.Fatalf("waited for what is not a live claim: %+v", o)
	default:
	}
}

// plainStore hides the store's Waiter: the engine polls with Get.
type plainStore struct{ once.Store }

func testWaitPlainStore(t *testing.T, h Harness) {
	s, _ := newStore(t, h)
	cfg := once.Config{Store: plainStore{s}}
	waits := watchWaits(&cfg)
	c, err := once.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	first := startBlocked(t, c, intent(1))
	second := goDo(ctx(t), c, intent(1), mustNotRun(t), once.WaitFor(time.Hour))
	recv(t, waits, "the duplicate waiting")
	first.finish("polled", nil)
	if o := recv(t, second, "the waiting duplicate returning"); o.err != nil || !o.res.Replayed || o.res.Value != "polled" {
		t.Fatalf("waiting duplicate = %+v, %v", o.res, o.err)
	}
}

// A transaction not yet committed holds the key (a DoTx): there is no
// row to watch until it commits, and then the duplicate replays it.
func testWaitUncommitted(t *testing.T, h Harness) {
	cfg := once.Config{ClaimTimeout: 200 * time.Millisecond}
	waits := watchWaits(&cfg)
	_, c, th := txSetup(t, h, cfg)
	var effects atomic.Int64
	tx := begin(t, th)
	if _, err := tx.do(ctx(t), c, txIntent, writeOutbox(&effects)); err != nil {
		t.Fatal(err)
	}
	second := goDo(ctx(t), c, txIntent, mustNotRun(t), once.WaitFor(time.Hour))
	w := recv(t, waits, "the duplicate waiting for the transaction")
	if w.Key != keyOf(t, txIntent) || w.Kind != txIntent.Kind {
		t.Fatalf("waiting observation %+v", w)
	}
	commit(t, tx)
	o := recv(t, second, "the duplicate returning")
	if o.err != nil || !o.res.Replayed || o.res.Value != "written" || effects.Load() != 1 {
		t.Fatalf("duplicate = %+v, %v; want the committed result replayed", o.res, o.err)
	}
}

// A transaction that held the key rolls back: no row ever appears, and
// the key is free. The duplicate claims it and runs the effect itself,
// as a later delivery would, instead of waiting out its whole wait for a
// row that will never come.
func testWaitRolledBack(t *testing.T, h Harness) {
	cfg := once.Config{ClaimTimeout: 200 * time.Millisecond}
	waits := watchWaits(&cfg)
	s, c, th := txSetup(t, h, cfg)
	var effects atomic.Int64
	tx := begin(t, th)
	if _, err := tx.do(ctx(t), c, txIntent, writeOutbox(&effects)); err != nil {
		t.Fatal(err)
	}
	second := goDo(ctx(t), c, txIntent, func(context.Context, once.Attempt) (string, error) {
		return "run by the duplicate", nil
	}, once.WaitFor(time.Hour))
	recv(t, waits, "the duplicate waiting for the transaction")
	rollback(t, tx)
	o := recv(t, second, "the duplicate returning after the rollback")
	if o.err != nil || o.res.Replayed || o.res.Value != "run by the duplicate" || o.res.Attempt != 1 {
		t.Fatalf("duplicate = %+v, %v; want it to claim the key the rolled-back transaction left free and run the effect", o.res, o.err)
	}
	if a := mustGet(t, s, keyOf(t, txIntent)); a.Status != once.StatusSucceeded || a.Attempt != 1 {
		t.Fatalf("stored %+v", a)
	}
}

// A released action is claimed again by a DoTx whose transaction has
// not committed: the duplicate's claim waits on that transaction, and
// the row it reads back is the released one. The key is held by a
// transaction as surely as when no row is visible: the duplicate waits
// for it, and replays the DoTx's result once it commits.
//
// The short ClaimTimeout is the duplicate's, so that it gives up on the
// transaction's lock and waits soon. The first attempt, which only
// leaves the action released, claims through a client with the default:
// its claim waits on nobody, but under load (the race detector,
// parallel packages, SQLite preparing its statements) it can take longer
// than 200ms, and Do then rightly answers *InFlightError (the database
// is busy) instead of running the effect.
func testWaitReclaimingTx(t *testing.T, h Harness) {
	cfg := once.Config{ClaimTimeout: 200 * time.Millisecond}
	waits := watchWaits(&cfg)
	s, c, th := txSetup(t, h, cfg)
	first, err := once.New(once.Config{Store: s})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := once.Do(ctx(t), first, txIntent, func(context.Context, once.Attempt) (string, error) {
		return "", once.RetryLater(errors.New("429 too many requests"))
	}); !errors.Is(err, once.ErrRetryLater) {
		t.Fatalf("first Do = %v, want ErrRetryLater", err)
	}
	var effects atomic.Int64
	tx := begin(t, th)
	if res, err := tx.do(ctx(t), c, txIntent, writeOutbox(&effects)); err != nil || res.Attempt != 2 {
		t.Fatalf("DoTx = %+v, %v; want attempt 2", res, err)
	}
	second := goDo(ctx(t), c, txIntent, mustNotRun(t), once.WaitFor(time.Hour))
	select {
	case <-waits:
	case o := <-second:
		rollback(t, tx)
		t.Fatalf("duplicate = %+v, %v; want it to wait for the transaction that holds the key", o.res, o.err)
	case <-time.After(patience):
		t.Fatal("the duplicate did not wait within patience")
	}
	commit(t, tx)
	o := recv(t, second, "the duplicate returning")
	if o.err != nil || !o.res.Replayed || o.res.Value != "written" || o.res.Attempt != 2 || effects.Load() != 1 {
		t.Fatalf("duplicate = %+v, %v (effects %d); want the committed result replayed", o.res, o.err, effects.Load())
	}
}

// DoTx waits for a claim a Do holds where its transaction can see the
// outcome land (row locks: PostgreSQL); where its transaction holds the
// write lock the other attempt needs (SQLite), it answers at once and
// says why.
func testDoTxWait(t *testing.T, h Harness) {
	var cfg once.Config
	waits := watchWaits(&cfg)
	_, c, th := txSetup(t, h, cfg)
	first := startBlocked(t, c, txIntent)
	var effects atomic.Int64
	type out struct {
		res once.Result[any]
		err error
	}
	second := make(chan out, 1)
	go func() {
		tx, err := th.begin(ctx(t))
		if err != nil {
			second <- out{err: err}
			return
		}
		res, err := tx.do(ctx(t), c, txIntent, writeOutbox(&effects), once.WaitFor(time.Hour))
		if err == nil {
			err = tx.commit(ctx(t))
		} else {
			tx.rollback(ctx(t))
		}
		second <- out{res, err}
	}()
	if !h.Features.RowLocks {
		o := recv(t, second, "DoTx answering")
		var ife *once.InFlightError
		if !errors.As(o.err, &ife) || !strings.Contains(o.err.Error(), "cannot wait inside a transaction") {
			t.Fatalf("DoTx with WaitFor = %v; want the *InFlightError, saying it cannot wait here", o.err)
		}
		first.finish("sent", nil)
		return
	}
	recv(t, waits, "DoTx waiting")
	first.finish("sent", nil)
	o := recv(t, second, "DoTx returning")
	if o.err != nil || !o.res.Replayed || o.res.Value != "sent" || effects.Load() != 0 {
		t.Fatalf("DoTx = %+v, %v (effects %d); want the Do's result replayed", o.res, o.err, effects.Load())
	}
}

// The Waiter contract, for a store that implements it: Wait returns when
// the row has moved on (before the call or during it), when a row
// appears or goes, at Until, and with ctx's error when ctx ends.
func testStoreWait(t *testing.T, h Harness) {
	s, _ := newStore(t, h)
	w, ok := s.(once.Waiter)
	if !ok {
		t.Skip("the store does not implement once.Waiter; the engine polls Get instead")
	}
	far := time.Now().Add(2 * patience)
	wait := func(req once.WaitRequest) <-chan error {
		out := make(chan error, 1)
		go func() { out <- w.Wait(ctx(t), req) }()
		return out
	}
	mustReturn := func(ch <-chan error, what string) {
		t.Helper()
		if err := recv(t, ch, what); err != nil {
			t.Fatalf("%s: Wait = %v", what, err)
		}
	}
	req := claimReq(t, intent(1), time.Hour)
	req.Retention = time.Millisecond
	mustClaim(t, s, req)
	k := req.Key

	mustReturn(wait(once.WaitRequest{Key: k, Status: once.StatusInFlight, Attempt: 2, Until: far}), "Wait on an attempt the row is not at")
	mustReturn(wait(once.WaitRequest{Key: k, Status: once.StatusReleased, Attempt: 1, Until: far}), "Wait on a status the row is not in")
	mustReturn(wait(once.WaitRequest{Key: k, Status: once.StatusInFlight, Attempt: 1, Until: time.Now().Add(200 * time.Millisecond)}), "Wait running out")

	moved := wait(once.WaitRequest{Key: k, Status: once.StatusInFlight, Attempt: 1, Until: far})
	if _, _, err := s.Heartbeat(ctx(t), k, 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	settle(t, s, k, once.StatusSucceeded)
	mustReturn(moved, "Wait on a row that succeeded")

	// A row that appears (a claim commits) and one that goes (a purge).
	absent := claimReq(t, intent(2), time.Hour)
	appeared := wait(once.WaitRequest{Key: absent.Key, Until: far})
	mustClaim(t, s, absent)
	mustReturn(appeared, "Wait on a row that appeared")
	gone := wait(once.WaitRequest{Key: k, Status: once.StatusSucceeded, Attempt: 1, Until: far})
	deadline := time.Now().Add(patience)
	for {
		n, err := s.Purge(ctx(t), once.PurgeRequest{Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the succeeded row was not purged past its 1ms retention")
		}
		time.Sleep(5 * time.Millisecond)
	}
	mustReturn(gone, "Wait on a row that was purged")

	cctx, cancel := context.WithCancel(ctx(t))
	ended := make(chan error, 1)
	go func() {
		ended <- w.Wait(cctx, once.WaitRequest{Key: absent.Key, Status: once.StatusInFlight, Attempt: 1, Until: far})
	}()
	cancel()
	if err := recv(t, ended, "Wait returning when its context ended"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait after cancel = %v, want context.Canceled", err)
	}
}
