package sqlite

import (
	"context"
	"time"
)

// MigrateTo runs the migrations up to version and no further, to make a
// file as an older build left it.
func MigrateTo(ctx context.Context, s *Store, version int) error {
	ms, err := s.Migrations()
	if err != nil {
		return err
	}
	return s.inWriteTx(ctx, func(tx *Store) error {
		_, err := s.apply(ctx, tx.db, ms[:version])
		return err
	})
}

// SetBeforeBatch sets the hook group commit runs with the size of each
// transaction it takes.
func SetBeforeBatch(s *Store, f func(n int)) { s.group.beforeBatch = f }

// QueuedWrites counts the writes waiting for group commit's next
// transaction.
func QueuedWrites(s *Store) int {
	s.group.mu.Lock()
	defer s.group.mu.Unlock()
	return len(s.group.queue)
}

// HoldTurn takes the store's turn to write, as a write in progress
// would, until the returned func is called.
func HoldTurn(s *Store) (release func()) {
	s.writer <- struct{}{}
	return s.release
}

// SetStatsEvery sets how old a large log's count of its finished
// actions may grow.
func SetStatsEvery(s *Store, every func(time.Duration) time.Duration) { s.counts.Every = every }

// SetStatsLive sets how many finished actions a log counted whole at
// every call may hold.
func SetStatsLive(s *Store, n int64) { s.counts.Live = n }
