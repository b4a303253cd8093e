package riverjob_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/riverqueue/river"

	"github.com/oncehq/once"
	"github.com/oncehq/once/riverjob"
)

func TestDisposeMapsOntoRiver(t *testing.T) {
	plain := errors.New("connection refused")
	lease := time.Now().Add(time.Minute)
	type want int
	const (
		complete want = iota
		cancel
		snooze
		retry
	)
	for _, tc := range []struct {
		name string
		err  error
		want want
	}{
		{"done", nil, complete},
		{"failed for good", &once.FailedError{Key: "k", Attempt: 1, Message: "declined"}, cancel},
		{"replayed failure, wrapped", fmt.Errorf("charging: %w", &once.FailedError{Key: "k", Replayed: true}), cancel},
		{"permanent inside DoTx", fmt.Errorf("once: action k: the effect failed inside the transaction, roll it back: %w", once.Permanent(plain)), cancel},
		{"superseded after success", &once.FencedError{Key: "k", Attempt: 1, Outcome: once.StatusSucceeded}, complete},
		{"superseded after failure", &once.FencedError{Key: "k", Attempt: 1, Outcome: once.StatusFailed}, cancel},
		{"superseded unknown", &once.FencedError{Key: "k", Attempt: 1, Outcome: once.StatusInFlight}, retry},
		{"in flight", &once.InFlightError{Key: "k", Attempt: 1, LeaseUntil: lease}, snooze},
		{"in flight, lease lapsed", &once.InFlightError{Key: "k", Attempt: 1, LeaseUntil: time.Now().Add(-time.Second), Expired: true}, snooze},
		{"in a transaction", &once.InFlightError{Key: "k", InTransaction: true}, snooze},
		{"released", &once.UnknownOutcomeError{Key: "k", Status: once.StatusReleased}, retry},
		{"awaiting verifier", &once.UnknownOutcomeError{Key: "k", Status: once.StatusUnknown, Due: lease}, snooze},
		{"unknown, in review", &once.UnknownOutcomeError{Key: "k", Status: once.StatusReview}, cancel},
		{"review", &once.ReviewError{Key: "k"}, cancel},
		{"retry later", once.RetryLater(plain), retry},
		{"not recorded", &once.RecordError{Key: "k", Err: plain}, retry},
		{"changed payload", &once.FingerprintError{Key: "k"}, cancel},
		{"invalid intent", &once.IntentError{Field: "Run", Reason: "is empty"}, cancel},
		{"database down", plain, retry},
		{"awaiting approval", &once.AwaitingApprovalError{Key: "k", Attempt: 1, Expires: time.Now().Add(time.Hour)}, snooze},
		{"awaiting approval, expiring", &once.AwaitingApprovalError{Key: "k", Attempt: 1, Expires: time.Now().Add(10 * time.Second)}, snooze},
		{"awaiting approval, re-driven once approved", &once.AwaitingApprovalError{Key: "k", Attempt: 1, Expires: lease, Redrive: true}, cancel},
		{"awaiting approval, expired", &once.AwaitingApprovalError{Key: "k", Attempt: 1, Expires: time.Now().Add(-time.Second), Expired: true}, cancel},
		{"rejected", &once.FailedError{Key: "k", Attempt: 1, Message: "rejected by ada: over budget", Replayed: true}, cancel},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := riverjob.Dispose(tc.err)
			var (
				cancelled *river.JobCancelError
				snoozed   *river.JobSnoozeError
			)
			switch tc.want {
			case complete:
				if got != nil {
					t.Fatalf("Dispose = %v; want nil (completed)", got)
				}
			case cancel:
				if !errors.As(got, &cancelled) || !errors.Is(got, tc.err) {
					t.Fatalf("Dispose = %#v; want river.JobCancel wrapping the error", got)
				}
			case snooze:
				if !errors.As(got, &snoozed) || snoozed.Duration <= 0 || snoozed.Duration > time.Minute {
					t.Fatalf("Dispose = %#v; want river.JobSnooze for up to a minute", got)
				}
			case retry:
				if got != tc.err {
					t.Fatalf("Dispose = %#v; want the error itself, for River's retry", got)
				}
			}
		})
	}
}
