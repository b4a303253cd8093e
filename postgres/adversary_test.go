package postgres_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/faultproxy"
)

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
func TestAdversaryFencedReleaseIsAcked(t *testing.T) {
	t.Parallel()
	pol := once.KindPolicy{Recovery: once.RetryWithProviderKey, Lease: 600 * time.Millisecond, MaxExecution: 30 * time.Second}
	cut, direct, proxy, s := faultClients(t, once.Config{Default: pol, RecordTimeout: 10 * time.Second})
	reaper, err := once.NewReaper(direct, once.ReaperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	in := once.Intent{Run: "adv-fenced-ack", Kind: "charge", Target: "cus_1"}
	k, _, _ := once.KeyOf(in)
	_, err = once.Do(ctx, cut, in, func(ectx context.Context, a once.Attempt) (string, error) {
		proxy.Blackout(true)
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
		proxy.Blackout(false)
		proxy.Reset()
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
func TestAdversaryHungReaperCall(t *testing.T) {
	t.Parallel()
	pol := once.KindPolicy{Lease: 300 * time.Millisecond}
	// Each of the reaper's calls is bounded by ClaimTimeout.
	cut, _, proxy, s := faultClients(t, once.Config{Default: pol, ClaimTimeout: time.Second})
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
	hung := proxy.HangAfter([]byte("ORDER BY lease_until"), faultproxy.PostgresReady)
	ctx := context.Background()
	if err := reaper.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		proxy.Close() // ends the hung call, so Stop can return
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
func TestAdversaryLateSuccessAfterPurgeRunsAgain(t *testing.T) {
	t.Parallel()
	pol := once.KindPolicy{Lease: 600 * time.Millisecond, MaxExecution: 30 * time.Second}
	cut, direct, proxy, s := faultClients(t, once.Config{Default: pol, RecordTimeout: 10 * time.Second})
	reaper, err := once.NewReaper(direct, once.ReaperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	in := once.Intent{Run: "adv-purged", Kind: "send_email", Target: "ada@example.com"}
	k, _, _ := once.KeyOf(in)
	sent := 0
	_, err = once.Do(ctx, cut, in, func(ectx context.Context, a once.Attempt) (string, error) {
		proxy.Blackout(true)
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
		proxy.Blackout(false)
		proxy.Reset()
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
func TestAdversaryRecordReadBackAfterRecoveryOverwrote(t *testing.T) {
	t.Parallel()
	noTrace := func(context.Context, once.Action) (bool, json.RawMessage, error) { return false, nil, nil }
	pol := once.KindPolicy{Recovery: once.VerifyThenDecide, Verifier: noTrace, Lease: 2 * time.Second, MaxExecution: 5 * time.Second}
	cut, direct, proxy, s := faultClients(t, once.Config{Default: pol, RecordTimeout: 10 * time.Second})
	reaper, err := once.NewReaper(direct, once.ReaperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	in := once.Intent{Run: "adv-readback", Kind: "charge", Target: "cus_1"}
	k, _, _ := once.KeyOf(in)
	lost := proxy.CutAfter([]byte("WITH u AS ("), faultproxy.PostgresReady)
	go func() {
		<-lost
		proxy.Blackout(true) // the worker's retry waits out its deadline
		defer func() {
			proxy.Blackout(false)
			proxy.Reset()
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
