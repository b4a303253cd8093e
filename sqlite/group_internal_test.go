package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/oncehq/once"
)

// TestGroupCommitLeaderLeavesATransactionWithoutItsWrite: a writer that
// has the turn leads a transaction of the writes queued first, which
// may leave its own out (a write queued before it fills the
// transaction: a large one, or 128). It ran that transaction before it
// went back to wait for its own turn, held past its deadline by others'
// writes, when without group commit it would have left at it. The
// transaction now runs on without it, and it leaves at its deadline,
// unwritten.
//
// The queue is built by hand: the large write H is queued as grouped
// queues it, and its writer has not yet come to wait for the turn, so
// the writer S, which has, leads.
func TestGroupCommitLeaderLeavesATransactionWithoutItsWrite(t *testing.T) {
	ctx := context.Background()
	s := migrated(t)
	claim := func(key string) once.ClaimRequest {
		return once.ClaimRequest{Key: once.Key(key), Fingerprint: once.Fingerprint("fp-" + key), Kind: "k", Lease: time.Minute, Token: "t"}
	}
	// H's transaction waits until S has its answer, or gives up.
	sAnswered := make(chan struct{})
	s.group.beforeBatch = func(int) {
		select {
		case <-sAnswered:
		case <-time.After(5 * time.Second):
		}
	}
	s.writer <- struct{}{} // a write in progress
	h := &groupWrite{size: 2 * maxGroupBytes, done: make(chan struct{}), fn: func(ctx context.Context, w *Store) error {
		req := claim("H")
		return w.queryRow(ctx, stClaim, func(r *sql.Rows) error { return nil },
			string(req.Key), string(req.Fingerprint), req.Run, req.Step, req.Kind, req.Target, nullBytes(req.Payload), leaseMS(req.Lease), req.Token,
			"", nil, nil, false, "", 0, "")
	}}
	s.group.mu.Lock()
	s.group.queue = append(s.group.queue, h)
	s.group.mu.Unlock()
	sErr := make(chan error, 1)
	go func() {
		dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		_, err := s.Claim(dctx, claim("S"))
		sErr <- err
	}()
	for s.waiting.Load() != 1 {
		time.Sleep(time.Millisecond)
	}
	<-s.writer // the write in progress ends: S has the turn, and leads [H]
	select {
	case err := <-sErr:
		close(sAnswered)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("S = %v, want its deadline", err)
		}
	case <-time.After(3 * time.Second):
		close(sAnswered)
		t.Fatalf("S, its write not taken, was not answered while a transaction of others' writes ran: %v", <-sErr)
	}
	<-h.done
	if h.err != nil {
		t.Errorf("H = %v", h.err)
	}
	if _, err := s.Get(ctx, "S"); !errors.Is(err, once.ErrNotFound) {
		t.Errorf("S: %v, want not stored", err)
	}
	if a, err := s.Get(ctx, "H"); err != nil || a.Status != once.StatusInFlight {
		t.Errorf("H: %s, %v; want in flight", a.Status, err)
	}
}
