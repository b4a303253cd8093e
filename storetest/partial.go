package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/idemhttp"
)

// More partial failures, each between the faulted store and its
// database: a note's, a re-drive mark's, a panic's record and a
// reaper's batch whose replies are lost or hang, and reapers paused
// past what they hold.

func partialTests() []namedTest {
	return []namedTest{
		{name: "NoteReplyLost", fn: testNoteReplyLost, needs: needFaults | needLostReplies},
		{name: "NoteHangs", fn: testNoteHangs, needs: needFaults | needLostReplies},
		{name: "RedriveMarkReplyLost", fn: testRedriveMarkReplyLost, needs: needFaults | needLostReplies},
		{name: "RedriveMarkHangs", fn: testRedriveMarkHangs, needs: needFaults | needLostReplies},
		{name: "RedriveMarkReplyLostUnread", fn: testRedriveMarkReplyLostUnread, needs: needFaults | needLostReplies | needRefusal},
		{name: "RedriveReaperPausedBetweenMarkAndHook", fn: testRedriveReaperPausedBetweenMarkAndHook, needs: needFaults, serial: true},
		{name: "PanicRecordReplyLost", fn: testPanicRecordReplyLost, needs: needFaults | needLostReplies},
		{name: "PanicCountHangs", fn: testPanicCountHangs, needs: needFaults | needLostReplies},
		{name: "KindHoldAfterLostRecoverable", fn: testKindHoldAfterLostRecoverable, needs: needFaults | needLostReplies, serial: true},
		{name: "AbandonRepeatedWithLostReplies", fn: testAbandonRepeatedWithLostReplies, needs: needFaults | needLostReplies},
		{name: "ReaperPausedPastKindHold", fn: testReaperPausedPastKindHold, needs: needFaults, serial: true},
		{name: "BlackholedClaimSaysTheStoreIsUnreachable", fn: testBlackholedClaimSaysTheStoreIsUnreachable, needs: needFaults | needPartition},
		{name: "HungLoneOutcomeHoldsNoClaim", fn: testHungLoneOutcomeHoldsNoClaim, needs: needFaults | needLostReplies},
		{name: "DatabaseGoesAway", fn: testDatabaseGoesAway, needs: needFaults | needRefusal},
		{name: "AdversaryFencedReleaseIsAcked", fn: testAdversaryFencedReleaseIsAcked, needs: needFaults | needPartition},
		{name: "AdversaryHungReaperCall", fn: testAdversaryHungReaperCall, needs: needFaults | needLostReplies},
		{name: "AdversaryLateSuccessAfterPurgeRunsAgain", fn: testAdversaryLateSuccessAfterPurgeRunsAgain, needs: needFaults | needPartition},
		{name: "AdversaryRecordReadBackAfterRecoveryOverwrote", fn: testAdversaryRecordReadBackAfterRecoveryOverwrote, needs: needFaults | needLostReplies | needPartition},
	}
}

// NoteReplyLost: the database commits an attempt's note and its
// reply is lost (the connection is cut after ReadyForQuery). Note
// returns an error, the effect notes again and runs, once, and the
// outcome is recorded on another connection.
func testNoteReplyLost(t *testing.T, h Harness) { testNoteLost(t, h, false) }

// NoteHangs: the connection that carries an attempt's note hangs
// after the database committed it. Note returns within ClaimTimeout
// instead of waiting for ever, and the effect runs once and its outcome
// is recorded.
func testNoteHangs(t *testing.T, h Harness) { testNoteLost(t, h, true) }

func testNoteLost(t *testing.T, h Harness, hang bool) {
	c, _, s, f := faultClients(t, h, once.Config{ClaimTimeout: time.Second, Logger: quiet})
	in := once.Intent{Run: "note-lost", Kind: "send_email", Target: "ada@example.com"}
	k, _, err := once.KeyOf(in)
	if err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int32
	var first error
	res, err := once.Do(context.Background(), c, in, func(ctx context.Context, a once.Attempt) (string, error) {
		lost := f.LoseReply(h.Markers.Transition, hang)
		first = a.Note(ctx, "sending Message-ID <x@once>")
		if !happened(lost) {
			t.Error("the note's reply was not lost")
		}
		if err := a.Note(ctx, "sending Message-ID <x@once>, again"); err != nil {
			t.Errorf("the note sent again: %v", err)
		}
		ran.Add(1)
		return "sent", nil
	})
	if first == nil {
		t.Error("Note returned nil although its reply was lost")
	}
	if err != nil || res.Value != "sent" || ran.Load() != 1 {
		t.Fatalf("Do = %+v, %v, the effect run %d times; want sent, once", res, err, ran.Load())
	}
	a, err := s.Get(context.Background(), k)
	if err != nil {
		t.Fatal(err)
	}
	if a.Status != once.StatusSucceeded || a.Attempt != 1 || a.Error != "" {
		t.Fatalf("the row is %s at attempt %d with %q, want succeeded at attempt 1, the note replaced", a.Status, a.Attempt, a.Error)
	}
}

// released puts in up for review through c and resolves it "retry", so
// that it waits, released, for a delivery.
func released(t *testing.T, c *once.Client, in once.Intent) once.Key {
	t.Helper()
	ctx := context.Background()
	if _, err := once.Do(ctx, c, in, func(context.Context, once.Attempt) (string, error) { return "", errors.New("timeout after DATA") }); !errors.Is(err, once.ErrReview) {
		t.Fatalf("Do = %v, want review", err)
	}
	k, _, err := once.KeyOf(in)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Resolve(ctx, k, once.Resolution{Decision: once.DecisionRetry, By: "ada", Note: "bounced; send again"}); err != nil {
		t.Fatal(err)
	}
	return k
}

// redriven counts the redriven events in key's trail.
func redriven(t *testing.T, s once.Store, key once.Key) int {
	t.Helper()
	evs, err := s.Events(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs {
		if e.Type == once.EventRedriven {
			n++
		}
	}
	return n
}

// refuseAfterLostMark is the faulted store with one fault added: when a
// re-drive mark's reply is lost, its connections are refused from then
// on, so that the reaper cannot read the row back to learn whether its
// mark applied. The statements are the real ones.
type refuseAfterLostMark struct {
	once.Store
	f Faults
}

func (s refuseAfterLostMark) Transition(ctx context.Context, t once.Transition) (bool, error) {
	ok, err := s.Store.Transition(ctx, t)
	if t.Waiting && err != nil {
		s.f.Refuse(true)
	}
	return ok, err
}

// RedriveMarkReplyLost: the reaper's re-drive mark commits and its
// reply is lost. The reaper reads the row back, finds its own mark, and
// calls the Redrive hook in the same pass: once, with one redriven
// event in the trail. The delivery runs the effect once, as attempt 2.
func testRedriveMarkReplyLost(t *testing.T, h Harness) { testRedriveMarkLost(t, h, false) }

// RedriveMarkHangs: the reaper's re-drive mark commits and its
// connection hangs. The call gives up after ClaimTimeout, the row is
// read back on another connection, and the hook is called once in the
// same pass.
func testRedriveMarkHangs(t *testing.T, h Harness) { testRedriveMarkLost(t, h, true) }

func testRedriveMarkLost(t *testing.T, h Harness, hang bool) {
	const after = 500 * time.Millisecond
	var hooked atomic.Int32
	pol := once.KindPolicy{RedriveAfter: after, Redrive: func(context.Context, once.Action) error {
		hooked.Add(1)
		return nil
	}}
	cut, direct, s, f := faultClients(t, h, once.Config{Kinds: map[string]once.KindPolicy{"send_email": pol}, ClaimTimeout: time.Second, Logger: quiet})
	in := once.Intent{Run: "mark-lost", Kind: "send_email", Target: "ada@example.com"}
	k := released(t, direct, in)
	r, err := once.NewReaper(cut, once.ReaperConfig{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(after + 100*time.Millisecond)
	lost := f.LoseReply(h.Markers.Transition, hang)
	rep, err := r.RunOnce(context.Background())
	if !happened(lost) {
		t.Fatal("the mark's reply was not lost")
	}
	if err != nil || rep.Redriven != 1 || hooked.Load() != 1 || redriven(t, s, k) != 1 {
		t.Fatalf("the pass whose mark's reply was lost = %+v, %v; hook called %d times, %d redriven events; want it handed on once, one event",
			rep, err, hooked.Load(), redriven(t, s, k))
	}
	deliverOnce(t, direct, in)
}

// RedriveMarkReplyLostUnread: the reaper's re-drive mark commits,
// its reply is lost, and the database cannot be reached to read the row
// back within RecordTimeout. The reaper does not call the hook (it
// cannot tell its mark applied) and says the pass failed. The re-drive
// is not lost for good: once the database answers, a pass at least
// RedriveAfter after the mark marks the action again and hands it on,
// and the delivery runs the effect once.
func testRedriveMarkReplyLostUnread(t *testing.T, h Harness) {
	const after = 500 * time.Millisecond
	var hooked atomic.Int32
	pol := once.KindPolicy{RedriveAfter: after, Redrive: func(context.Context, once.Action) error {
		hooked.Add(1)
		return nil
	}}
	d, spec := newStore(t, h)
	ps, f := h.Faults(t, spec)
	kinds := map[string]once.KindPolicy{"send_email": pol}
	cut, err := once.New(once.Config{Store: refuseAfterLostMark{ps, f}, Kinds: kinds, ClaimTimeout: time.Second, RecordTimeout: time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	direct, err := once.New(once.Config{Store: d, Kinds: kinds, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	in := once.Intent{Run: "mark-lost-unread", Kind: "send_email", Target: "ada@example.com"}
	k := released(t, direct, in)
	r, err := once.NewReaper(cut, once.ReaperConfig{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(after + 100*time.Millisecond)
	lost := f.LoseReply(h.Markers.Transition, false)
	rep, err := r.RunOnce(context.Background())
	if !happened(lost) {
		t.Fatal("the mark's reply was not lost")
	}
	if err == nil || hooked.Load() != 0 || redriven(t, d, k) != 1 {
		t.Fatalf("the pass whose mark's reply was lost and unread = %+v, %v; hook called %d times, %d redriven events; want an error, no hook, the mark applied",
			rep, err, hooked.Load(), redriven(t, d, k))
	}
	f.Refuse(false)
	time.Sleep(after + 100*time.Millisecond)
	rep, err = r.RunOnce(context.Background())
	if err != nil || rep.Redriven != 1 || hooked.Load() != 1 || redriven(t, d, k) != 2 {
		t.Fatalf("the pass after another RedriveAfter = %+v, %v; hook called %d times, %d redriven events; want it handed on once",
			rep, err, hooked.Load(), redriven(t, d, k))
	}
	deliverOnce(t, direct, in)
}

// deliverOnce delivers the re-driven job in: the effect runs once, as
// attempt 2, and a second delivery is absorbed.
func deliverOnce(t *testing.T, c *once.Client, in once.Intent) {
	t.Helper()
	var ran atomic.Int32
	effect := func(context.Context, once.Attempt) (string, error) {
		ran.Add(1)
		return "sent", nil
	}
	res, err := once.Do(context.Background(), c, in, effect)
	if err != nil || res.Attempt != 2 || res.Replayed {
		t.Fatalf("the re-driven delivery = %+v, %v; want attempt 2 run", res, err)
	}
	res, err = once.Do(context.Background(), c, in, effect)
	if err != nil || !res.Replayed || ran.Load() != 1 {
		t.Fatalf("a second delivery = %+v, %v, the effect run %d times; want it replayed, one run", res, err, ran.Load())
	}
}

// RedriveReaperPausedBetweenMarkAndHook: a reaper marks a waiting
// action re-driven and pauses before its hook for longer than
// RedriveAfter and the kind's lease. Another reaper marks it again and
// its hook delivers the job: the effect runs. Then the first carries on
// and its hook delivers the job again: the claim absorbs it (the stored
// result is replayed) and the effect has run once.
func testRedriveReaperPausedBetweenMarkAndHook(t *testing.T, h Harness) {
	const after = 300 * time.Millisecond
	const lease = 500 * time.Millisecond
	in := once.Intent{Run: "mark-paused", Kind: "send_email", Target: "ada@example.com"}
	var ran atomic.Int32
	effect := func(context.Context, once.Attempt) (string, error) {
		ran.Add(1)
		return "sent", nil
	}
	var (
		entered  = make(chan struct{})
		resume   = make(chan struct{})
		firstC   *once.Client
		firstRes once.Result[string]
		firstErr error
	)
	first := once.KindPolicy{RedriveAfter: after, Lease: lease, Redrive: func(ctx context.Context, _ once.Action) error {
		close(entered)
		<-resume
		firstRes, firstErr = once.Do(context.Background(), firstC, in, effect)
		return firstErr
	}}
	var secondRes once.Result[string]
	var secondErr error
	var secondC *once.Client
	second := once.KindPolicy{RedriveAfter: after, Lease: lease, Redrive: func(ctx context.Context, _ once.Action) error {
		secondRes, secondErr = once.Do(context.Background(), secondC, in, effect)
		return secondErr
	}}
	var s once.Store
	firstC, _, s, _ = faultClients(t, h, once.Config{Kinds: map[string]once.KindPolicy{"send_email": first}, Logger: quiet})
	// The second reaper's client has its own hook, over the same store.
	secondC, err := once.New(once.Config{Store: s, Kinds: map[string]once.KindPolicy{"send_email": second}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	released(t, secondC, in)
	time.Sleep(after + 100*time.Millisecond)
	r1, err := once.NewReaper(firstC, once.ReaperConfig{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := once.NewReaper(secondC, once.ReaperConfig{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := r1.RunOnce(context.Background())
		done <- err
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the first reaper never called its hook")
	}
	// Paused, between its mark and its hook, past RedriveAfter and the
	// lease.
	time.Sleep(lease + after)
	rep, err := r2.RunOnce(context.Background())
	if err != nil || rep.Redriven != 1 {
		t.Fatalf("the second reaper's pass = %+v, %v; want it to re-drive the action the first marked and never handed on", rep, err)
	}
	close(resume)
	if err := <-done; err != nil {
		t.Fatalf("the first reaper's pass: %v", err)
	}
	if secondErr != nil || secondRes.Value != "sent" || firstErr != nil || firstRes.Value != "sent" || !firstRes.Replayed || ran.Load() != 1 {
		t.Fatalf("second delivery %+v, %v; first delivery %+v, %v; effect run %d times; want the second run, the first replayed, one run",
			secondRes, secondErr, firstRes, firstErr, ran.Load())
	}
}

// panicking runs Do of in over c with an effect that panics, and
// returns Do's error; before gives the fault to arm just before the
// panic.
func panicking(t *testing.T, c *once.Client, in once.Intent, ran *atomic.Int32, before func()) (err error) {
	t.Helper()
	defer func() {
		if p := recover(); p != nil && p != "nil map" {
			panic(p)
		}
	}()
	_, err = once.Do(context.Background(), c, in, func(context.Context, once.Attempt) (int, error) {
		ran.Add(1)
		if before != nil {
			before()
		}
		panic("nil map")
	})
	return err
}

// PanicRecordReplyLost: the records of two panicking attempts
// commit and their replies are lost. Each is read back, so the trail
// holds both panics, and the third panicking attempt is still put up
// for review: the effect ran three times.
func testPanicRecordReplyLost(t *testing.T, h Harness) {
	kinds := map[string]once.KindPolicy{"charge_card": {Recovery: once.RetryWithProviderKey}}
	c, _, s, f := faultClients(t, h, once.Config{Kinds: kinds, ClaimTimeout: time.Second, Logger: quiet})
	in := once.Intent{Run: "panic-lost", Kind: "charge_card", Target: "cus_1"}
	k, _, err := once.KeyOf(in)
	if err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int32
	for i := range 6 {
		var lost <-chan struct{}
		err = panicking(t, c, in, &ran, func() {
			if i < 2 {
				lost = f.LoseReply(h.Markers.Transition, false)
			}
		})
		if lost != nil && !happened(lost) {
			t.Fatalf("the record of panicking attempt %d did not lose its reply", i+1)
		}
	}
	a, gerr := s.Get(context.Background(), k)
	if gerr != nil {
		t.Fatal(gerr)
	}
	if ran.Load() != 3 || a.Status != once.StatusReview || a.Attempt != 3 || !errors.Is(err, once.ErrReview) {
		t.Fatalf("the effect ran %d times; the action is %s at attempt %d (%q); the last Do said %v; want 3 runs, then review", ran.Load(), a.Status, a.Attempt, a.Error, err)
	}
}

// PanicCountHangs: at the third panicking attempt the read of the
// trail that counts the panics hangs. The count is taken as 0 after
// RecordTimeout, as it was before panics were counted: that attempt is
// released, not put up for review, and the fourth is. The bound is
// loose by one attempt per unreadable trail, not lost.
func testPanicCountHangs(t *testing.T, h Harness) {
	kinds := map[string]once.KindPolicy{"charge_card": {Recovery: once.RetryWithProviderKey}}
	c, _, s, f := faultClients(t, h, once.Config{Kinds: kinds, ClaimTimeout: time.Second, RecordTimeout: 2 * time.Second, Logger: quiet})
	in := once.Intent{Run: "panic-hang", Kind: "charge_card", Target: "cus_1"}
	k, _, err := once.KeyOf(in)
	if err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int32
	var hung <-chan struct{}
	for i := range 6 {
		err = panicking(t, c, in, &ran, func() {
			if i == 2 {
				hung = f.LoseReply(h.Markers.Events, true)
			}
		})
	}
	if !happened(hung) {
		t.Fatal("the count's read never hung")
	}
	a, gerr := s.Get(context.Background(), k)
	if gerr != nil {
		t.Fatal(gerr)
	}
	if ran.Load() != 4 || a.Status != once.StatusReview || a.Attempt != 4 || !errors.Is(err, once.ErrReview) {
		t.Fatalf("the effect ran %d times; the action is %s at attempt %d (%q); the last Do said %v; want 4 runs, then review", ran.Load(), a.Status, a.Attempt, a.Error, err)
	}
}

// KindHoldAfterLostRecoverable: the statement in which a reaper
// takes due actions, each held for its own kind's hold
// (RecoverRequest.KindHolds), commits and its reply is lost, or never
// comes. The reaper decides nothing. The action is held for its kind's
// hold (a 1 s lease), not Config.Default's (an hour): another reaper
// decides it once that hold has passed.
func testKindHoldAfterLostRecoverable(t *testing.T, h Harness) {
	for _, hang := range []bool{false, true} {
		name := "lost"
		if hang {
			name = "hung"
		}
		t.Run(name, func(t *testing.T) {
			const hold = time.Second
			cfg := once.Config{Default: once.KindPolicy{Lease: time.Hour}, Kinds: map[string]once.KindPolicy{"send_email": {Lease: hold}},
				ClaimTimeout: time.Second, Logger: quiet}
			cut, direct, s, f := faultClients(t, h, cfg)
			ctx := context.Background()
			in := once.Intent{Run: "hold-" + name, Kind: "send_email", Target: "ada@example.com"}
			k, fp, _ := once.KeyOf(in)
			if cr, err := s.Claim(ctx, once.ClaimRequest{Key: k, Fingerprint: fp, Run: in.Run, Kind: in.Kind, Target: in.Target, Lease: time.Millisecond, Token: "dead-worker"}); err != nil || !cr.Claimed {
				t.Fatalf("claim: %+v, %v", cr, err)
			}
			time.Sleep(20 * time.Millisecond)
			r1, err := once.NewReaper(cut, once.ReaperConfig{Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			r2, err := once.NewReaper(direct, once.ReaperConfig{Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			lost := f.LoseReply(h.Markers.Recoverable, hang)
			taken := time.Now()
			rep, err := r1.RunOnce(ctx)
			if !happened(lost) {
				t.Fatal("the reaper's statement did not lose its reply")
			}
			if err == nil || rep.Examined != 0 {
				t.Fatalf("the pass whose reply was lost = %+v, %v; want an error and nothing decided", rep, err)
			}
			a, err := s.Get(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			if a.Status != once.StatusInFlight || a.LeaseUntil.Before(taken) || a.LeaseUntil.Sub(taken) > hold+2*time.Second {
				t.Fatalf("after the lost reply the action is %s, held until %v (%v after it was taken); want in flight, held for the kind's %v",
					a.Status, a.LeaseUntil, a.LeaseUntil.Sub(taken), hold)
			}
			time.Sleep(time.Until(a.LeaseUntil) + 100*time.Millisecond)
			rep, err = r2.RunOnce(ctx)
			if err != nil || rep.Examined != 1 {
				t.Fatalf("a pass after the kind's hold = %+v, %v; want the action decided", rep, err)
			}
			if a, err := s.Get(ctx, k); err != nil || a.Status == once.StatusInFlight {
				t.Fatalf("after the second pass the action is %s, %v; want it decided", a.Status, err)
			}
		})
	}
}

// AbandonRepeatedWithLostReplies: a person abandons an action in
// review and the abandon's reply is lost after it committed; the row is
// read back and the abandon reported done. The person abandons again:
// refused (*ConflictError), and that refusal's own write loses its
// reply, or hangs; they abandon a third time: refused again, and not
// written, since the trail's last event is that refusal. The caller is
// answered each time, and the trail holds one abandon and one refusal.
func testAbandonRepeatedWithLostReplies(t *testing.T, h Harness) {
	for _, hang := range []bool{false, true} {
		name := "lost"
		if hang {
			name = "hung"
		}
		t.Run(name, func(t *testing.T) {
			cut, direct, s, f := faultClients(t, h, once.Config{ClaimTimeout: time.Second, RecordTimeout: 2 * time.Second, Logger: quiet})
			ctx := context.Background()
			in := once.Intent{Run: "abandon-" + name, Kind: "send_email", Target: "ada@example.com"}
			if _, err := once.Do(ctx, direct, in, func(context.Context, once.Attempt) (string, error) { return "", errors.New("timeout after DATA") }); !errors.Is(err, once.ErrReview) {
				t.Fatalf("Do = %v, want review", err)
			}
			k, _, _ := once.KeyOf(in)
			abandon := once.Resolution{Decision: once.DecisionAbandon, By: "ada", Note: "the customer cancelled"}
			lost := f.LoseReply(h.Markers.Transition, hang)
			if a, err := cut.Resolve(ctx, k, abandon); err != nil || a.Status != once.StatusFailed {
				t.Fatalf("the abandon whose reply was lost = %s, %v; want it read back, failed", a.Status, err)
			}
			<-lost
			lost = f.LoseReply(h.Markers.AppendEvent, hang)
			var conflict *once.ConflictError
			if _, err := cut.Resolve(ctx, k, abandon); !errors.As(err, &conflict) {
				t.Fatalf("the second abandon = %v, want *ConflictError", err)
			}
			if !happened(lost) {
				t.Fatal("the refusal's write did not lose its reply")
			}
			if _, err := cut.Resolve(ctx, k, abandon); !errors.As(err, &conflict) {
				t.Fatalf("the third abandon = %v, want *ConflictError", err)
			}
			evs, err := s.Events(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			resolved, refused := 0, 0
			for _, e := range evs {
				switch e.Type {
				case once.EventResolved:
					resolved++
				case once.EventRefused:
					refused++
				}
			}
			if resolved != 1 || refused != 1 {
				t.Fatalf("trail %s: %d resolved, %d refused; want one of each", eventTrail(evs), resolved, refused)
			}
		})
	}
}

// ReaperPausedPastKindHold: a reaper takes a dead claim, held for
// its kind's hold (a 500 ms lease), and pauses before deciding for
// longer than that hold. Another reaper takes it over and puts it up
// for review. The first then carries on: its decision is fenced by the
// newer take, so the trail holds one review, not two.
func testReaperPausedPastKindHold(t *testing.T, h Harness) {
	const hold = 500 * time.Millisecond
	kinds := map[string]once.KindPolicy{"send_email": {Lease: hold}}
	entered, resume := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	paused, other, s, _ := faultClients(t, h, once.Config{Default: once.KindPolicy{Lease: time.Hour}, Kinds: kinds, Logger: quiet,
		Hooks: once.Hooks{OnEvent: func(_ context.Context, o once.Observation) {
			if o.Type == once.EventLeaseExpired && o.Actor == once.ActorReaper && first.CompareAndSwap(false, true) {
				close(entered)
				<-resume
			}
		}}})
	ctx := context.Background()
	in := once.Intent{Run: "reaper-paused", Kind: "send_email", Target: "ada@example.com"}
	k, fp, _ := once.KeyOf(in)
	if cr, err := s.Claim(ctx, once.ClaimRequest{Key: k, Fingerprint: fp, Run: in.Run, Kind: in.Kind, Target: in.Target, Lease: time.Millisecond, Token: "dead-worker"}); err != nil || !cr.Claimed {
		t.Fatalf("claim: %+v, %v", cr, err)
	}
	time.Sleep(20 * time.Millisecond)
	r1, err := once.NewReaper(paused, once.ReaperConfig{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := once.NewReaper(other, once.ReaperConfig{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	type pass struct {
		rep once.ReapReport
		err error
	}
	done := make(chan pass, 1)
	go func() {
		rep, err := r1.RunOnce(ctx)
		done <- pass{rep, err}
	}()
	select {
	case <-entered:
	case p := <-done:
		t.Fatalf("the first reaper finished (%+v, %v) without taking the action", p.rep, p.err)
	}
	time.Sleep(hold + 200*time.Millisecond)
	rep, err := r2.RunOnce(ctx)
	close(resume)
	p := <-done
	if err != nil || rep.Review != 1 {
		t.Fatalf("the second reaper's pass = %+v, %v; want it to take the action over and put it up for review", rep, err)
	}
	t.Logf("the paused reaper's pass: %+v, %v", p.rep, p.err)
	if p.rep.Review != 0 {
		t.Errorf("the paused reaper counted a review (%+v) after its hold was taken over", p.rep)
	}
	evs, err := s.Events(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	reviews := 0
	for _, e := range evs {
		if e.Type == once.EventReview {
			reviews++
		}
	}
	if a, err := s.Get(ctx, k); err != nil || a.Status != once.StatusReview || reviews != 1 {
		t.Fatalf("the action is %s (%v); trail %s with %d reviews; want review, one", a.Status, err, eventTrail(evs), reviews)
	}
}

// happened waits for a lost reply to be reported: a fault proxy closes
// the connection just before it says so, so the client may hear of the
// cut first.
func happened(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	case <-time.After(5 * time.Second):
		return false
	}
}

// eventTrail is evs' types, joined by commas.
func eventTrail(evs []once.Event) string {
	types := make([]string, len(evs))
	for i, e := range evs {
		types[i] = string(e.Type)
	}
	return strings.Join(types, ",")
}

// quiet discards what the clients of the partial-failure tests log.
var quiet = slog.New(slog.DiscardHandler)

// BlackholedClaimSaysTheStoreIsUnreachable: with the database
// black-holed, a claim on a fresh key and the read-back after it both go
// unanswered. That is not "no row visible": no transaction is known to
// hold the key. Do says the store could not be reached (ErrUnavailable,
// not *InFlightError), the job is retried, and idemhttp answers 503
// "unavailable", not 409 "still being processed". Once the database
// answers again, the key runs once.
func testBlackholedClaimSaysTheStoreIsUnreachable(t *testing.T, h Harness) {
	cut, _, _, f := faultClients(t, h, once.Config{ClaimTimeout: time.Second, Logger: quiet})
	in := once.Intent{Run: "blackholed", Kind: "send_email", Target: "ada@example.com"}
	var ran atomic.Int64
	effect := func(context.Context, once.Attempt) (string, error) {
		ran.Add(1)
		return "sent", nil
	}
	f.Hang(true)
	_, err := once.Do(context.Background(), cut, in, effect)
	if !errors.Is(err, once.ErrUnavailable) || errors.Is(err, once.ErrInFlight) || ran.Load() != 0 {
		t.Fatalf("Do on a black-holed database = %v (ran %d); want ErrUnavailable, not in flight, and nothing run", err, ran.Load())
	}
	if d := once.Dispose(err); d.Action != once.JobRetry || !strings.Contains(d.Reason, "could not be reached") {
		t.Fatalf("Dispose = %+v; want a retry that says the store could not be reached", d)
	}

	mw := idemhttp.Middleware(cut, idemhttp.Config{Scope: func(*http.Request) string { return "tenant:acme" }})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ran.Add(1)
			w.WriteHeader(http.StatusCreated)
		}))
	srv := httptest.NewServer(mw)
	defer srv.Close()
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", "blackholed-1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), `"unavailable"`) || ran.Load() != 0 {
		t.Fatalf("idemhttp on a black-holed database = %d %s (ran %d); want 503 unavailable, nothing run", resp.StatusCode, string(body), ran.Load())
	}

	f.Hang(false)
	res, err := once.Do(context.Background(), cut, in, effect)
	if err != nil || res.Value != "sent" || ran.Load() != 1 {
		t.Fatalf("Do once the database answers = %+v, %v (ran %d); want it run once", res, err, ran.Load())
	}
}

// HungLoneOutcomeHoldsNoClaim: an outcome sent alone, at once, on a
// connection that then hangs counts, under group commit, as the batch
// in flight, and requests made meanwhile queue behind it. A claim on a
// free key from another worker, with healthy connections free in the
// pool, must not wait for that hang (RecordTimeout/3, 10 s) and be told
// a transaction holds its key: it goes out on another connection, and
// its effect runs.
func testHungLoneOutcomeHoldsNoClaim(t *testing.T, h Harness) {
	c, _, _, f := faultClients(t, h, once.Config{ClaimTimeout: 2 * time.Second, Logger: quiet})
	// One connection used and back in the pool, so the claim below
	// need not dial while the outcome hangs.
	if _, err := once.Do(context.Background(), c, once.Intent{Run: "warm", Kind: "send_email", Target: "ada@example.com"},
		func(context.Context, once.Attempt) (string, error) { return "sent", nil }); err != nil {
		t.Fatal(err)
	}
	var (
		hung     <-chan struct{}
		claimErr = make(chan error, 1)
		ran      atomic.Int64
		took     time.Duration
	)
	_, err := once.Do(context.Background(), c, once.Intent{Run: "hung-outcome", Kind: "send_email", Target: "ada@example.com"},
		func(context.Context, once.Attempt) (string, error) {
			hung = f.LoseReply(h.Markers.Transition, true)
			go func() {
				<-hung
				start := time.Now()
				_, err := once.Do(context.Background(), c, once.Intent{Run: "free-key", Kind: "send_email", Target: "bob@example.com"},
					func(context.Context, once.Attempt) (string, error) {
						ran.Add(1)
						return "sent", nil
					})
				took = time.Since(start)
				claimErr <- err
			}()
			return "sent", nil
		})
	if err != nil {
		t.Logf("the hung outcome's Do: %v", err)
	}
	select {
	case <-hung:
	default:
		t.Fatal("the outcome's connection never hung")
	}
	if err := <-claimErr; err != nil || ran.Load() != 1 {
		t.Fatalf("Do on a free key behind a hung outcome = %v (ran %d, after %v); want it claimed on another connection and run", err, ran.Load(), took)
	}
	t.Logf("the free key's Do took %v behind the hung outcome", took)
}

// DatabaseGoesAway: the store's connections are refused mid-effect.
// The effect ran, the outcome cannot be recorded, and the claim stays in
// flight so that no redelivery repeats it.
func testDatabaseGoesAway(t *testing.T, h Harness) {
	c, healthy, s, f := faultClients(t, h, once.Config{RecordTimeout: 300 * time.Millisecond, Logger: quiet})
	ctx := context.Background()
	in := once.Intent{Run: "r", Kind: "send_email", Target: "x@example.com"}
	res, err := once.Do(ctx, c, in, func(ctx context.Context, a once.Attempt) (string, error) {
		f.Refuse(true) // the database is gone for this worker
		return "sent", nil
	})
	if !errors.Is(err, once.ErrNotRecorded) || res.Value != "sent" {
		t.Fatalf("Do = %+v, %v; want ErrNotRecorded with the value", res, err)
	}
	if !strings.Contains(err.Error(), "recovery applies") {
		t.Fatalf("message %q does not say what happens next", err)
	}
	if a := mustGet(t, s, keyOf(t, in)); a.Status != once.StatusInFlight {
		t.Fatalf("stored %+v; want the claim still in flight", a)
	}
	// The redelivered job, on a healthy worker, does not send again.
	if _, err := once.Do(ctx, healthy, in, func(context.Context, once.Attempt) (string, error) {
		t.Error("effect repeated after the database went away")
		return "", nil
	}); !errors.Is(err, once.ErrInFlight) {
		t.Fatalf("redelivery = %v, want ErrInFlight", err)
	}
}

// A worker is cut off from the database by a half-open partition while
// its effect runs. Its heartbeat timer stops the effect, which knows it
// sent nothing and says RetryLater. Meanwhile its lease lapses and the
// reaper releases the action (RetryWithProviderKey) for the next
// delivery. The partition heals and the worker records its release: it
// is fenced (the row is already released at its attempt), and Dispose
// tells it to ack, because "a newer attempt, from another delivery, owns
// it". There is no newer attempt and no other delivery: the job that
// could run the action is acked, the action stays released, and with no
// Redrive hook (the default) nothing ever runs it.
func testAdversaryFencedReleaseIsAcked(t *testing.T, h Harness) {
	pol := once.KindPolicy{Recovery: once.RetryWithProviderKey, Lease: 600 * time.Millisecond, MaxExecution: 30 * time.Second}
	cut, direct, s, f := faultClients(t, h, once.Config{Default: pol, RecordTimeout: 10 * time.Second})
	reaper, err := once.NewReaper(direct, once.ReaperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	in := once.Intent{Run: "adv-fenced-ack", Kind: "charge", Target: "cus_1"}
	k, _, _ := once.KeyOf(in)
	_, err = once.Do(ctx, cut, in, func(ectx context.Context, a once.Attempt) (string, error) {
		f.Hang(true)
		<-ectx.Done() // the heartbeat's timer: no heartbeat got through for a lease
		deadline := time.Now().Add(15 * time.Second)
		for {
			if _, err := reaper.RunOnce(ctx); err != nil {
				t.Errorf("reaper: %v", err)
			}
			if a, err := s.Get(ctx, k); err == nil && a.Status == once.StatusReleased {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("the reaper never released the lapsed claim")
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		f.Hang(false)
		return "", once.RetryLater(context.Cause(ectx))
	})
	a, gerr := s.Get(ctx, k)
	if gerr != nil {
		t.Fatal(gerr)
	}
	d := once.Dispose(err)
	t.Logf("Do = %v; Dispose = %s (%s); stored %s attempt %d", err, d.Action, d.Reason, a.Status, a.Attempt)
	if d.Action == once.JobAck && a.Status == once.StatusReleased && a.Attempt == 1 {
		t.Fatalf("the worker is told to ack its job while the action is released at its own attempt and no other delivery exists: nothing will run it")
	}
}

// The reaper's calls have no deadline of their own: a connection that
// hangs instead of failing (a half-open TCP connection, a stuck proxy)
// holds a pass forever, and Start never makes another. Every action whose
// worker died after that is left in flight for good.
func testAdversaryHungReaperCall(t *testing.T, h Harness) {
	pol := once.KindPolicy{Lease: 300 * time.Millisecond}
	// Each of the reaper's calls is bounded by ClaimTimeout.
	cut, _, s, f := faultClients(t, h, once.Config{Default: pol, ClaimTimeout: time.Second})
	passes := make(chan error, 100)
	reaper, err := once.NewReaper(cut, once.ReaperConfig{Interval: 50 * time.Millisecond, OnPass: func(_ once.ReapReport, err error) {
		select {
		case passes <- err:
		default:
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	// The next statement that takes due actions commits and its reply
	// never comes.
	hung := f.LoseReply(h.Markers.Recoverable, true)
	ctx := context.Background()
	if err := reaper.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		f.Hang(false) // ends the hung call, so Stop can return
		reaper.Stop()
	}()
	select {
	case <-hung:
	case <-time.After(10 * time.Second):
		t.Fatal("the reaper's statement was never hung")
	}
	// A worker claims and dies.
	in := once.Intent{Run: "adv-hung-reaper", Kind: "send_email", Target: "ada@example.com"}
	k, fp, _ := once.KeyOf(in)
	if cr, err := s.Claim(ctx, once.ClaimRequest{Key: k, Fingerprint: fp, Run: in.Run, Kind: in.Kind, Target: in.Target, Lease: time.Millisecond, Token: "dead-worker"}); err != nil || !cr.Claimed {
		t.Fatalf("claim: %+v, %v", cr, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		a, err := s.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if a.Status != once.StatusInFlight {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("5s after its worker died the action is still %s: the reaper's pass hung on one call and no pass ran since (%d passes completed)", a.Status, len(passes))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A worker's effect is slow and its lease lapses (a partition cuts its
// heartbeats); recovery puts it up for review, a person abandons it, and
// an operator purges finished actions (once purge --older-than). Then the
// partition heals and the worker's effect, which did happen, returns. Its
// late success finds no row: recordLate reports the NotFound as a
// *RecordError, Dispose says retry ("the next delivery finds the claim
// and recovery decides"), and the next delivery finds no claim, claims
// afresh and runs the effect a second time.
func testAdversaryLateSuccessAfterPurgeRunsAgain(t *testing.T, h Harness) {
	pol := once.KindPolicy{Lease: 600 * time.Millisecond, MaxExecution: 30 * time.Second}
	cut, direct, s, f := faultClients(t, h, once.Config{Default: pol, RecordTimeout: 10 * time.Second})
	reaper, err := once.NewReaper(direct, once.ReaperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	in := once.Intent{Run: "adv-purged", Kind: "send_email", Target: "ada@example.com"}
	k, _, _ := once.KeyOf(in)
	sent := 0
	_, err = once.Do(ctx, cut, in, func(ectx context.Context, a once.Attempt) (string, error) {
		f.Hang(true)
		<-ectx.Done()
		sent++ // the SMTP server had already accepted the message
		deadline := time.Now().Add(15 * time.Second)
		for {
			if _, err := reaper.RunOnce(ctx); err != nil {
				t.Errorf("reaper: %v", err)
			}
			if a, err := s.Get(ctx, k); err == nil && a.Status == once.StatusReview {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("the reaper never put the lapsed claim up for review")
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if _, err := direct.Resolve(ctx, k, once.Resolution{Decision: once.DecisionAbandon, By: "ada", Note: "customer cancelled"}); err != nil {
			t.Errorf("resolve: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
		if n, err := direct.Purge(ctx, once.PurgeOptions{OlderThan: time.Millisecond}); err != nil || n != 1 {
			t.Errorf("purge = %d, %v", n, err)
		}
		f.Hang(false)
		return "250 OK", nil
	})
	d := once.Dispose(err)
	t.Logf("late worker: Do = %v; Dispose = %s (%s)", err, d.Action, d.Reason)
	if d.Action == once.JobRetry {
		// The queue delivers the job again.
		if _, err := once.Do(ctx, direct, in, func(context.Context, once.Attempt) (string, error) {
			sent++
			return "250 OK", nil
		}); err != nil {
			t.Logf("redelivery: %v", err)
		}
	}
	if sent != 1 {
		t.Fatalf("the message was sent %d times: the late success of a purged action was reported unrecorded and retried", sent)
	}
}

// The worker's unknown outcome (VerifyThenDecide) commits and its reply
// is lost; before its retry gets through, the reaper asks the verifier,
// which finds no trace, and releases the action, writing a token of its
// own. The retry is refused (the row is no longer in flight) and the
// read-back compares tokens: the reaper's replaced the worker's, so the
// worker concludes its outcome was never recorded, returns *FencedError,
// and Dispose says ack. The trail shows the worker's outcome recorded;
// the action is released at the worker's own attempt and no delivery
// is left to run it.
func testAdversaryRecordReadBackAfterRecoveryOverwrote(t *testing.T, h Harness) {
	noTrace := func(context.Context, once.Action) (bool, json.RawMessage, error) { return false, nil, nil }
	pol := once.KindPolicy{Recovery: once.VerifyThenDecide, Verifier: noTrace, Lease: 2 * time.Second, MaxExecution: 5 * time.Second}
	cut, direct, s, f := faultClients(t, h, once.Config{Default: pol, RecordTimeout: 10 * time.Second})
	reaper, err := once.NewReaper(direct, once.ReaperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	in := once.Intent{Run: "adv-readback", Kind: "charge", Target: "cus_1"}
	k, _, _ := once.KeyOf(in)
	lost := f.LoseReply(h.Markers.Transition, false)
	go func() {
		<-lost
		f.Hang(true) // the worker's retry waits out its deadline
		defer func() {
			f.Hang(false)
		}()
		time.Sleep(10 * time.Millisecond)
		rep, err := reaper.RunOnce(ctx)
		if err != nil || rep.Released != 1 {
			t.Errorf("reaper = %+v, %v; want the unknown outcome released", rep, err)
		}
	}()
	_, err = once.Do(ctx, cut, in, func(context.Context, once.Attempt) (string, error) {
		return "", errors.New("provider timed out")
	})
	a, gerr := s.Get(ctx, k)
	if gerr != nil {
		t.Fatal(gerr)
	}
	evs, _ := s.Events(ctx, k)
	var trail []string
	for _, e := range evs {
		trail = append(trail, string(e.Type)+"/"+e.Actor)
	}
	d := once.Dispose(err)
	t.Logf("Do = %v; Dispose = %s; stored %s attempt %d; trail %v", err, d.Action, a.Status, a.Attempt, trail)
	if errors.Is(err, once.ErrFenced) {
		t.Errorf("the worker's outcome is in the trail, yet Do says it was superseded and not recorded")
	}
	if d.Action == once.JobAck && a.Status == once.StatusReleased && a.Attempt == 1 {
		t.Errorf("the worker is told to ack while the action is released at its own attempt: nothing will run it")
	}
}
