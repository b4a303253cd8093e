package idemhttp

import (
	"net/http"
	"sync/atomic"
)

// releaseKey carries, in the context of the request a handler behind
// the middleware gets, the flag Release sets.
type releaseKey struct{}

// Release tells the middleware that the answer the handler is giving r
// is not final: it goes to this client as it is, but is not stored, and
// the key is released, so the client's retry runs the handler again.
// Outside the middleware it does nothing.
//
// Call it when the handler's answer reports an inner once.Do that has
// not settled: an action in review, in flight, released or awaiting its
// verifier (once.Dispose says JobRetry or JobDrop). The key and the
// inner action are two records. The middleware replays the key's
// stored answer and never asks the inner action again, so a stored 202
// "in review" would be the answer for good, even after a person
// resolves the inner action Done. Released, the retry runs the handler,
// whose inner Do replays what the person decided, and that answer is
// stored.
//
// Only release when everything the handler changed is inside once.Do
// calls of its own (run again, each replays instead of acting), or it
// changed nothing.
func Release(r *http.Request) {
	if flag, ok := r.Context().Value(releaseKey{}).(*atomic.Bool); ok {
		flag.Store(true)
	}
}
