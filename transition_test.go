package once

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// outcomeTransition is the whole rule book for what an effect's return
// means; every row here is one line of Do's doc.
func TestOutcomeTransition(t *testing.T) {
	a := Action{Key: "k", Attempt: 3, Kind: "send_email"}
	plain := errors.New("connection reset after DATA")
	policy := func(r Recovery) KindPolicy { return KindPolicy{Recovery: r} }
	tests := []struct {
		name      string
		pol       KindPolicy
		max       int
		value     any
		err       error
		to        Status
		from      []Status
		event     EventType
		result    string
		lease     time.Duration
		errText   string
		resultErr error
	}{
		{name: "success stores the value", pol: policy(AskPerson), value: map[string]int{"id": 7},
			to: StatusSucceeded, from: []Status{StatusInFlight}, event: EventSucceeded, result: `{"id":7}`},
		{name: "success with a nil value stores null", pol: policy(AskPerson), value: nil,
			to: StatusSucceeded, from: []Status{StatusInFlight}, event: EventSucceeded, result: `null`},
		{name: "success too large goes to review", pol: policy(RetryWithProviderKey), max: 4, value: "a long string",
			to: StatusReview, from: []Status{StatusInFlight}, event: EventReview, errText: "the effect succeeded but", resultErr: ErrResultTooLarge},
		{name: "success not JSON goes to review", pol: policy(RetryWithProviderKey), value: make(chan int),
			to: StatusReview, from: []Status{StatusInFlight}, event: EventReview, errText: "cannot be encoded as JSON", resultErr: ErrResultNotJSON},
		{name: "retry later releases", pol: policy(AskPerson), err: RetryLater(errors.New("429")),
			to: StatusReleased, from: []Status{StatusInFlight}, event: EventReleased, errText: "429"},
		{name: "retry later wrapped releases", pol: policy(AskPerson), err: fmt.Errorf("send: %w", RetryLater(errors.New("429"))),
			to: StatusReleased, from: []Status{StatusInFlight}, event: EventReleased, errText: "429"},
		{name: "permanent fails", pol: policy(VerifyThenDecide), err: Permanent(errors.New("no such mailbox")),
			to: StatusFailed, from: []Status{StatusInFlight}, event: EventFailed, errText: "no such mailbox"},
		{name: "unknown asks a person", pol: policy(AskPerson), err: plain,
			to: StatusReview, from: []Status{StatusInFlight}, event: EventReview, errText: plain.Error()},
		{name: "unknown under provider key is released", pol: policy(RetryWithProviderKey), err: plain,
			to: StatusReleased, from: []Status{StatusInFlight}, event: EventReleased, errText: plain.Error()},
		{name: "unknown under verify is due for the verifier", pol: policy(VerifyThenDecide), err: plain,
			to: StatusUnknown, from: []Status{StatusInFlight}, event: EventUnknown, errText: plain.Error(), lease: time.Millisecond},
		{name: "a panic is unknown", pol: policy(AskPerson), err: errors.New("panic: nil map"),
			to: StatusReview, from: []Status{StatusInFlight}, event: EventReview, errText: "panic: nil map"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			max := tt.max
			if max == 0 {
				max = DefaultMaxResultBytes
			}
			got, resultErr := outcomeTransition(tt.pol, max, a, tt.value, tt.err)
			if got.To != tt.to || got.Event.Type != tt.event || got.Event.To != tt.to {
				t.Errorf("to %s (event %s → %s), want %s (event %s)", got.To, got.Event.Type, got.Event.To, tt.to, tt.event)
			}
			if fmt.Sprint(got.From) != fmt.Sprint(tt.from) {
				t.Errorf("from %v, want %v", got.From, tt.from)
			}
			if string(got.Result) != tt.result {
				t.Errorf("result %q, want %q", got.Result, tt.result)
			}
			if got.Lease != tt.lease {
				t.Errorf("lease %v, want %v", got.Lease, tt.lease)
			}
			if !strings.Contains(got.Error, tt.errText) || (tt.errText == "" && got.Error != "") {
				t.Errorf("error %q, want it to say %q", got.Error, tt.errText)
			}
			if tt.resultErr == nil && resultErr != nil || tt.resultErr != nil && !errors.Is(resultErr, tt.resultErr) {
				t.Errorf("result error %v, want %v", resultErr, tt.resultErr)
			}
			// Every outcome is fenced by the attempt that ran, and its
			// event names the action, the attempt and the worker, so
			// hooks and the trail never see an anonymous transition.
			if got.Key != a.Key || got.Attempt != a.Attempt || got.NewAttempt || got.Hold != "" {
				t.Errorf("fence %s/%d (new attempt %v, hold %q), want %s/%d", got.Key, got.Attempt, got.NewAttempt, got.Hold, a.Key, a.Attempt)
			}
			if e := got.Event; e.Key != a.Key || e.Attempt != a.Attempt || e.From != StatusInFlight || e.Actor != ActorWorker || (e.Note == "") != (got.To == StatusSucceeded) {
				t.Errorf("event %+v does not name the action, attempt, origin, actor and reason", e)
			}
		})
	}
}

// A result exactly at the cap is stored; one byte over is not.
func TestOutcomeTransitionResultCap(t *testing.T) {
	a := Action{Key: "k", Attempt: 1}
	if got, err := outcomeTransition(KindPolicy{}, 5, a, "abc", nil); err != nil || got.To != StatusSucceeded {
		t.Fatalf(`"abc" (5 bytes) under a cap of 5 = %s, %v`, got.To, err)
	}
	if got, err := outcomeTransition(KindPolicy{}, 5, a, "abcd", nil); !errors.Is(err, ErrResultTooLarge) || got.To != StatusReview {
		t.Fatalf(`"abcd" (6 bytes) under a cap of 5 = %s, %v`, got.To, err)
	}
}

// classify follows wrapping both ways: a Permanent error wrapped by the
// effect is still permanent, and the marker errors match their sentinels.
func TestClassify(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want Status
	}{
		{nil, StatusSucceeded},
		{RetryLater(nil), StatusReleased},
		{Permanent(nil), StatusFailed},
		{fmt.Errorf("charge: %w", Permanent(errors.New("declined"))), StatusFailed},
		{errors.New("timeout"), StatusUnknown},
		// Both marks: the outermost is the effect's last word.
		{Permanent(fmt.Errorf("giving up: %w", RetryLater(errors.New("451")))), StatusFailed},
		{RetryLater(fmt.Errorf("later: %w", Permanent(errors.New("552")))), StatusReleased},
	} {
		if got := classify(tt.err); got != tt.want {
			t.Errorf("classify(%v) = %s, want %s", tt.err, got, tt.want)
		}
	}
	if !errors.Is(Permanent(errors.New("x")), ErrPermanent) || errors.Is(RetryLater(nil), ErrPermanent) {
		t.Error("ErrPermanent matches exactly the errors made with Permanent")
	}
	if !errors.Is(RetryLater(errors.New("x")), ErrRetryLater) {
		t.Error("RetryLater's error does not match ErrRetryLater")
	}
}

// Every field of a kind policy is inherited from Default the same way,
// recovery included.
func TestKindInheritsDefault(t *testing.T) {
	c, err := New(Config{Store: nopStore{}, Default: KindPolicy{Recovery: RetryWithProviderKey, Lease: time.Minute},
		Kinds: map[string]KindPolicy{
			"lease_only": {Lease: 10 * time.Second},
			"asks":       {Recovery: AskPerson},
		}})
	if err != nil {
		t.Fatal(err)
	}
	if p := c.Policy("lease_only"); p.Recovery != RetryWithProviderKey || p.Lease != 10*time.Second || p.MaxExecution != DefaultMaxExecution {
		t.Errorf("a kind that sets only Lease = %+v; want Default's recovery and its own lease", p)
	}
	if p := c.Policy("asks"); p.Recovery != AskPerson || p.Lease != time.Minute {
		t.Errorf("a kind that asks a person = %+v", p)
	}
	if p := c.Policy("unnamed"); p.Recovery != RetryWithProviderKey {
		t.Errorf("an unnamed kind = %v, want Default's", p.Recovery)
	}
	if p := mustNew(t, Config{Store: nopStore{}}).Policy("x"); p.Recovery != AskPerson {
		t.Errorf("with no Default the recovery is %v, want AskPerson", p.Recovery)
	}
	if _, err := New(Config{Store: nopStore{}, Kinds: map[string]KindPolicy{"v": {Recovery: VerifyThenDecide}}}); err == nil || !strings.Contains(err.Error(), `Kinds["v"].Recovery is VerifyThenDecide but Verifier is nil`) {
		t.Errorf("VerifyThenDecide without a verifier = %v", err)
	}
	verifier := func(context.Context, Action) (bool, json.RawMessage, error) { return false, nil, nil }
	if _, err := New(Config{Store: nopStore{}, Kinds: map[string]KindPolicy{"v": {Verifier: verifier}}}); err == nil || !strings.Contains(err.Error(), "the verifier is never asked") {
		t.Errorf("a Verifier under Default's AskPerson = %v; want it refused", err)
	}
}

func mustNew(t *testing.T, cfg Config) *Client {
	t.Helper()
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// nopStore satisfies Store for tests of configuration, which do no I/O.
type nopStore struct{ Store }
