package cli_test

import (
	"net/http"
	"testing"
)

// TestGuesserBesideTheOperatorLeavesItsConnection: a guesser on the
// operator's address (any local process, for a console on loopback)
// spends the address's attempts, and every new token from it gets 429;
// but a connection that has already shown the right token is answered
// still: a guesser holds no such connection, so it learns nothing.
// Before, the operator's own keep-alive connection got 429 too.
func TestGuesserBesideTheOperatorLeavesItsConnection(t *testing.T) {
	const token = "the-operators-token"
	base, _, _ := servingWithToken(t, token)
	op := &http.Client{Transport: &http.Transport{}}
	get := func(c *http.Client, tok string) int {
		t.Helper()
		code, err := statsWithToken(c, base, tok)
		if err != nil {
			t.Fatal(err)
		}
		return code
	}
	if got := get(op, token); got != 200 {
		t.Fatalf("operator: %d", got)
	}
	for range 11 {
		get(&http.Client{Transport: &http.Transport{}}, "wrong")
	}
	if got := get(&http.Client{Transport: &http.Transport{}}, "wrong"); got != http.StatusTooManyRequests {
		t.Fatalf("a twelfth wrong token from the address: %d, want 429", got)
	}
	if got := get(op, token); got != 200 {
		t.Fatalf("the operator, on its authorized keep-alive connection, after another local process sent 11 wrong tokens: %d", got)
	}
}
