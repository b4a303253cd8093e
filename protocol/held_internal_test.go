package protocol

import (
	"fmt"
	"testing"

	"github.com/oncehq/once"
)

// TestHeldIsBounded: past MaxHeldClaims attempts, or MaxHeldBytes of
// their payloads, the oldest are let go; an attempt is found only with
// its own token.
func TestHeldIsBounded(t *testing.T) {
	var h held
	for i := range MaxHeldClaims + 10 {
		h.hold(&once.Attempt{Key: once.Key(fmt.Sprint("k", i)), Number: 1, Token: fmt.Sprint("t", i)}, 0)
	}
	if len(h.m) != MaxHeldClaims || len(h.order)-h.head != MaxHeldClaims {
		t.Fatalf("held %d (%d in order); want %d", len(h.m), len(h.order)-h.head, MaxHeldClaims)
	}
	if h.attempt(AttemptRef{Key: "k0", Attempt: 1, Token: "t0"}) != nil {
		t.Fatal("the oldest attempt is still held")
	}
	last := fmt.Sprint(MaxHeldClaims + 9)
	if h.attempt(AttemptRef{Key: "k" + last, Attempt: 1, Token: "t" + last}) == nil {
		t.Fatal("the newest attempt is not held")
	}
	if h.attempt(AttemptRef{Key: "k" + last, Attempt: 1, Token: "t0"}) != nil {
		t.Fatal("an attempt was found with another's token")
	}
	for i := range 20 {
		h.hold(&once.Attempt{Key: once.Key(fmt.Sprint("big", i)), Number: 1, Token: "x"}, MaxHeldBytes/8)
	}
	if h.bytes > MaxHeldBytes {
		t.Fatalf("held %d bytes; at most %d", h.bytes, MaxHeldBytes)
	}
	h.hold(&once.Attempt{Key: "huge", Number: 1, Token: "x"}, MaxHeldBytes)
	if h.attempt(AttemptRef{Key: "huge", Attempt: 1, Token: "x"}) != nil {
		t.Fatal("an attempt larger than the whole bound was held")
	}
}
