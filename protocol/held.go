package protocol

import (
	"crypto/subtle"
	"sync"

	"github.com/oncehq/once"
)

// Bounds of what a server holds of the claims it answered.
const (
	// MaxHeldClaims is how many claimed attempts a server holds.
	MaxHeldClaims = 4096
	// MaxHeldBytes bounds their payloads, as the claims carried them.
	MaxHeldBytes = 16 << 20
)

// held is what a server holds of the attempts it claimed for its
// clients: the *once.Attempt each claim returned, by key and number.
// An outcome naming one of them (with its token) is settled on it, as a
// Go worker settles the attempt it holds. That saves the read that
// rebuilding the attempt costs (a transaction of its own per action),
// and it settles the attempt by the engine's rules for its holder: a
// late success after recovery put the action up for review is recorded,
// where a rebuilt attempt, whose token the decision took off the row,
// could not prove itself (TestLateSuccessAfterReviewIsRecorded).
//
// It is a cache and nothing more: an attempt it does not hold (evicted,
// claimed by another server, or before a restart) is rebuilt from the
// row, with the same fencing by the database. The oldest go first once
// MaxHeldClaims or MaxHeldBytes is reached. An attempt stays held after
// it was settled: an outcome sent again (its reply lost) gets the same
// answer from it.
type held struct {
	mu    sync.Mutex
	m     map[heldRef]*heldClaim
	order []*heldClaim // oldest first, from head
	head  int
	bytes int
}

type heldRef struct {
	key    once.Key
	number int
}

type heldClaim struct {
	ref  heldRef
	a    *once.Attempt
	size int
}

// hold remembers a, whose claim carried size bytes.
func (h *held) hold(a *once.Attempt, size int) {
	size += 256 // the attempt and its entry
	if size > MaxHeldBytes {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = map[heldRef]*heldClaim{}
	}
	ref := heldRef{a.Key, a.Number}
	if c, ok := h.m[ref]; ok {
		// The same claim answered again (its write token sent again):
		// the newer attempt is the one its client holds now. It takes
		// the entry's place, so a claim sent again and again is held
		// once: each resend appended, only the newest counted against
		// the bounds, and every copy's payload was kept
		// (TestReclaimedClaimIsHeldOnce).
		h.bytes += size - c.size
		c.a, c.size = a, size
	} else {
		c := &heldClaim{ref: ref, a: a, size: size}
		h.m[ref] = c
		h.order = append(h.order, c)
		h.bytes += size
	}
	for len(h.m) > MaxHeldClaims || h.bytes > MaxHeldBytes {
		old := h.order[h.head]
		h.order[h.head] = nil
		h.head++
		if h.m[old.ref] == old {
			delete(h.m, old.ref)
			h.bytes -= old.size
		}
	}
	if h.head > len(h.order)/2 {
		h.order = append([]*heldClaim(nil), h.order[h.head:]...)
		h.head = 0
	}
}

// attempt returns the held attempt that ref names, if its token is the
// claim's; nil otherwise.
func (h *held) attempt(ref AttemptRef) *once.Attempt {
	var a *once.Attempt
	h.mu.Lock()
	if c, ok := h.m[heldRef{once.Key(ref.Key), ref.Attempt}]; ok {
		a = c.a // read under the lock: a claim sent again replaces it
	}
	h.mu.Unlock()
	if a == nil || a.Token == "" || subtle.ConstantTimeCompare([]byte(a.Token), []byte(ref.Token)) != 1 {
		return nil
	}
	return a
}
