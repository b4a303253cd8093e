package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncehq/once/internal/testdb"
)

// fpiRunner returns a runner whose pool is on a database of its own,
// made for the test and dropped after it: pg_walinspect is installed
// once per database, and a bench run elsewhere in the cluster, which
// drops its schema and the extension with it, cannot take this test's
// away.
func fpiRunner(t *testing.T) *runner {
	t.Helper()
	ctx := context.Background()
	url := testdb.RequirePostgres(t)
	admin, err := testdb.RetryTooManyClients(ctx, func() (*pgx.Conn, error) { return pgx.Connect(ctx, url) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(context.Background()) })
	var b [4]byte
	rand.Read(b[:])
	name := "once_bench_fpi_" + hex.EncodeToString(b[:])
	if _, err := admin.Exec(ctx, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := admin.Exec(context.Background(), `DROP DATABASE IF EXISTS `+pgx.Identifier{name}.Sanitize()+` WITH (FORCE)`); err != nil {
			t.Errorf("dropping the test's database %s: %v", name, err)
		}
	})
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.Database = name
	pc.MaxConns = 2
	pool, err := testdb.RetryTooManyClients(ctx, func() (*pgxpool.Pool, error) { return pgxpool.NewWithConfig(ctx, pc) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	r := &runner{pool: pool, schema: "once_bench_fpi"}
	if _, err := pool.Exec(ctx, `CREATE SCHEMA once_bench_fpi`); err != nil {
		t.Fatal(err)
	}
	return r
}

// inspecting is fpiRunner's runner with pg_walinspect found (installed
// into its schema, the run's way).
func inspecting(t *testing.T) *runner {
	t.Helper()
	r := fpiRunner(t)
	r.findWALInspect(context.Background())
	if r.walStats == "" {
		t.Fatalf("no pg_walinspect as the test's superuser: %s", r.walStatsNote)
	}
	return r
}

func (r *runner) lsn(t *testing.T) string {
	t.Helper()
	var lsn string
	if err := r.pool.QueryRow(context.Background(), `SELECT pg_current_wal_insert_lsn()::text`).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	return lsn
}

// TestFPIBytesCountsThePagesACheckpointLeavesToWrite: rows changed after
// a checkpoint write their pages whole, and fpiBytes finds those images
// in the WAL, no more than the WAL itself; a stretch with no WAL has
// none.
func TestFPIBytesCountsThePagesACheckpointLeavesToWrite(t *testing.T) {
	r := inspecting(t)
	ctx := context.Background()
	if _, err := r.pool.Exec(ctx, `CREATE TABLE once_bench_fpi.t AS SELECT g AS id, repeat('x', 100) AS pad FROM generate_series(1, 5000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := r.pool.Exec(ctx, `CHECKPOINT`); err != nil {
		t.Fatal(err)
	}
	from := r.lsn(t)
	if _, err := r.pool.Exec(ctx, `UPDATE once_bench_fpi.t SET pad = repeat('y', 100) WHERE id % 50 = 0`); err != nil {
		t.Fatal(err)
	}
	to := r.lsn(t)
	var wal int64
	if err := r.pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff($2::pg_lsn, $1::pg_lsn)::bigint`, from, to).Scan(&wal); err != nil {
		t.Fatal(err)
	}
	fpi, ok := r.fpiBytes(ctx, from, to)
	// The update touches every page of the table, each first after the
	// checkpoint: at least one image of most of a page each.
	if !ok || fpi < 4096 || fpi > wal {
		t.Errorf("fpiBytes = %d, %v over %d bytes of WAL; want the pages' images, at least 4 kB and no more than the WAL", fpi, ok, wal)
	}
	if fpi, ok := r.fpiBytes(ctx, to, to); !ok || fpi != 0 {
		t.Errorf("fpiBytes over no WAL = %d, %v; want 0, true", fpi, ok)
	}
}

// TestFindWALInspectUsesAnInstalledExtension: a run finds pg_walinspect
// where another installed it, and leaves it there.
func TestFindWALInspectUsesAnInstalledExtension(t *testing.T) {
	r := fpiRunner(t)
	ctx := context.Background()
	if _, err := r.pool.Exec(ctx, `CREATE SCHEMA elsewhere; CREATE EXTENSION pg_walinspect SCHEMA elsewhere`); err != nil {
		t.Fatal(err)
	}
	r.findWALInspect(ctx)
	if want := `"elsewhere"."pg_get_wal_stats"`; r.walStats != want {
		t.Errorf("walStats = %q (%s), want %q", r.walStats, r.walStatsNote, want)
	}
}

// TestFPIBytesWithoutTheExtensionIsUnknown: where the extension went
// away after the run found it, a sample's images are unknown, not zero,
// and the run goes on.
func TestFPIBytesWithoutTheExtensionIsUnknown(t *testing.T) {
	r := inspecting(t)
	ctx := context.Background()
	from := r.lsn(t)
	if _, err := r.pool.Exec(ctx, `DROP EXTENSION pg_walinspect; CREATE TABLE once_bench_fpi.u (x int); INSERT INTO once_bench_fpi.u VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	if fpi, ok := r.fpiBytes(ctx, from, r.lsn(t)); ok {
		t.Errorf("fpiBytes without the extension = %d, %v; want unknown", fpi, ok)
	}
}
