// Package storekit is for writing a once store: the parts of a store
// that are not its SQL dialect or its driver, shared by the postgres and
// sqlite stores so that a store written outside this module behaves as
// they do.
//
// A store implements once.Store, and once.Migrator so that the command
// can check and migrate its schema; once.Waiter and once.TxBinder are
// optional. It carries out what the engine asks and decides nothing:
// every rule about statuses, fencing and recovery lives in package once,
// and a store passes storetest.RunStore and storetest.RunClient. What
// this package holds, by the part of the contract it serves:
//
//   - Migrations: numbered SQL files rendered for a schema and a table
//     prefix (LoadMigrations, Names), applied under the store's own lock
//     (ApplyMigrations, MigrationTx), and the versions a build accepts
//     (CheckVersions). Names a user gives are checked with CheckIdent.
//   - Rows: Collect and the scanners for the columns every store reads
//     (ScanEvent, ScanStatusCount), over the Rows that pgx.Rows and
//     *sql.Rows both are.
//   - Lists: the WHERE, ORDER BY and LIMIT of Store.List and Store.Count
//     (ListClause, CountClause), written in a store's Dialect.
//   - The trail: a store leaves the happy path's events unwritten (a
//     first claim, and the worker's outcome of attempt 1, which the row
//     itself tells), so that a plain action costs one row. EventToWrite
//     says which events to write, and WithHappyPath and Page put the
//     others back for the trail's readers.
//   - Stats: Counts answers Store.Stats on a log of any size, counting
//     the finished actions of a large log in the background.
//   - Queries: LoadQueries reads a store's statements from an embedded
//     file of named SQL, so they read as SQL, not as Go strings.
//   - Values as the schemas keep them: RecoveryText, KindHolds.
//
// A store stores what it is handed and selects what it is told: a
// recovery mode is data to it (once.Verifiable.Recoveries says which
// recorded modes only a process holding the kind may take), never a
// name in its SQL.
package storekit
