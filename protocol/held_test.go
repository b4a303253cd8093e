package protocol_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncehq/once"
)

// reads counts the reads of a real store's rows.
type reads struct {
	once.Store
	n atomic.Int64
}

func (r *reads) Get(ctx context.Context, key once.Key) (once.Action, error) {
	r.n.Add(1)
	return r.Store.Get(ctx, key)
}

// TestOutcomeOfAClaimHeldHereReadsNothing: the server that answered a
// claim holds its attempt, and settles the outcome on it: no read of
// the row to rebuild it (which cost every action a transaction of its
// own), and the answer is the one the attempt's settling gives. A
// server that did not answer the claim still rebuilds it.
func TestOutcomeOfAClaimHeldHereReadsNothing(t *testing.T) {
	for name, open := range stores(t) {
		t.Run(name, func(t *testing.T) {
			store := open(t)
			r := &reads{Store: store}
			s := newServer(t, r, once.Config{})
			_, a := s.post("/v1/claim", claimBody(wireIntent(1, nil)))
			before := r.n.Load()
			code, v := s.post("/v1/outcome", outcome(a, "succeeded", map[string]any{"result": "sent"}))
			want(t, "the outcome", code, v, 200, "status", "succeeded")
			if n := r.n.Load() - before; n != 0 {
				t.Fatalf("the outcome read the row %d times; the server holds the attempt it claimed", n)
			}
			other := newServer(t, store, once.Config{})
			_, b := s.post("/v1/claim", claimBody(wireIntent(2, nil)))
			code, v = other.post("/v1/outcome", outcome(b, "succeeded", map[string]any{"result": "sent"}))
			want(t, "the outcome at a server that did not claim", code, v, 200, "status", "succeeded")
		})
	}
}

// TestLateSuccessAfterReviewIsRecorded: an attempt whose lease lapsed is
// put up for review (ask_person); its worker's success, late, is the
// answer the person was waiting for, and is recorded, as a Go worker's
// late Succeed is. It was refused as fenced over the protocol: the
// rebuilt attempt could not prove itself once the decision had taken
// the claim's token off the row.
func TestLateSuccessAfterReviewIsRecorded(t *testing.T) {
	for name, open := range stores(t) {
		t.Run(name, func(t *testing.T) {
			s := newServer(t, open(t), once.Config{Default: once.KindPolicy{Lease: time.Second, Recovery: once.AskPerson}})
			in := wireIntent(1, nil)
			_, a := s.post("/v1/claim", claimBody(in))
			time.Sleep(1200 * time.Millisecond)
			code, v := s.post("/v1/claim", claimBody(in))
			want(t, "a claim after the lease lapsed", code, v, 409, "code", "review")
			code, v = s.post("/v1/outcome", outcome(a, "succeeded", map[string]any{"result": "sent"}))
			want(t, "the late success", code, v, 200, "status", "succeeded")
			code, v = s.call("GET", "/v1/actions/"+a["key"].(string), workerToken, nil)
			want(t, "the action", code, v, 200, "status", "succeeded")
		})
	}
}

// TestLateOutcomeOfASupersededHeldAttemptIsFenced: the server holds
// attempt 1; its lease lapses and a claim takes the action over as
// attempt 2. Attempt 1's late success, settled on the attempt held
// here, is refused (fenced), sent again too, and attempt 2's own
// outcome is the one recorded.
func TestLateOutcomeOfASupersededHeldAttemptIsFenced(t *testing.T) {
	for name, open := range stores(t) {
		t.Run(name, func(t *testing.T) {
			s := newServer(t, open(t), once.Config{Default: once.KindPolicy{Lease: time.Second, Recovery: once.RetryWithProviderKey}})
			in := wireIntent(1, nil)
			_, a := s.post("/v1/claim", claimBody(in))
			time.Sleep(1200 * time.Millisecond)
			code, b := s.post("/v1/claim", claimBody(in))
			want(t, "the takeover", code, b, 200, "answer", "claimed")
			late := outcome(a, "succeeded", map[string]any{"result": "late"})
			for i := range 2 {
				code, v := s.post("/v1/outcome", late)
				want(t, fmt.Sprint("attempt 1's late success, sent ", i+1), code, v, 409, "code", "fenced")
			}
			code, v := s.post("/v1/outcome", outcome(b, "succeeded", map[string]any{"result": "sent"}))
			want(t, "attempt 2's success", code, v, 200, "status", "succeeded")
			code, v = s.call("GET", "/v1/actions/"+a["key"].(string), workerToken, nil)
			if code != 200 || v["result"] != "sent" || v["attempt"] != 2.0 {
				t.Fatalf("the action = %d %v; want attempt 2's result", code, v)
			}
		})
	}
}

// TestHeldAttemptUnderConcurrentCalls: heartbeats, the claim sent
// again (which replaces the held attempt) and the outcome, sent twice,
// all at once on one attempt: one outcome is recorded, both sends get
// its answer, and (under -race) nothing races.
func TestHeldAttemptUnderConcurrentCalls(t *testing.T) {
	s := newServer(t, stores(t)["sqlite"](t), once.Config{Default: once.KindPolicy{Lease: 5 * time.Second}})
	body := claimBody(wireIntent(1, "x"))
	_, a := s.post("/v1/claim", body)
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				s.post("/v1/heartbeat", ref(a))
				s.post("/v1/claim", body)
			}
		})
	}
	out := outcome(a, "succeeded", map[string]any{"result": "sent"})
	var codes [2]int
	var statuses [2]any
	var owg sync.WaitGroup
	for i := range 2 {
		owg.Go(func() {
			time.Sleep(20 * time.Millisecond)
			var v map[string]any
			codes[i], v = s.post("/v1/outcome", out)
			statuses[i] = v["status"]
		})
	}
	owg.Wait()
	close(done)
	wg.Wait()
	for i := range 2 {
		if codes[i] != 200 || statuses[i] != "succeeded" {
			t.Fatalf("outcome send %d = %d %v; want 200 succeeded", i+1, codes[i], statuses[i])
		}
	}
}

// TestOutcomeSentTwiceAnswersAlikeHeldOrRebuilt: an outcome settled on
// the held attempt, sent again with another write token (and another
// result), gets the first's answer and keeps its result; a different
// outcome is a conflict. A server that rebuilds the attempt answers
// both the same.
func TestOutcomeSentTwiceAnswersAlikeHeldOrRebuilt(t *testing.T) {
	store := stores(t)["sqlite"](t)
	s := newServer(t, store, once.Config{})
	other := newServer(t, store, once.Config{})
	_, a := s.post("/v1/claim", claimBody(wireIntent(1, nil)))
	code, v := s.post("/v1/outcome", outcome(a, "succeeded", map[string]any{"result": "first"}))
	want(t, "the outcome", code, v, 200, "status", "succeeded")
	for name, at := range map[string]*server{"held": s, "rebuilt": other} {
		code, v = at.post("/v1/outcome", outcome(a, "succeeded", map[string]any{"result": "second"}))
		want(t, name+": the success sent again", code, v, 200, "status", "succeeded")
		code, v = at.post("/v1/outcome", outcome(a, "permanent", map[string]any{"error": "no"}))
		want(t, name+": another outcome", code, v, 409, "code", "conflict")
	}
	code, v = s.call("GET", "/v1/actions/"+a["key"].(string), workerToken, nil)
	if code != 200 || v["result"] != "first" {
		t.Fatalf("the action = %d %v; want the first result", code, v)
	}
}
