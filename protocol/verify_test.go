package protocol_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/protocol"
)

// verifiedServer is /v1 over store with send_email verified by clients
// of the protocol: a 1 s lease, and questions given up on after 3 s.
func verifiedServer(t *testing.T, store once.Store) *server {
	v := protocol.NewVerifiers()
	verifiersOf[store] = v
	t.Cleanup(func() { delete(verifiersOf, store) })
	return newServer(t, store, once.Config{Kinds: map[string]once.KindPolicy{
		"send_email": {Lease: time.Second, MaxExecution: 3 * time.Second, Recovery: once.VerifyThenDecide, Verifier: v.For("send_email"), MaxVerifyFailures: 2},
	}})
}

// verifyOnce takes one question for send_email, as a client verifier
// does, checks it is about attempt 1 of key, and answers it.
func verifyOnce(t *testing.T, s *server, key string, answer map[string]any) {
	t.Helper()
	code, v := s.post("/v1/verify/take", map[string]any{"kinds": []string{"send_email"}, "wait_ms": 10000})
	qs, _ := v["questions"].([]any)
	if code != 200 || len(qs) != 1 {
		t.Errorf("take = %d %v; want one question", code, v)
		return
	}
	q := qs[0].(map[string]any)
	if q["key"] != key || q["attempt"] != 1.0 || q["provider_key"] != key || q["answer_within_ms"].(float64) <= 0 {
		t.Errorf("question %v; want attempt 1 of %s with its provider key and a time to answer in", q, key)
		return
	}
	if p, _ := json.Marshal(q["payload"]); string(p) != `{"subject":"hello"}` {
		t.Errorf("question's payload %s", p)
	}
	answer["question"] = q["question"]
	code, v = s.post("/v1/verify/answer", answer)
	if code != 200 || v["received"] != true {
		t.Errorf("answer = %d %v", code, v)
	}
	// Sent again (its reply lost), it was received; another verdict
	// for the same question is a conflict.
	if code, v = s.post("/v1/verify/answer", answer); code != 200 || v["received"] != true {
		t.Errorf("the same answer sent again = %d %v; want received", code, v)
	}
	other := map[string]any{"question": q["question"], "verdict": "cannot_tell", "error": "the provider is down"}
	if code, v = s.post("/v1/verify/answer", other); code != 409 {
		t.Errorf("another verdict for the question = %d %v; want 409", code, v)
	}
}

// TestClientVerifierDecides: a claim whose worker died is decided by a
// verifier that is a client of the protocol: landed, the duplicate
// that met the dead claim is answered with the verifier's result, and
// nothing runs again; not landed, the duplicate takes it over.
func TestClientVerifierDecides(t *testing.T) {
	for name, open := range stores(t) {
		t.Run(name, func(t *testing.T) {
			for _, c := range []struct {
				verdict map[string]any
				want    string
			}{
				{map[string]any{"verdict": "landed", "result": map[string]any{"id": "msg-1"}}, "replayed"},
				{map[string]any{"verdict": "not_landed"}, "claimed"},
			} {
				t.Run(c.verdict["verdict"].(string), func(t *testing.T) {
					s := verifiedServer(t, open(t))
					in := wireIntent(1, map[string]any{"subject": "hello"})
					code, dead := s.post("/v1/claim", claimBody(in))
					want(t, "claim", code, dead, 200, "answer", "claimed")
					time.Sleep(1500 * time.Millisecond) // its worker died; the lease lapses

					var wg sync.WaitGroup
					wg.Go(func() { verifyOnce(t, s, dead["key"].(string), c.verdict) })
					code, v := s.post("/v1/claim", claimBody(in))
					wg.Wait()
					want(t, "the duplicate that met the dead claim", code, v, 200, "answer", c.want)
					got, err := s.c.Get(t.Context(), once.Key(dead["key"].(string)))
					if err != nil {
						t.Fatal(err)
					}
					switch c.want {
					case "replayed":
						if r, _ := json.Marshal(v["result"]); string(r) != `{"id":"msg-1"}` || got.Status != once.StatusSucceeded || got.Attempt != 1 {
							t.Fatalf("replayed %s; row %s at attempt %d; want the verifier's result at attempt 1", r, got.Status, got.Attempt)
						}
					case "claimed":
						if v["attempt"] != 2.0 || got.Status != once.StatusInFlight {
							t.Fatalf("claimed attempt %v; row %s; want attempt 2 in flight", v["attempt"], got.Status)
						}
					}
				})
			}
		})
	}
}

// TestClientVerifierAbsent: with no client verifier taking questions,
// the question is given up on at MaxExecution as a verifier that could
// not tell, and after MaxVerifyFailures the action goes to review: it
// is never decided without one, nor run again. A take for a kind not
// verified by clients is refused.
func TestClientVerifierAbsent(t *testing.T) {
	s := verifiedServer(t, stores(t)["sqlite"](t))
	code, v := s.post("/v1/verify/take", map[string]any{"kinds": []string{"charge_card"}})
	want(t, "take of a kind not verified by clients", code, v, 400, "code", "not_client_verified")
	code, v = s.post("/v1/verify/answer", map[string]any{"question": "no-such-question", "verdict": "not_landed"})
	want(t, "answer of no question", code, v, 404, "code", "no_such_question")

	in := wireIntent(1, map[string]any{"subject": "hello"})
	code, dead := s.post("/v1/claim", claimBody(in))
	want(t, "claim", code, dead, 200, "answer", "claimed")
	time.Sleep(1500 * time.Millisecond)
	code, v = s.post("/v1/claim", claimBody(in))
	if code != 409 || (v["code"] != "in_flight" && v["code"] != "outcome_unknown") {
		t.Fatalf("a duplicate with no verifier answering = %d %v; want 409, the action undecided", code, v)
	}
	got, err := s.c.Get(t.Context(), once.Key(dead["key"].(string)))
	if err != nil {
		t.Fatal(err)
	}
	if got.VerifyFailures != 1 || got.Attempt != 1 {
		t.Fatalf("row %s at attempt %d with %d verifier failures; want 1 failure, attempt 1", got.Status, got.Attempt, got.VerifyFailures)
	}
	evs, err := s.c.Events(t.Context(), got.Key)
	if err != nil {
		t.Fatal(err)
	}
	if last := evs[len(evs)-1]; !strings.Contains(last.Note, "no client verifier of kind") {
		t.Fatalf("the trail's last event says %q; want that no client verifier took the question", last.Note)
	}
}

// TestClientVerifierTooLate: a verifier that takes a question and
// answers after answer_within_ms (it paused past the recoverer's
// patience) is told its answer came too late, and the answer decides
// nothing: the action was counted as undecided, and is asked again.
func TestClientVerifierTooLate(t *testing.T) {
	s := verifiedServer(t, stores(t)["sqlite"](t))
	in := wireIntent(1, map[string]any{"subject": "hello"})
	code, dead := s.post("/v1/claim", claimBody(in))
	want(t, "claim", code, dead, 200, "answer", "claimed")
	time.Sleep(1500 * time.Millisecond)
	var wg sync.WaitGroup
	wg.Go(func() { s.post("/v1/claim", claimBody(in)) })
	code, v := s.post("/v1/verify/take", map[string]any{"kinds": []string{"send_email"}, "wait_ms": 10000})
	qs, _ := v["questions"].([]any)
	if code != 200 || len(qs) != 1 {
		t.Fatalf("take = %d %v", code, v)
	}
	q := qs[0].(map[string]any)
	time.Sleep(time.Duration(q["answer_within_ms"].(float64))*time.Millisecond + 2*time.Second)
	wg.Wait()
	code, v = s.post("/v1/verify/answer", map[string]any{"question": q["question"], "verdict": "landed", "result": "late"})
	want(t, "an answer after answer_within_ms", code, v, 404, "code", "no_such_question")
	got, err := s.c.Get(t.Context(), once.Key(dead["key"].(string)))
	if err != nil {
		t.Fatal(err)
	}
	if got.Status == once.StatusSucceeded || got.VerifyFailures != 1 {
		t.Fatalf("row %s with %d verifier failures after a late answer; want it undecided, 1 failure", got.Status, got.VerifyFailures)
	}
}

// TestReaperDecidesOtherKindsWhileAClientVerifierIsAsked: a question
// no client verifier takes holds the reaper's pass only briefly (not
// the kind's max execution, a minute here): the other kinds' dead
// claims are decided meanwhile. The verified action is not decided by
// anything else: it waits, counted as a verifier that could not tell,
// to be asked again.
func TestReaperDecidesOtherKindsWhileAClientVerifierIsAsked(t *testing.T) {
	for name, open := range stores(t) {
		t.Run(name, func(t *testing.T) {
			store := open(t)
			v := protocol.NewVerifiers()
			verifiersOf[store] = v
			t.Cleanup(func() { delete(verifiersOf, store) })
			s := newServer(t, store, once.Config{Kinds: map[string]once.KindPolicy{
				"send_email":  {Lease: time.Second, MaxExecution: time.Minute, Recovery: once.VerifyThenDecide, Verifier: v.For("send_email")},
				"charge_card": {Lease: 2 * time.Second, Recovery: once.AskPerson},
			}})
			code, verified := s.post("/v1/claim", claimBody(wireIntent(1, map[string]any{"subject": "hello"})))
			want(t, "claim send_email", code, verified, 200, "answer", "claimed")
			code, other := s.post("/v1/claim", claimBody(map[string]any{"run": "run-1", "step": 2, "kind": "charge_card", "target": "acct-1", "payload": 1}))
			want(t, "claim charge_card", code, other, 200, "answer", "claimed")
			time.Sleep(2500 * time.Millisecond) // both workers died

			r, err := once.NewReaper(s.c, once.ReaperConfig{})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			passed := make(chan once.ReapReport, 1)
			go func() {
				rep, _ := r.RunOnce(ctx)
				passed <- rep
			}()
			defer func() { cancel(); <-passed }()
			deadline := time.Now().Add(15 * time.Second)
			for {
				got, err := s.c.Get(t.Context(), once.Key(other["key"].(string)))
				if err != nil {
					t.Fatal(err)
				}
				if got.Status == once.StatusReview {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("charge_card's dead claim is %s 15 s into the pass; want review: the pass waits on send_email's verifier", got.Status)
				}
				time.Sleep(100 * time.Millisecond)
			}
			select {
			case rep := <-passed:
				passed <- rep
			case <-time.After(15 * time.Second):
				t.Fatal("the pass did not end within 15 s")
			}
			got, err := s.c.Get(t.Context(), once.Key(verified["key"].(string)))
			if err != nil {
				t.Fatal(err)
			}
			if got.Status == once.StatusSucceeded || got.Status == once.StatusReview || got.Status == once.StatusReleased || got.Attempt != 1 || got.VerifyFailures != 1 {
				t.Fatalf("send_email's row %s at attempt %d with %d verifier failures; want it undecided, asked again later", got.Status, got.Attempt, got.VerifyFailures)
			}
		})
	}
}

// TestClientVerifierOfAnyServerOfTheStore: two servers on one store,
// a client verifier taking questions from the second only. A question
// the first's reaper asks is given up on promptly there (no client
// takes it), counted as a verifier that could not tell; asked again
// after the backoff by the second's reaper, the verifier there
// answers it and decides the action.
func TestClientVerifierOfAnyServerOfTheStore(t *testing.T) {
	for name, open := range stores(t) {
		t.Run(name, func(t *testing.T) {
			store := open(t)
			serverOf := func() (*server, *once.Reaper) {
				v := protocol.NewVerifiers()
				c, err := once.New(once.Config{Store: store, Kinds: map[string]once.KindPolicy{
					"send_email": {Lease: time.Second, MaxExecution: time.Minute, VerifyBackoff: time.Second, Recovery: once.VerifyThenDecide, Verifier: v.For("send_email")},
				}})
				if err != nil {
					t.Fatal(err)
				}
				p, err := protocol.New(protocol.Config{Client: c, Workers: []string{workerToken}, Verifiers: v})
				if err != nil {
					t.Fatal(err)
				}
				hs := httptest.NewServer(p)
				t.Cleanup(hs.Close)
				r, err := once.NewReaper(c, once.ReaperConfig{})
				if err != nil {
					t.Fatal(err)
				}
				return &server{t: t, url: hs.URL, c: c}, r
			}
			if err := store.Migrate(t.Context()); err != nil {
				t.Fatal(err)
			}
			a, reapA := serverOf()
			b, reapB := serverOf()
			code, dead := a.post("/v1/claim", claimBody(wireIntent(1, map[string]any{"subject": "hello"})))
			want(t, "claim", code, dead, 200, "answer", "claimed")
			key := once.Key(dead["key"].(string))
			time.Sleep(1500 * time.Millisecond) // its worker died

			start := time.Now()
			if _, err := reapA.RunOnce(t.Context()); err != nil {
				t.Fatal(err)
			}
			if took := time.Since(start); took > 10*time.Second {
				t.Fatalf("the first server's pass took %v with no client verifier of its own; want it given up on within %v", took, protocol.TakeWithin)
			}
			row, err := a.c.Get(t.Context(), key)
			if err != nil {
				t.Fatal(err)
			}
			if row.Status == once.StatusSucceeded || row.VerifyFailures != 1 {
				t.Fatalf("after the first server's pass the row is %s with %d verifier failures; want undecided, 1", row.Status, row.VerifyFailures)
			}
			// The first server gives the kind's next questions up at once.
			time.Sleep(1100 * time.Millisecond) // the backoff
			start = time.Now()
			if _, err := reapA.RunOnce(t.Context()); err != nil {
				t.Fatal(err)
			}
			if took := time.Since(start); took > 2*time.Second {
				t.Fatalf("the first server's second pass took %v; want its question given up on at once", took)
			}
			time.Sleep(2100 * time.Millisecond) // the second backoff

			var wg sync.WaitGroup
			wg.Go(func() {
				code, v := b.post("/v1/verify/take", map[string]any{"kinds": []string{"send_email"}, "wait_ms": 10000})
				qs, _ := v["questions"].([]any)
				if code != 200 || len(qs) != 1 {
					t.Errorf("take from the second server = %d %v; want its question", code, v)
					return
				}
				q := qs[0].(map[string]any)
				code, v = b.post("/v1/verify/answer", map[string]any{"question": q["question"], "verdict": "landed", "result": map[string]any{"id": "msg-1"}})
				if code != 200 {
					t.Errorf("answer = %d %v", code, v)
				}
			})
			time.Sleep(200 * time.Millisecond) // the verifier is taking
			if _, err := reapB.RunOnce(t.Context()); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			if row, err = b.c.Get(t.Context(), key); err != nil {
				t.Fatal(err)
			}
			if row.Status != once.StatusSucceeded || row.Attempt != 1 {
				t.Fatalf("after the second server's pass the row is %s at attempt %d; want succeeded at 1, by its verifier", row.Status, row.Attempt)
			}
		})
	}
}
