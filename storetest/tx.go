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

// TxFuncs are a store's transactions of type TX, as an application uses
// them around once.DoTx.
type TxFuncs[TX any] struct {
	// Begin begins a transaction on the store, as an application would
	// before DoTx.
	Begin    func(ctx context.Context) (TX, error)
	Commit   func(ctx context.Context, tx TX) error
	Rollback func(ctx context.Context, tx TX) error
	// Insert is the effect's own write: a row with id in an application
	// table, in tx. Count counts the committed rows of that table.
	Insert func(ctx context.Context, tx TX, id string) error
	Count  func(ctx context.Context) (int, error)
}

// TxHarness is a store's transactions with their type erased, so that
// one suite runs DoTx on every store. Make it with TxOf.
type TxHarness interface {
	begin(ctx context.Context) (openTx, error)
	count(ctx context.Context) (int, error)
}

// TxOf returns the harness for a store's transactions: b is the store
// (as once.DoTx takes it), f says how to begin, end and write in its
// transactions. Because b is a TxBinder[TX], a TxFuncs of the wrong
// transaction type does not compile, as with DoTx itself.
func TxOf[TX any](b once.TxBinder[TX], f TxFuncs[TX]) TxHarness {
	return txOf[TX]{b: b, f: f}
}

type txOf[TX any] struct {
	b once.TxBinder[TX]
	f TxFuncs[TX]
}

// openTx is one open transaction: do runs once.DoTx in it, with the
// store the harness was made with; write, handed to the effect, inserts
// into the application table in the same transaction.
type openTx struct {
	do       func(ctx context.Context, c *once.Client, in once.Intent, fn txEffect, opts ...once.DoOption) (once.Result[any], error)
	commit   func(ctx context.Context) error
	rollback func(ctx context.Context) error
}

type txEffect func(ctx context.Context, write func(id string) error, a once.Attempt) (any, error)

func (h txOf[TX]) begin(ctx context.Context) (openTx, error) {
	tx, err := h.f.Begin(ctx)
	if err != nil {
		return openTx{}, err
	}
	return openTx{
		do: func(ctx context.Context, c *once.Client, in once.Intent, fn txEffect, opts ...once.DoOption) (once.Result[any], error) {
			var effect func(context.Context, TX, once.Attempt) (any, error)
			if fn != nil { // a nil effect reaches DoTx as nil, to be refused
				effect = func(ctx context.Context, tx TX, a once.Attempt) (any, error) {
					return fn(ctx, func(id string) error { return h.f.Insert(ctx, tx, id) }, a)
				}
			}
			return once.DoTx(ctx, c, h.b, tx, in, effect, opts...)
		},
		commit:   func(ctx context.Context) error { return h.f.Commit(ctx, tx) },
		rollback: func(ctx context.Context) error { return h.f.Rollback(ctx, tx) },
	}, nil
}

func (h txOf[TX]) count(ctx context.Context) (int, error) { return h.f.Count(ctx) }

func txTests() []namedTest {
	return []namedTest{
		{name: "DoTx", fn: testDoTx, needs: needTx},
		{name: "DoTxRollback", fn: testDoTxRollback, needs: needTx},
		{name: "DoTxReplaysDo", fn: testDoTxReplaysDo, needs: needTx},
		{name: "DoTxClaimsReleased", fn: testDoTxClaimsReleased, needs: needTx},
		{name: "DoTxMeetsHeldClaim", fn: testDoTxMeetsHeldClaim, needs: needTx},
		{name: "DoTxOtherStore", fn: testDoTxOtherStore, needs: needTx},
		{name: "DoTxResultNotStored", fn: testDoTxResultNotStored, needs: needTx},
		{name: "DoTxBadInput", fn: testDoTxBadInput, needs: needTx},
		{name: "DoTxWaitsForConcurrentCommit", fn: testDoTxWaitsCommit, needs: needTx},
		{name: "DoTxWaitsForConcurrentRollback", fn: testDoTxWaitsRollback, needs: needTx},
		{name: "DoTxHoldsOnlyItsKey", fn: testDoTxHoldsOnlyItsKey, needs: needTx | needRowLocks},
		{name: "DoTxAwaitsApproval", fn: testDoTxAwaitsApproval, needs: needTx},
	}
}

var txIntent = once.Intent{Run: "r", Kind: "write_outbox", Target: "m-1", Payload: "hello"}

// txSetup returns a migrated store, a client over it, and its
// transactions.
func txSetup(t *testing.T, h Harness, cfg once.Config) (once.Store, *once.Client, TxHarness) {
	t.Helper()
	s, c, spec := setup(t, h, cfg)
	return s, c, h.Tx(t, s, spec)
}

func begin(t *testing.T, th TxHarness) openTx {
	t.Helper()
	tx, err := th.begin(ctx(t))
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	return tx
}

func commit(t *testing.T, tx openTx) {
	t.Helper()
	if err := tx.commit(ctx(t)); err != nil {
		t.Fatalf("commit: %v", err)
	}
}

func rollback(t *testing.T, tx openTx) {
	t.Helper()
	if err := tx.rollback(ctx(t)); err != nil {
		t.Fatalf("rollback: %v", err)
	}
}

func rows(t *testing.T, th TxHarness) int {
	t.Helper()
	n, err := th.count(ctx(t))
	if err != nil {
		t.Fatalf("count: %v", err)
	}
	return n
}

// writeOutbox is an effect that writes a row in the transaction.
func writeOutbox(effects *atomic.Int64) txEffect {
	return func(ctx context.Context, write func(string) error, a once.Attempt) (any, error) {
		effects.Add(1)
		return "written", write(string(a.Key))
	}
}

// The claim, the effect's write and the record commit together; a
// duplicate in its own transaction replays.
func testDoTx(t *testing.T, h Harness) {
	s, c, th := txSetup(t, h, once.Config{})
	var effects atomic.Int64
	for i := range 2 {
		tx := begin(t, th)
		res, err := tx.do(ctx(t), c, txIntent, writeOutbox(&effects))
		if err != nil || res.Value != "written" || res.Replayed != (i == 1) || res.Attempt != 1 {
			t.Fatalf("DoTx #%d = %+v, %v", i+1, res, err)
		}
		commit(t, tx)
	}
	if n := rows(t, th); n != 1 || effects.Load() != 1 {
		t.Fatalf("outbox has %d rows after %d effects, want 1 and 1", n, effects.Load())
	}
	k := keyOf(t, txIntent)
	if a := mustGet(t, s, k); a.Status != once.StatusSucceeded || string(a.Result) != `"written"` {
		t.Fatalf("stored %+v", a)
	}
	if got := trail(t, s, k); got != "claimed,succeeded" {
		t.Fatalf("trail %s", got)
	}
}

// An effect that fails inside the transaction records nothing: rolled
// back, the claim and the effect's write are gone, and the next delivery
// claims afresh.
func testDoTxRollback(t *testing.T, h Harness) {
	s, c, th := txSetup(t, h, once.Config{})
	cause := errors.New("validation failed after the write")
	tx := begin(t, th)
	_, err := tx.do(ctx(t), c, txIntent, func(ctx context.Context, write func(string) error, a once.Attempt) (any, error) {
		if err := write(string(a.Key)); err != nil {
			t.Error(err)
		}
		return nil, cause
	})
	if !errors.Is(err, cause) || !strings.Contains(err.Error(), "roll it back") {
		t.Fatalf("DoTx = %v, want the effect's error and advice to roll back", err)
	}
	rollback(t, tx)
	k := keyOf(t, txIntent)
	if _, err := s.Get(ctx(t), k); !isNotFound(err) {
		t.Fatalf("after rollback Get = %v, want not found: claim and effect roll back together", err)
	}
	if n := rows(t, th); n != 0 {
		t.Fatalf("outbox has %d rows after rollback", n)
	}
	if res, err := once.Do(ctx(t), c, txIntent, (&counter{}).fn("ok")); err != nil || res.Attempt != 1 || res.Replayed {
		t.Fatalf("the next delivery = %+v, %v; want a fresh first attempt", res, err)
	}
}

// Inside a transaction a duplicate is answered from the stored row as Do
// would answer it: a replay, a stored failure, a refused payload.
func testDoTxReplaysDo(t *testing.T, h Harness) {
	_, c, th := txSetup(t, h, once.Config{})
	if _, err := once.Do(ctx(t), c, txIntent, (&counter{}).fn("sent outside")); err != nil {
		t.Fatal(err)
	}
	failed := txIntent
	failed.Step = 1
	once.Do(ctx(t), c, failed, func(context.Context, once.Attempt) (string, error) {
		return "", once.Permanent(errors.New("550 no such mailbox"))
	})
	changed := txIntent
	changed.Payload = "rewritten"

	var effects atomic.Int64
	tx := begin(t, th)
	defer tx.rollback(context.Background())
	res, err := tx.do(ctx(t), c, txIntent, writeOutbox(&effects))
	if err != nil || !res.Replayed || res.Value != "sent outside" {
		t.Fatalf("DoTx of a succeeded action = %+v, %v; want the replay", res, err)
	}
	var fe *once.FailedError
	if _, err := tx.do(ctx(t), c, failed, writeOutbox(&effects)); !errors.As(err, &fe) || !fe.Replayed || fe.Message != "550 no such mailbox" {
		t.Fatalf("DoTx of a failed action = %v; want the stored failure", err)
	}
	if _, err := tx.do(ctx(t), c, changed, writeOutbox(&effects)); !errors.Is(err, once.ErrFingerprintMismatch) {
		t.Fatalf("DoTx with a changed payload = %v; want refused", err)
	}
	if effects.Load() != 0 {
		t.Fatalf("an effect ran %d times inside the transaction", effects.Load())
	}
}

// An action released by an earlier attempt is claimed inside the
// transaction as the next attempt, with the same provider key.
func testDoTxClaimsReleased(t *testing.T, h Harness) {
	s, c, th := txSetup(t, h, once.Config{})
	var first string
	once.Do(ctx(t), c, txIntent, func(ctx context.Context, a once.Attempt) (string, error) {
		first = a.ProviderKey
		return "", once.RetryLater(errors.New("429"))
	})
	tx := begin(t, th)
	res, err := tx.do(ctx(t), c, txIntent, func(ctx context.Context, write func(string) error, a once.Attempt) (any, error) {
		if a.Number != 2 || a.ProviderKey != first {
			t.Errorf("attempt %d with provider key %q; want 2 and %q", a.Number, a.ProviderKey, first)
		}
		return "written", write(string(a.Key))
	})
	if err != nil || res.Attempt != 2 || res.Replayed {
		t.Fatalf("DoTx of a released action = %+v, %v", res, err)
	}
	commit(t, tx)
	k := keyOf(t, txIntent)
	if a := mustGet(t, s, k); a.Status != once.StatusSucceeded || a.Attempt != 2 || a.Error != "" {
		t.Fatalf("stored %+v", a)
	}
	if got := trail(t, s, k); got != "claimed,released,claimed,succeeded" {
		t.Fatalf("trail %s", got)
	}
	if n := rows(t, th); n != 1 {
		t.Fatalf("outbox has %d rows", n)
	}
}

// A claim held outside the transaction is only answered inside it: no
// effect, and no recovery, even of a lapsed lease, which needs a
// transaction of its own.
func testDoTxMeetsHeldClaim(t *testing.T, h Harness) {
	s, c, th := txSetup(t, h, once.Config{Default: once.KindPolicy{Recovery: once.RetryWithProviderKey}})
	held := claimReq(t, txIntent, time.Hour)
	mustClaim(t, s, held)
	lapsedIntent := txIntent
	lapsedIntent.Step = 1
	lapsed := claimReq(t, lapsedIntent, time.Millisecond)
	mustClaim(t, s, lapsed)
	time.Sleep(30 * time.Millisecond)

	var effects atomic.Int64
	tx := begin(t, th)
	var ife *once.InFlightError
	if _, err := tx.do(ctx(t), c, txIntent, writeOutbox(&effects)); !errors.As(err, &ife) || ife.Expired || ife.Attempt != 1 {
		t.Fatalf("DoTx on a held claim = %v; want an unexpired *InFlightError", err)
	}
	if _, err := tx.do(ctx(t), c, lapsedIntent, writeOutbox(&effects)); !errors.As(err, &ife) || !ife.Expired {
		t.Fatalf("DoTx on a lapsed claim = %v; want an expired *InFlightError, left to recovery", err)
	}
	commit(t, tx)
	if effects.Load() != 0 {
		t.Fatal("an effect ran")
	}
	if a := mustGet(t, s, lapsed.Key); a.Status != once.StatusInFlight || a.Attempt != 1 {
		t.Fatalf("DoTx recovered a lapsed claim: %+v", a)
	}
	if got := trail(t, s, lapsed.Key); got != "claimed" {
		t.Fatalf("trail %s", got)
	}
}

// A transaction of the wrong type does not compile (TxBinder is typed);
// a transaction bound by a store other than the client's is refused
// before anything is claimed or run.
func testDoTxOtherStore(t *testing.T, h Harness) {
	s, c, _ := txSetup(t, h, once.Config{})
	other, _, otherTx := txSetup(t, h, once.Config{})
	var effects atomic.Int64
	tx := begin(t, otherTx)
	defer tx.rollback(context.Background())
	_, err := tx.do(ctx(t), c, txIntent, writeOutbox(&effects))
	if err == nil || !strings.Contains(err.Error(), "not the client's store") {
		t.Fatalf("DoTx with another store = %v, want an error saying so", err)
	}
	if effects.Load() != 0 {
		t.Fatal("effect ran")
	}
	k := keyOf(t, txIntent)
	for _, st := range []once.Store{s, other} {
		if _, err := st.Get(ctx(t), k); !isNotFound(err) {
			t.Fatalf("a refused DoTx left a row: %v", err)
		}
	}
}

// A value that cannot be stored is not recorded inside a transaction:
// the caller is told to roll back, and nothing stays.
func testDoTxResultNotStored(t *testing.T, h Harness) {
	s, c, th := txSetup(t, h, once.Config{MaxResultBytes: 64})
	for i, c2 := range []struct {
		value any
		want  error
	}{
		{strings.Repeat("x", 100), once.ErrResultTooLarge},
		{make(chan int), once.ErrResultNotJSON},
	} {
		in := txIntent
		in.Step = int64(i)
		tx := begin(t, th)
		_, err := tx.do(ctx(t), c, in, func(ctx context.Context, write func(string) error, a once.Attempt) (any, error) {
			return c2.value, write(string(a.Key))
		})
		if !errors.Is(err, c2.want) || !strings.Contains(err.Error(), "roll the transaction back") {
			t.Fatalf("DoTx returning %T = %v; want %v and advice to roll back", c2.value, err, c2.want)
		}
		rollback(t, tx)
		if _, err := s.Get(ctx(t), keyOf(t, in)); !isNotFound(err) {
			t.Fatalf("after rollback Get = %v", err)
		}
	}
	if n := rows(t, th); n != 0 {
		t.Fatalf("outbox has %d rows", n)
	}
}

// Bad input is refused before anything is claimed, in or out of the
// transaction.
func testDoTxBadInput(t *testing.T, h Harness) {
	s, c, th := txSetup(t, h, once.Config{})
	var effects atomic.Int64
	tx := begin(t, th)
	var ie *once.IntentError
	if _, err := tx.do(ctx(t), c, once.Intent{Run: "r", Kind: ""}, writeOutbox(&effects)); !errors.As(err, &ie) || ie.Field != "Kind" {
		t.Fatalf("DoTx with no kind = %v; want *IntentError on Kind", err)
	}
	if _, err := tx.do(ctx(t), nil, txIntent, writeOutbox(&effects)); err == nil || !strings.Contains(err.Error(), "nil *Client") {
		t.Fatalf("DoTx with a nil client = %v", err)
	}
	if _, err := tx.do(ctx(t), c, txIntent, nil); err == nil || !strings.Contains(err.Error(), "nil effect") {
		t.Fatalf("DoTx with a nil effect = %v", err)
	}
	commit(t, tx)
	if rows, err := s.List(ctx(t), once.Filter{}); err != nil || len(rows) != 0 || effects.Load() != 0 {
		t.Fatalf("bad input wrote %d rows (%v), ran %d effects", len(rows), err, effects.Load())
	}
}

// A second DoTx on the same key waits for the first transaction to end:
// committed, it replays what the first wrote.
func testDoTxWaitsCommit(t *testing.T, h Harness) {
	testDoTxWaits(t, h, true)
}

// Rolled back, the second claims and runs it.
func testDoTxWaitsRollback(t *testing.T, h Harness) {
	testDoTxWaits(t, h, false)
}

func testDoTxWaits(t *testing.T, h Harness, commitFirst bool) {
	_, c, th := txSetup(t, h, once.Config{})
	var effects atomic.Int64
	first := begin(t, th)
	if _, err := first.do(ctx(t), c, txIntent, writeOutbox(&effects)); err != nil {
		t.Fatal(err)
	}
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
		res, err := tx.do(ctx(t), c, txIntent, writeOutbox(&effects))
		if err == nil {
			err = tx.commit(ctx(t))
		} else {
			tx.rollback(ctx(t))
		}
		second <- out{res, err}
	}()
	// Give the second transaction time to reach the claim: were it not
	// to wait, it would claim and run the effect beside the first.
	time.Sleep(100 * time.Millisecond)
	if commitFirst {
		commit(t, first)
	} else {
		rollback(t, first)
	}
	o := <-second
	switch {
	case o.err != nil:
		t.Fatalf("second DoTx: %v", o.err)
	case commitFirst && (!o.res.Replayed || o.res.Value != "written" || effects.Load() != 1):
		t.Fatalf("after the first committed, the second = %+v (effects %d); want a replay", o.res, effects.Load())
	case !commitFirst && (o.res.Replayed || o.res.Attempt != 1 || effects.Load() != 2):
		t.Fatalf("after the first rolled back, the second = %+v (effects %d); want it claimed and run", o.res, effects.Load())
	}
	if n := rows(t, th); n != 1 {
		t.Fatalf("outbox has %d rows, want 1", n)
	}
}

// Where a transaction locks rows, a DoTx left open holds up its own key
// only: Do of another key goes through meanwhile.
func testDoTxHoldsOnlyItsKey(t *testing.T, h Harness) {
	_, c, th := txSetup(t, h, once.Config{})
	var effects atomic.Int64
	tx := begin(t, th)
	defer tx.rollback(context.Background())
	if _, err := tx.do(ctx(t), c, txIntent, writeOutbox(&effects)); err != nil {
		t.Fatal(err)
	}
	other := txIntent
	other.Step = 1
	res, err := once.Do(ctx(t), c, other, (&counter{}).fn("ok"))
	if err != nil || res.Replayed {
		t.Fatalf("Do of another key while a DoTx is open = %+v, %v", res, err)
	}
	commit(t, tx)
}

// DoTx of a kind that asks for approval writes the wait in the caller's
// transaction and runs nothing: committed, the action waits, and once
// approved the next DoTx runs it inside its transaction; rolled back,
// nothing was asked. Nobody is told before the commit.
func testDoTxAwaitsApproval(t *testing.T, h Harness) {
	var announced atomic.Int64
	cfg := once.Config{Kinds: map[string]once.KindPolicy{txIntent.Kind: {Approval: once.ApprovalPolicy{Always: true}}},
		Hooks: once.Hooks{OnAwaitingApproval: func(context.Context, once.Action) { announced.Add(1) }}}
	s, c, th := txSetup(t, h, cfg)
	var effects atomic.Int64
	k := keyOf(t, txIntent)
	tx := begin(t, th)
	if _, err := tx.do(ctx(t), c, txIntent, writeOutbox(&effects)); !errors.Is(err, once.ErrAwaitingApproval) {
		t.Fatalf("DoTx of a gated kind = %v; want ErrAwaitingApproval", err)
	}
	rollback(t, tx)
	if _, err := s.Get(ctx(t), k); !isNotFound(err) {
		t.Fatalf("after the rollback Get = %v; want no row", err)
	}
	tx = begin(t, th)
	if _, err := tx.do(ctx(t), c, txIntent, writeOutbox(&effects)); !errors.Is(err, once.ErrAwaitingApproval) {
		t.Fatalf("DoTx = %v", err)
	}
	commit(t, tx)
	if a := mustGet(t, s, k); a.Status != once.StatusAwaitingApproval || announced.Load() != 0 || effects.Load() != 0 {
		t.Fatalf("row %s, announced %d, effects %d; want awaiting approval, nobody told by DoTx, nothing run", a.Status, announced.Load(), effects.Load())
	}
	if _, err := c.Approve(ctx(t), k, once.Approval{By: "ada"}); err != nil {
		t.Fatal(err)
	}
	tx = begin(t, th)
	res, err := tx.do(ctx(t), c, txIntent, writeOutbox(&effects))
	if err != nil || res.Value != "written" || res.Attempt != 2 {
		t.Fatalf("DoTx after approval = %+v, %v", res, err)
	}
	commit(t, tx)
	if n := rows(t, th); n != 1 || effects.Load() != 1 {
		t.Fatalf("outbox has %d rows after %d effects; want 1 and 1", n, effects.Load())
	}
}
