package once_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oncehq/once"
)

var sentinels = map[string]error{
	"ErrInvalidIntent":       once.ErrInvalidIntent,
	"ErrInFlight":            once.ErrInFlight,
	"ErrFingerprintMismatch": once.ErrFingerprintMismatch,
	"ErrFailed":              once.ErrFailed,
	"ErrOutcomeUnknown":      once.ErrOutcomeUnknown,
	"ErrReview":              once.ErrReview,
	"ErrFenced":              once.ErrFenced,
	"ErrNotRecorded":         once.ErrNotRecorded,
	"ErrRetryLater":          once.ErrRetryLater,
	"ErrResultTooLarge":      once.ErrResultTooLarge,
	"ErrResultNotJSON":       once.ErrResultNotJSON,
	"ErrPermanent":           once.ErrPermanent,
	"ErrNotFound":            once.ErrNotFound,
	"ErrConflict":            once.ErrConflict,
	"ErrInvalidResolution":   once.ErrInvalidResolution,
}

// Each error matches exactly its sentinels with errors.Is, and its
// message names the action and says what to do next. The errors come
// from Do where a call makes them, and are built by hand for the details
// a call cannot pin down.
func TestErrorsIsAs(t *testing.T) {
	c, _ := newClient(t, once.Config{MaxResultBytes: 64})
	ctx := context.Background()
	cause := errors.New("the cause")
	step := int64(0)
	do := func(fn func(context.Context, once.Attempt) (any, error)) error {
		step++
		_, err := once.Do(ctx, c, once.Intent{Run: "errors", Step: step, Kind: "k"}, fn)
		return err
	}
	// A stored failure, replayed.
	failedOnce := once.Intent{Run: "errors", Step: 100, Kind: "k"}
	once.Do(ctx, c, failedOnce, func(context.Context, once.Attempt) (int, error) { return 0, once.Permanent(cause) })
	_, replayedFailure := once.Do(ctx, c, failedOnce, func(context.Context, once.Attempt) (int, error) { return 0, nil })
	_, notFound := c.Get(ctx, mustKey(t, failedOnce)+"0")
	_, badIntent := once.Do(ctx, c, once.Intent{Kind: "k"}, func(context.Context, once.Attempt) (int, error) { return 0, nil })
	key := mustKey(t, failedOnce)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

	for _, c := range []struct {
		name  string
		err   error
		is    []string
		cause bool     // also matches the effect's own error
		says  []string // the message contains each
	}{
		{"Do: RetryLater", do(func(context.Context, once.Attempt) (any, error) { return nil, once.RetryLater(cause) }), []string{"ErrRetryLater"}, true, []string{"released", "the cause"}},
		{"Do: Permanent", do(func(context.Context, once.Attempt) (any, error) { return nil, once.Permanent(cause) }), []string{"ErrFailed", "ErrPermanent"}, true, []string{"failed permanently (attempt 1): the cause"}},
		{"Do: replayed failure", replayedFailure, []string{"ErrFailed"}, false, []string{"failed permanently", "the cause"}},
		{"Do: unknown", do(func(context.Context, once.Attempt) (any, error) { return nil, cause }), []string{"ErrOutcomeUnknown", "ErrReview"}, true, []string{"put up for review", "the cause"}},
		{"Do: result too large", do(func(context.Context, once.Attempt) (any, error) { return strings.Repeat("x", 100), nil }), []string{"ErrResultTooLarge"}, false, []string{"MaxResultBytes (64)", "put up for review"}},
		{"Do: result not JSON", do(func(context.Context, once.Attempt) (any, error) { return func() {}, nil }), []string{"ErrResultNotJSON"}, false, []string{"put up for review"}},
		{"Do: bad intent", badIntent, []string{"ErrInvalidIntent"}, false, []string{"Run is empty"}},
		{"Get: not found", notFound, []string{"ErrNotFound"}, false, nil},
		{"RetryLater", once.RetryLater(cause), []string{"ErrRetryLater"}, true, []string{"retry later: the cause"}},
		{"RetryLater(nil)", once.RetryLater(nil), []string{"ErrRetryLater"}, false, []string{"retry later"}},
		{"Permanent", once.Permanent(cause), []string{"ErrPermanent"}, true, []string{"the cause"}},
		{"Permanent(nil)", once.Permanent(nil), []string{"ErrPermanent"}, false, []string{"permanent failure"}},
		{"IntentError", &once.IntentError{Field: "Target", Reason: "is too long"}, []string{"ErrInvalidIntent"}, false, []string{"invalid intent: Target is too long"}},
		{"InFlightError", &once.InFlightError{Key: key, Attempt: 2, ClaimedAt: at, LeaseUntil: at.Add(time.Minute)}, []string{"ErrInFlight"}, false,
			[]string{string(key), "attempt 2", "lease held until 2026-01-02T03:05:05Z", "return the job to its queue"}},
		{"InFlightError expired", &once.InFlightError{Key: key, Attempt: 2, ClaimedAt: at, LeaseUntil: at, Expired: true}, []string{"ErrInFlight"}, false,
			[]string{"lease expired at 2026-01-02T03:04:05Z; awaiting recovery"}},
		{"FingerprintError", &once.FingerprintError{Key: key, Stored: "aaaaaaaaaaaaaaaa", Got: "bbbbbbbbbbbbbbbb"}, []string{"ErrFingerprintMismatch"}, false,
			[]string{string(key), "aaaaaaaaaaaa…", "bbbbbbbbbbbb…", "not executed", "PayloadInKey"}},
		{"FailedError", &once.FailedError{Key: key, Attempt: 3, Message: "declined"}, []string{"ErrFailed"}, false, []string{"failed permanently (attempt 3): declined"}},
		{"UnknownOutcomeError awaiting verification", &once.UnknownOutcomeError{Key: key, Attempt: 1, Message: "EOF", Status: once.StatusUnknown}, []string{"ErrOutcomeUnknown", "ErrRetryLater"}, false,
			[]string{"outcome unknown (attempt 1): EOF", "its kind's recovery decides"}},
		{"UnknownOutcomeError released", &once.UnknownOutcomeError{Key: key, Attempt: 1, Message: "EOF", Status: once.StatusReleased}, []string{"ErrOutcomeUnknown", "ErrRetryLater"}, false,
			[]string{"return the job to its queue", "same provider key"}},
		{"UnknownOutcomeError review", &once.UnknownOutcomeError{Key: key, Attempt: 1, Message: "EOF", Status: once.StatusReview}, []string{"ErrOutcomeUnknown", "ErrReview"}, false,
			[]string{"put up for review and will not be re-executed"}},
		{"ReviewError", &once.ReviewError{Key: key, Attempt: 1, Reason: "lease expired"}, []string{"ErrReview"}, false, []string{"awaits review (attempt 1): lease expired"}},
		{"FencedError", &once.FencedError{Key: key, Attempt: 1, Outcome: once.StatusSucceeded}, []string{"ErrFenced"}, false, []string{"attempt 1", "superseded", "(succeeded) was not recorded"}},
		{"FencedError unrun", &once.FencedError{Key: key, Attempt: 2, Outcome: once.StatusReleased, Unrun: true}, []string{"ErrFenced"}, false, []string{"attempt 2", "superseded before its effect ran", "nothing ran", "(released)"}},
		{"RecordError", &once.RecordError{Key: key, Attempt: 1, Outcome: once.StatusSucceeded, Err: cause}, []string{"ErrNotRecorded"}, true,
			[]string{"ended succeeded but it could not be recorded: the cause", "recovery applies when its lease expires"}},
		{"ConflictError", &once.ConflictError{Op: "resolve done", Current: once.Action{Key: key, Status: once.StatusReleased, Attempt: 2}}, []string{"ErrConflict"}, false,
			[]string{"resolve done refused", "now released (attempt 2)", "reload it and decide again"}},
		{"ConflictError succeeded", &once.ConflictError{Op: "resolve retry", Current: once.Action{Key: key, Status: once.StatusSucceeded, Attempt: 2}}, []string{"ErrConflict"}, false,
			[]string{"resolve retry refused", "succeeded (attempt 2); there is nothing to resolve"}},
		{"ResolutionError", &once.ResolutionError{Field: "Note", Reason: "is empty"}, []string{"ErrInvalidResolution"}, false, []string{"invalid decision: Note is empty"}},
	} {
		if c.err == nil {
			t.Errorf("%s: no error", c.name)
			continue
		}
		for name, s := range sentinels {
			if want := slices.Contains(c.is, name); errors.Is(c.err, s) != want {
				t.Errorf("%s: errors.Is(%v, %s) = %v, want %v", c.name, c.err, name, !want, want)
			}
		}
		if errors.Is(c.err, cause) != c.cause {
			t.Errorf("%s: errors.Is(err, cause) = %v, want %v", c.name, !c.cause, c.cause)
		}
		for _, s := range c.says {
			if !strings.Contains(c.err.Error(), s) {
				t.Errorf("%s: message %q does not say %q", c.name, c.err, s)
			}
		}
	}
}

// The typed errors Do returns carry their detail for errors.As.
func TestErrorsAs(t *testing.T) {
	c, s := newClient(t, once.Config{})
	ctx := context.Background()
	in := once.Intent{Run: "as", Kind: "k", Payload: "a"}
	k := mustKey(t, in)
	once.Do(ctx, c, in, func(context.Context, once.Attempt) (int, error) { return 0, once.Permanent(errors.New("declined")) })
	_, err := once.Do(ctx, c, in, func(context.Context, once.Attempt) (int, error) { return 0, nil })
	var fe *once.FailedError
	if !errors.As(err, &fe) || fe.Key != k || fe.Attempt != 1 || fe.Message != "declined" || !fe.Replayed {
		t.Fatalf("FailedError = %+v", fe)
	}
	in.Payload = "b"
	_, err = once.Do(ctx, c, in, func(context.Context, once.Attempt) (int, error) { return 0, nil })
	var fpe *once.FingerprintError
	if !errors.As(err, &fpe) || fpe.Key != k || fpe.Stored == fpe.Got || len(fpe.Got) != 64 {
		t.Fatalf("FingerprintError = %+v", fpe)
	}
	lost := once.Intent{Run: "as", Step: 1, Kind: "k"}
	_, err = once.Do(ctx, c, lost, func(context.Context, once.Attempt) (int, error) { return 0, errors.New("EOF") })
	var ue *once.UnknownOutcomeError
	if !errors.As(err, &ue) || ue.Key != mustKey(t, lost) || ue.Status != once.StatusReview || ue.Message != "EOF" {
		t.Fatalf("UnknownOutcomeError = %+v", ue)
	}
	_, err = once.Do(ctx, c, lost, func(context.Context, once.Attempt) (int, error) { return 0, nil })
	var re *once.ReviewError
	if !errors.As(err, &re) || re.Key != mustKey(t, lost) || re.Reason != "EOF" {
		t.Fatalf("ReviewError = %+v", re)
	}
	_, err = c.Resolve(ctx, k, once.Resolution{Decision: once.DecisionRetry, By: "ada", Note: ""})
	var rse *once.ResolutionError
	if !errors.As(err, &rse) || rse.Field != "Note" {
		t.Fatalf("ResolutionError = %+v (%v)", rse, err)
	}
	_, err = c.Resolve(ctx, mustKey(t, lost), once.Resolution{Decision: once.DecisionDone, By: "ada", Note: "sent"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Resolve(ctx, mustKey(t, lost), once.Resolution{Decision: once.DecisionAbandon, By: "grace", Note: "stop"})
	var ce *once.ConflictError
	if !errors.As(err, &ce) || ce.Current.Status != once.StatusSucceeded || ce.Current.ResolvedBy != "ada" {
		t.Fatalf("ConflictError = %+v (%v)", ce, err)
	}
	// The refused decision stands in the trail beside the one that won.
	evs, _ := s.Events(ctx, mustKey(t, lost))
	if last := evs[len(evs)-1]; last.Type != once.EventRefused || last.Actor != "grace" || !strings.Contains(last.Note, "abandon refused") {
		t.Fatalf("last event %+v", last)
	}
}
