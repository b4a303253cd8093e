package once_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/oncehq/once"
)

// An effect that runs outside Do: the caller claims the action, keeps
// the claim with a heartbeat while the effect runs, and settles it. A
// second delivery gets the stored result back without a claim.
func ExampleClient_Claim() {
	c, done := client()
	defer done()
	ctx := context.Background()
	charge := once.Intent{Run: "order-77", Kind: "charge_card", Target: "cus_42", Payload: map[string]int{"cents": 1999}}

	a, err := c.Claim(ctx, charge)
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	fmt.Println("claimed attempt", a.Number)
	// The effect runs here, elsewhere if need be, and stops by
	// a.Deadline() unless a heartbeat renews the claim.
	if err := a.Heartbeat(ctx); err != nil {
		fmt.Println("stop:", err)
		return
	}
	if err := a.Succeed(ctx, "ch_0001"); err != nil {
		fmt.Println("error:", err)
		return
	}

	_, err = c.Claim(ctx, charge)
	var replayed *once.ReplayedError
	if errors.As(err, &replayed) {
		var id string
		_ = replayed.Decode(&id)
		fmt.Println("second delivery replayed:", id)
	}
	// Output:
	// claimed attempt 1
	// second delivery replayed: ch_0001
}

// A server claims for a remote worker in one request and settles the
// attempt in a later one, from the key, number and token it handed out.
// Settling again, after a reply was lost, gives the same answer.
func ExampleClient_Attempt() {
	c, done := client()
	defer done()
	ctx := context.Background()
	post := once.Intent{Run: "thread-9", Kind: "post_message", Target: "#ops", Payload: "deploy done"}

	// The first request: claim, and hand the worker what names it.
	a, err := c.Claim(ctx, post)
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	key, number, token := a.Key, a.Number, a.Token

	// A later request, perhaps in another process: rebuild and settle.
	for try := 1; try <= 2; try++ {
		held, err := c.Attempt(ctx, key, number, token)
		if err != nil {
			fmt.Println("error:", err)
			return
		}
		fmt.Printf("try %d: %v\n", try, held.Succeed(ctx, map[string]string{"ts": "1700000000.42"}))
	}
	res, err := once.Do(ctx, c, post, func(context.Context, once.Attempt) (map[string]string, error) {
		return nil, errors.New("not run")
	})
	fmt.Println(res.Value["ts"], res.Replayed, err)
	// Output:
	// try 1: <nil>
	// try 2: <nil>
	// 1700000000.42 true <nil>
}
