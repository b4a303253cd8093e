package storetest

import (
	"context"
	"errors"
	"testing"

	"github.com/oncehq/once"
)

// edgeTests are the partial-failure edges: late outcomes, lost replies,
// hung connections.
func edgeTests() []namedTest {
	return []namedTest{
		{"LateSuccessAfterRelease", testLateSuccessAfterRelease},
		{"LateSuccessAfterPersonRetry", testLateSuccessAfterPersonRetry},
		{"LateSuccessAfterAbandon", testLateSuccessAfterAbandon},
	}
}

// lateSuccess checks what every late-success case must end with: the
// worker's outcome recorded for attempt 1, its result replayed to the
// next delivery without running the effect, and the trail showing both
// the decision and the late outcome.
func lateSuccess(t *testing.T, s once.Store, c *once.Client, resume func() string, wantTrail string) {
	t.Helper()
	if out := resume(); out != "executed" {
		t.Fatalf("the slow worker said %q, want its completion recorded", out)
	}
	a := mustGet(t, s, processKey())
	if a.Status != once.StatusSucceeded || a.Attempt != 1 {
		t.Fatalf("stored %s attempt %d; the outcome became known and must be recorded", a.Status, a.Attempt)
	}
	res, err := once.Do(ctx(t), c, processIntent, func(context.Context, once.Attempt) (int, error) {
		t.Error("the next delivery ran the effect again")
		return 0, nil
	})
	if err != nil || !res.Replayed || res.Attempt != 1 {
		t.Fatalf("next delivery = %+v, %v; want attempt 1 replayed", res, err)
	}
	if got := trail(t, s, a.Key); got != wantTrail {
		t.Fatalf("trail %s, want %s", got, wantTrail)
	}
}

// Recovery released the claim (its worker looked dead); the worker then
// reports success before anyone claimed again.
func testLateSuccessAfterRelease(t *testing.T, h Harness) {
	s, c, spec := setup(t, h, policyConfig(once.KindPolicy{Recovery: once.RetryWithProviderKey}))
	_, resume := zombie(t, s, spec)
	r, err := once.NewReaper(c, once.ReaperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := r.RunOnce(ctx(t)); err != nil || rep.Released != 1 {
		t.Fatalf("reaper = %+v, %v; want the dead claim released", rep, err)
	}
	lateSuccess(t, s, c, resume, "claimed,released,succeeded")
}

// A person chose Retry on the review item; the worker then reports.
func testLateSuccessAfterPersonRetry(t *testing.T, h Harness) {
	s, c, spec := setup(t, h, policyConfig(once.KindPolicy{Recovery: once.AskPerson}))
	_, resume := zombie(t, s, spec)
	if _, err := once.Do(ctx(t), c, processIntent, func(context.Context, once.Attempt) (int, error) { return 0, nil }); !errors.Is(err, once.ErrReview) {
		t.Fatalf("redelivery = %v, want review", err)
	}
	if _, err := c.Resolve(ctx(t), processKey(), once.Resolution{Decision: once.DecisionRetry, By: "ada", Note: "no trace in the mail log"}); err != nil {
		t.Fatal(err)
	}
	lateSuccess(t, s, c, resume, "claimed,review,resolved,succeeded")
}

// A person abandoned the action; the worker then reports that it did
// happen after all.
func testLateSuccessAfterAbandon(t *testing.T, h Harness) {
	s, c, spec := setup(t, h, policyConfig(once.KindPolicy{Recovery: once.AskPerson}))
	_, resume := zombie(t, s, spec)
	if _, err := once.Do(ctx(t), c, processIntent, func(context.Context, once.Attempt) (int, error) { return 0, nil }); !errors.Is(err, once.ErrReview) {
		t.Fatalf("redelivery = %v, want review", err)
	}
	if _, err := c.Resolve(ctx(t), processKey(), once.Resolution{Decision: once.DecisionAbandon, By: "ada", Note: "customer cancelled"}); err != nil {
		t.Fatal(err)
	}
	lateSuccess(t, s, c, resume, "claimed,review,resolved,succeeded")
}
