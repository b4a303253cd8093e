package once

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Note records, while the effect runs, what it is about to do: what a
// person would look for if the attempt's outcome became unknown (an
// email's Message-ID, a provider's request id). The note is the
// in-flight action's Error, which once show, the console and the API
// show; if the worker dies, recovery gives it with its reason ("its
// lease expired; it had noted: …"), in the review item a person reads.
// The attempt's outcome replaces it, as a later note does; an outcome
// that is unknown (an error that is neither Permanent nor RetryLater, a
// panic) keeps it after its error ("…; it had noted: …").
//
// It costs one write, which renews the claim's lease as a heartbeat
// does; the text is stored as any error is (Storable text, MaxTextBytes).
// It returns an error matching ErrFenced when the attempt no longer
// holds the claim: the effect must not start then. Outside Do (in DoTx,
// whose transaction is the record, or on an Attempt made by hand) it
// does nothing.
func (a Attempt) Note(ctx context.Context, note string) error {
	if a.noter == nil {
		return nil
	}
	return a.noter.note(ctx, note)
}

// withNote is text followed by the note the effect wrote last: what a
// person deciding an unknown outcome looks for. Both ways an attempt's
// outcome becomes unknown (an error or panic, a lapsed lease) write it.
func withNote(text, note string) string { return text + "; it had noted: " + note }

// noter writes an attempt's note: a transition from in flight to in
// flight, fenced by the attempt, that writes no event.
type noter struct {
	c       *Client
	lease   time.Duration // the kind's stored lease, which a note renews
	key     Key
	attempt int

	// last is the last note written, which an unknown outcome keeps
	// beside its error: that is when a person needs it.
	mu   sync.Mutex
	last string
}

// noted returns the last note written, or "".
func (n *noter) noted() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.last
}

func (n *noter) note(ctx context.Context, note string) error {
	t := writeNote.of(Action{Key: n.key, Attempt: n.attempt, Status: StatusInFlight}, ActorWorker)
	t.Lease, t.Error = n.lease, note
	t = storableTransition(t)
	// One call, not read back when its reply is lost: the effect waits
	// on it, and a note that may not have been written costs nothing.
	cctx, cancel := n.c.call(ctx)
	ok, err := n.c.store.Transition(cctx, t)
	cancel()
	switch {
	case err != nil:
		return fmt.Errorf("once: noting attempt %d of action %s: %w", n.attempt, n.key, err)
	case !ok:
		return &FencedError{Key: n.key, Attempt: n.attempt, Outcome: StatusInFlight}
	}
	n.mu.Lock()
	n.last = t.Error
	n.mu.Unlock()
	return nil
}
