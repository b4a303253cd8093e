package once

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// Every error Do returns maps to one thing to do with the job; the
// dangerous rows are the unknown outcomes, where acking loses the effect.
func TestDispose(t *testing.T) {
	now := time.Now()
	tests := []struct {
		name  string
		err   error
		want  JobAction
		after bool // a positive wait
	}{
		{"success", nil, JobAck, false},
		{"failed for good", &FailedError{Key: "k", Attempt: 1, Message: "declined"}, JobAck, false},
		{"failed, replayed", &FailedError{Key: "k", Attempt: 1, Replayed: true}, JobAck, false},
		{"fenced after success", &FencedError{Key: "k", Attempt: 1, Outcome: StatusSucceeded}, JobAck, false},
		{"fenced after a permanent failure", &FencedError{Key: "k", Attempt: 1, Outcome: StatusFailed}, JobAck, false},
		{"fenced, outcome unknown", &FencedError{Key: "k", Attempt: 1, Outcome: StatusReleased}, JobRetry, false},
		{"fenced before the effect ran", &FencedError{Key: "k", Attempt: 1, Outcome: StatusInFlight}, JobRetry, false},
		{"in flight", &InFlightError{Key: "k", LeaseUntil: now.Add(time.Minute)}, JobRetry, true},
		{"in flight, in an uncommitted transaction", &InFlightError{Key: "k", InTransaction: true}, JobRetry, true},
		{"permanent, from DoTx", fmt.Errorf("once: action k: the effect failed inside the transaction, roll it back: %w", Permanent(errors.New("closed"))), JobDrop, false},
		{"in flight, lease lapsed", &InFlightError{Key: "k", LeaseUntil: now.Add(-time.Second), Expired: true}, JobRetry, true},
		{"released by the effect", fmt.Errorf("once: action k attempt 1 released: %w", RetryLater(errors.New("429"))), JobRetry, false},
		{"released over a permanent mark", fmt.Errorf("once: action k attempt 1 released: %w", RetryLater(fmt.Errorf("later: %w", Permanent(errors.New("552"))))), JobRetry, false},
		{"permanent over a retry-later mark, from DoTx", fmt.Errorf("once: action k: the effect failed inside the transaction, roll it back: %w", Permanent(fmt.Errorf("giving up: %w", RetryLater(errors.New("451"))))), JobDrop, false},
		{"released under a provider key", &UnknownOutcomeError{Key: "k", Status: StatusReleased}, JobRetry, false},
		{"awaiting the verifier", &UnknownOutcomeError{Key: "k", Status: StatusUnknown, Due: now.Add(10 * time.Second)}, JobRetry, true},
		{"awaiting the verifier, due", &UnknownOutcomeError{Key: "k", Status: StatusUnknown, Due: now.Add(-time.Second)}, JobRetry, false},
		{"unknown, in review", &UnknownOutcomeError{Key: "k", Status: StatusReview}, JobDrop, false},
		{"review", &ReviewError{Key: "k"}, JobDrop, false},
		{"not recorded", &RecordError{Key: "k", Outcome: StatusSucceeded, Err: errors.New("connection refused")}, JobRetry, false},
		{"result too large", fmt.Errorf("once: action k: %w; it was put up for review", ErrResultTooLarge), JobDrop, false},
		{"result not JSON", fmt.Errorf("once: action k: %w; it was put up for review", ErrResultNotJSON), JobDrop, false},
		{"payload changed", &FingerprintError{Key: "k"}, JobDrop, false},
		{"invalid intent", &IntentError{Field: "Run", Reason: "is empty"}, JobDrop, false},
		{"database unreachable", fmt.Errorf("once: claiming action k: %w", errors.New("dial tcp: connection refused")), JobRetry, false},
		{"caller gave up", context.Canceled, JobRetry, false},
		{"joined: failed and released", errors.Join(&FailedError{Key: "a"}, fmt.Errorf("once: action b attempt 1 released: %w", RetryLater(errors.New("429")))), JobRetry, false},
		{"joined: done and in review", fmt.Errorf("job 1: %w", errors.Join(nil, &ReviewError{Key: "b"})), JobDrop, false},
		{"joined: failed and in review", errors.Join(&FailedError{Key: "a"}, &ReviewError{Key: "b"}), JobDrop, false},
		{"joined: both failed", errors.Join(&FailedError{Key: "a"}, &FailedError{Key: "b"}), JobAck, false},
		{"joined: in flight and released", fmt.Errorf("%w; %w", &InFlightError{Key: "a", LeaseUntil: now.Add(time.Minute)}, RetryLater(nil)), JobRetry, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Dispose(tt.err)
			if d.Action != tt.want || (d.After > 0) != tt.after || d.Reason == "" {
				t.Fatalf("Dispose(%v) = %v after %v (%q); want %v, wait %v", tt.err, d.Action, d.After, d.Reason, tt.want, tt.after)
			}
		})
	}
}

// An action awaiting its verifier must send the job back: it matches
// ErrRetryLater, as a released one does.
func TestUnknownAwaitingVerifierIsRetryLater(t *testing.T) {
	for _, st := range []Status{StatusUnknown, StatusReleased} {
		if err := (&UnknownOutcomeError{Status: st}); !errors.Is(err, ErrRetryLater) {
			t.Errorf("unknown outcome in %s does not match ErrRetryLater", st)
		}
	}
	if errors.Is(&UnknownOutcomeError{Status: StatusReview}, ErrRetryLater) {
		t.Error("an action in review matches ErrRetryLater")
	}
}
