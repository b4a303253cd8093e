package once_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/oncehq/once"
)

// An effect that panics at every attempt, of a kind that retries with
// the provider's key: each panic released the action for the next
// delivery, and the next delivery, or a re-drive of a job its queue had
// given up on, ran it again, for ever. Its third panicking attempt puts
// it up for review instead: a person decides, and nothing runs it again
// meanwhile.
func TestRepeatedPanicsGoToReview(t *testing.T) {
	ctx := context.Background()
	c, _ := newClient(t, once.Config{Kinds: map[string]once.KindPolicy{"charge_card": {Recovery: once.RetryWithProviderKey}}})
	in := once.Intent{Run: "order-1", Kind: "charge_card", Target: "cus_1"}
	ran := 0
	var last error
	for range 6 {
		func() {
			defer func() {
				if p := recover(); p != nil && !strings.Contains(p.(string), "nil map") {
					panic(p)
				}
			}()
			_, last = once.Do(ctx, c, in, func(context.Context, once.Attempt) (int, error) {
				ran++
				panic("nil map")
			})
		}()
	}
	k, _, _ := once.KeyOf(in)
	a, err := c.Get(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	var review *once.ReviewError
	if ran != 3 || a.Status != once.StatusReview || a.Attempt != 3 || !strings.Contains(a.Error, "panicked") || !errors.As(last, &review) {
		t.Fatalf("the effect ran %d times; the action is %s at attempt %d (%q); the last Do said %v; want 3 runs, then review naming the panics", ran, a.Status, a.Attempt, a.Error, last)
	}
}
