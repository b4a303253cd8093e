package postgres

import (
	"context"

	"github.com/oncehq/once"
	"github.com/oncehq/once/storekit"
)

// newCounts returns the counts Stats answers from (storekit.Counts):
// the open statuses through their partial indexes at every call, the
// finished ones counted now and then once the log is large. The stores
// BindTx makes share them, but count within their transaction.
func newCounts(s *Store) *storekit.Counts {
	cells := func(stmt string) func(context.Context) ([]once.StatusCount, error) {
		return func(ctx context.Context) ([]once.StatusCount, error) {
			rows, err := s.db.Query(ctx, stmt)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			return storekit.Collect(rows, storekit.ScanStatusCount)
		}
	}
	return storekit.NewCounts(storekit.StatQueries{
		All:      cells(s.q.stats),
		Open:     cells(s.q.openStats),
		Finished: cells(s.q.finishedStats),
		Estimate: func(ctx context.Context) (rows float64, err error) {
			return rows, s.db.QueryRow(ctx, s.q.estimate).Scan(&rows)
		},
	}, s.log)
}

// Stats implements once.Store. It counts every action while the log
// holds fewer than storekit.LiveRows finished ones; past that, it counts
// the open ones at each call and takes the finished ones from a count
// made now and then, whose cells say when (AsOf).
func (s *Store) Stats(ctx context.Context) ([]once.StatusCount, error) {
	if s.inTx {
		return query(ctx, s, storekit.ScanStatusCount, s.q.stats)
	}
	all, err := s.counts.Stats(ctx)
	return all, s.wrap(err)
}
