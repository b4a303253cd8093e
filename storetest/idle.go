package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncehq/once"
)

// Connections the database ends while the faulted store's pool holds
// them (Faults.End): a DBA's pg_terminate_backend, an idle-session
// timeout, a pooler's restart. A pool may hand such a connection out
// before it learns it is dead; the claim and the outcome must survive
// that, sent again on a fresh connection.

func idleTests() []namedTest {
	return []namedTest{
		{name: "IdleConnectionTerminatedDoClaimsAgain", fn: testIdleConnectionTerminatedDoClaimsAgain, needs: needFaults | needRefusal},
		{name: "IdleTerminatedMidEffectRecords", fn: testIdleTerminatedMidEffectRecords, needs: needFaults | needRefusal},
		{name: "ResendOnDeadConnectionStillWaitsForTheTransaction", fn: testResendOnDeadConnectionStillWaitsForTheTransaction,
			needs: needFaults | needRefusal | needTx | needRowLocks},
		{name: "ClaimAnswersFromTheRowATransactionCommitted", fn: testClaimAnswersFromTheRowATransactionCommitted, needs: needTx | needRowLocks},
	}
}

var idleSeq atomic.Int64

func idleIntent(tag string) once.Intent {
	return once.Intent{Run: fmt.Sprintf("idle-%s-%d", tag, idleSeq.Add(1)), Step: 1, Kind: "send_email", Target: "x@example.com"}
}

func sent(context.Context, once.Attempt) (string, error) { return "sent", nil }

// replay runs Do for in, whose action is finished: the effect must not
// run, and a result that is not a replay is an error.
func replay(t *testing.T, cl *once.Client, in once.Intent) (once.Result[string], error) {
	t.Helper()
	res, err := once.Do(context.Background(), cl, in, func(context.Context, once.Attempt) (string, error) {
		t.Error("the effect of a finished key ran again")
		return "", nil
	})
	if err == nil && !res.Replayed {
		err = errors.New("not a replay")
	}
	return res, err
}

// IdleConnectionTerminatedDoClaimsAgain: the database ends the
// connections the pool holds idle, and the next Do, a new key or a
// duplicate of a finished one, goes through: its claim, sent on a dead
// connection, fails, the read-back on a fresh one finds the claim not
// written, and the claim is sent again. pgxpool, for one, pings a
// connection before handing it out only when it has been idle for more
// than a second, so one used within the last second is handed out dead.
// Before the claim was sent again, every such Do failed with the
// connection's error, the database up the whole time. The outcome's
// Transition survives the same thing (IdleTerminatedMidEffectRecords).
func testIdleConnectionTerminatedDoClaimsAgain(t *testing.T, h Harness) {
	cl, _, _, f := faultClients(t, h, once.Config{Logger: quiet})
	ctx := context.Background()
	const n = 10
	var newFails, dupFails int
	for range n {
		done := idleIntent("done")
		if _, err := once.Do(ctx, cl, done, sent); err != nil {
			t.Fatal(err)
		}
		f.End()
		if _, err := once.Do(ctx, cl, idleIntent("new"), sent); err != nil {
			newFails++
			if newFails == 1 {
				t.Logf("a new key: %v", err)
			}
		}
		f.End()
		if _, err := replay(t, cl, done); err != nil {
			dupFails++
			if dupFails == 1 {
				t.Logf("a duplicate of a finished key: %v", err)
			}
		}
	}
	if newFails+dupFails > 0 {
		t.Errorf("with the idle connections ended and the database up, %d of %d Do of new keys and %d of %d of finished keys failed; want none",
			newFails, n, dupFails, n)
	}
}

// IdleTerminatedMidEffectRecords: the store's connections are ended
// while the effect runs (the claim's connection, idle in the pool
// meanwhile, among them). The outcome's first try meets the closed
// connection and is tried again on a fresh one: Do reports success, the
// row is succeeded, and the effect ran once.
func testIdleTerminatedMidEffectRecords(t *testing.T, h Harness) {
	cl, _, s, f := faultClients(t, h, once.Config{Logger: quiet})
	ctx := context.Background()
	for range 5 {
		in := idleIntent("mid")
		ran := 0
		res, err := once.Do(ctx, cl, in, func(context.Context, once.Attempt) (string, error) {
			ran++
			f.End()
			return "sent", nil
		})
		if err != nil || res.Value != "sent" || ran != 1 {
			t.Fatalf("Do = %+v, %v, effect ran %d times; want sent, once", res, err, ran)
		}
		if a := mustGet(t, s, keyOf(t, in)); a.Status != once.StatusSucceeded {
			t.Fatalf("row %q; want succeeded", a.Status)
		}
		if again, err := replay(t, cl, in); err != nil {
			t.Fatalf("duplicate = %+v, %v; want a replay", again, err)
		}
	}
}

// deadSecondClaim is the faulted store with one fault more: before its
// second Claim, the database ends every connection the store holds, so
// that the claim is sent on one of them, dead: the failure the resend
// of a claim was made for. The claims themselves are the real ones.
type deadSecondClaim struct {
	once.Store
	f      Faults
	claims atomic.Int32
}

func (s *deadSecondClaim) Claim(ctx context.Context, req once.ClaimRequest) (once.ClaimResult, error) {
	if s.claims.Add(1) == 2 {
		s.f.End()
	}
	return s.Store.Claim(ctx, req)
}

// ResendOnDeadConnectionStillWaitsForTheTransaction: a Do that waits
// (WaitFor) meets a key an open DoTx holds: its first claim waits out
// ClaimTimeout on the transaction's lock, the read-back sees no row, and
// the claim, sent again, lands on a dead connection. Do still answers
// that a transaction holds the key, waits for it, and replays its
// result. Before, the resend's connection error was returned: the
// caller was told the claim failed, and the wait it asked for was
// skipped.
func testResendOnDeadConnectionStillWaitsForTheTransaction(t *testing.T, h Harness) {
	in := once.Intent{Run: "resend-intx", Kind: "send_email", Target: "ada@example.com"}
	s, spec := newStore(t, h)
	holder, err := once.New(once.Config{Store: s})
	if err != nil {
		t.Fatal(err)
	}
	th := h.Tx(t, s, spec)
	fs, f := h.Faults(t, spec)
	ws := &deadSecondClaim{Store: fs, f: f}
	c, err := once.New(once.Config{Store: ws, ClaimTimeout: 500 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	tx := begin(t, th)
	if _, err := tx.do(ctx(t), holder, in, func(context.Context, func(string) error, once.Attempt) (any, error) {
		return "from the transaction", nil
	}); err != nil {
		tx.rollback(context.Background())
		t.Fatal(err)
	}
	committed := make(chan struct{})
	time.AfterFunc(2*time.Second, func() {
		defer close(committed)
		tx.commit(context.Background())
	})
	defer func() { <-committed }()
	res, err := once.Do(ctx(t), c, in, func(context.Context, once.Attempt) (string, error) {
		t.Error("ran the effect of an action a transaction claimed and committed")
		return "", nil
	}, once.WaitFor(15*time.Second))
	if err != nil || !res.Replayed || res.Value != "from the transaction" {
		t.Fatalf("Do waiting on a key an open DoTx holds (its resend on a dead connection, claims sent %d) = %+v, %v;\n"+
			"want the transaction's result replayed once it commits", ws.claims.Load(), res, err)
	}
}

// commitAfterSecondFailure commits a transaction once the second claim
// through the store has failed: between that claim's failure and the
// read that follows it, as a DoTx may commit at any moment.
type commitAfterSecondFailure struct {
	once.Store
	commit func()
	failed atomic.Int32
}

func (s *commitAfterSecondFailure) Claim(ctx context.Context, req once.ClaimRequest) (once.ClaimResult, error) {
	cr, err := s.Store.Claim(ctx, req)
	if err != nil && s.failed.Add(1) == 2 {
		s.commit()
	}
	return cr, err
}

// ClaimAnswersFromTheRowATransactionCommitted: a Do meets a key an open
// DoTx holds; its claim and the resend both wait out ClaimTimeout, and
// the transaction commits just then. The read after the resend finds
// the row succeeded: Do answers from it, replaying the transaction's
// result. Before, it returned the resend's timeout, as if the claim had
// failed for want of the database (seen behind PgBouncer, in
// ResendOnDeadConnectionStillWaitsForTheTransaction).
func testClaimAnswersFromTheRowATransactionCommitted(t *testing.T, h Harness) {
	in := once.Intent{Run: "commit-between", Kind: "send_email", Target: "ada@example.com"}
	s, spec := newStore(t, h)
	holder, err := once.New(once.Config{Store: s})
	if err != nil {
		t.Fatal(err)
	}
	th := h.Tx(t, s, spec)
	tx := begin(t, th)
	if _, err := tx.do(ctx(t), holder, in, func(context.Context, func(string) error, once.Attempt) (any, error) {
		return "from the transaction", nil
	}); err != nil {
		tx.rollback(context.Background())
		t.Fatal(err)
	}
	var committed sync.Once
	commitTx := func() { committed.Do(func() { commit(t, tx) }) }
	defer commitTx()
	ws := &commitAfterSecondFailure{Store: s, commit: commitTx}
	c, err := once.New(once.Config{Store: ws, ClaimTimeout: 500 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	res, err := once.Do(ctx(t), c, in, func(context.Context, once.Attempt) (string, error) {
		t.Error("ran the effect of an action a transaction claimed and committed")
		return "", nil
	})
	if err != nil || !res.Replayed || res.Value != "from the transaction" {
		t.Fatalf("Do on a key whose transaction committed between a failed claim and its read (%d claims failed) = %+v, %v;\n"+
			"want the transaction's result replayed", ws.failed.Load(), res, err)
	}
}
