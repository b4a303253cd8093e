package cli_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestGuessLogCountsOnlyWrongTokens: past an address's burst, its
// tokens are answered 429 without being checked, the right one too. The
// log line that counts them must not call them wrong tokens: the
// operator reading "wrong token … failures=2" after its own right token
// was refused would look for a guesser that is not there, or miss one.
// Ten wrong tokens limit the address; then the right token, refused,
// and a guesser's tokens every 2 s, some checked as the bucket refills
// and the rest refused, until the next line a minute on (so the test
// takes a minute).
func TestGuessLogCountsOnlyWrongTokens(t *testing.T) {
	const token = "the-right-token-for-the-log"
	base, _, stderr := servingWithToken(t, token)
	get := func(tok string) int {
		t.Helper()
		c := &http.Client{Transport: &http.Transport{DialContext: dialerFrom("127.0.7.2", 0).DialContext}}
		code, err := statsWithToken(c, base, tok)
		if err != nil {
			t.Fatal(err)
		}
		return code
	}
	for i := range 10 {
		if got := get(fmt.Sprintf("wrong-%d", i)); got != http.StatusUnauthorized {
			t.Fatalf("wrong token %d: %d, want 401", i, got)
		}
	}
	lines := func() []string {
		var out []string
		for _, line := range strings.Split(stderr.String(), "\n") {
			if strings.Contains(line, "remote=127.0.7.2") {
				out = append(out, line)
			}
		}
		return out
	}
	before := len(lines())
	// The right token, refused unchecked; then a guesser's wrong tokens
	// every 2 s, until the next line comes (a minute after the last).
	checked, unchecked := 0, 0
	if got := get(token); got != http.StatusTooManyRequests {
		t.Fatalf("the right token past the burst: %d, want 429", got)
	}
	unchecked++
	for i := 0; len(lines()) == before; i++ {
		if i > 40 {
			t.Fatalf("no log line for the address after %d more tokens:\n%s", i, stderr)
		}
		time.Sleep(2 * time.Second)
		switch got := get(fmt.Sprintf("wrong-more-%d", i)); got {
		case http.StatusUnauthorized:
			checked++
		case http.StatusTooManyRequests:
			unchecked++
		default:
			t.Fatalf("a guess: %d", got)
		}
	}
	last := lines()[before]
	if !strings.Contains(last, fmt.Sprintf("failures=%d ", checked)) || !strings.Contains(last, fmt.Sprintf("unchecked=%d", unchecked)) {
		t.Fatalf("the line for %d wrong tokens checked and %d tokens refused unchecked (the right one among them):\n%s\nwant failures=%d and unchecked=%d: a refused token is not known to be wrong", checked, unchecked, last, checked, unchecked)
	}
}
