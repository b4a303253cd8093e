package sqlite

import "context"

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
