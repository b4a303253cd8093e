package once

import "context"

// Migrator is a Store that tells which schema migrations its database
// records, and which ones a migration ran. The command needs both: it
// refuses a schema a newer build migrated or one whose record has a gap,
// and once migrate says what it applied. Both stores here are; a store
// that is not one works under a Client, and the command refuses it.
type Migrator interface {
	// Versions returns every migration version the schema records, in
	// order; none when the database has no migration table yet.
	Versions(ctx context.Context) ([]int, error)
	// MigrateApplied is Store.Migrate, and returns the migrations this
	// call ran: none when the schema was current or another process ran
	// them first. What ran is known only under the migration lock.
	MigrateApplied(ctx context.Context) ([]Migration, error)
}
