package bench

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Full-page images.
//
// The first change to a page after a checkpoint writes the whole page
// to the WAL, 8 kB less its hole, whatever the change. Which arm pays
// for that depends on when the checkpoint falls: the arm running then
// writes a full-page image of each page it touches first, and the arms
// after it write none for those pages. An arm's WAL per action
// therefore says as much about the checkpoint's timing as about its own
// writes. PostgreSQL's pg_walinspect extension reads the WAL back and
// tells the images apart from the records, so a report can give both:
// the WAL, and how much of it was full-page images.
//
// The run installs pg_walinspect into its own schema, which it drops at
// the end, taking the extension with it; where the extension is already
// installed it uses it as it is. Without it (a role that may not
// install extensions or read the WAL, a server without the contrib
// modules), a report gives the WAL alone.

// findWALInspect sets r.walStats to the qualified name of
// pg_walinspect's pg_get_wal_stats, installing the extension into the
// run's schema if no schema has it; it leaves it empty, and says why in
// r.walStatsNote, when the extension cannot be had.
func (r *runner) findWALInspect(ctx context.Context) {
	schema, err := r.walInspectSchema(ctx)
	if err == nil && schema == "" {
		_, err = r.pool.Exec(ctx, `CREATE EXTENSION pg_walinspect SCHEMA `+pgx.Identifier{r.schema}.Sanitize())
		if err == nil {
			schema = r.schema
		} else if s, again := r.walInspectSchema(ctx); again == nil && s != "" {
			// Another run installed it meanwhile.
			schema, err = s, nil
		}
	}
	if err != nil {
		r.walStatsNote = fmt.Sprintf("full-page images are not told apart: pg_walinspect: %v", err)
		return
	}
	r.walStats = pgx.Identifier{schema, "pg_get_wal_stats"}.Sanitize()
}

// walInspectSchema returns the schema pg_walinspect is installed in, or
// "" when it is not.
func (r *runner) walInspectSchema(ctx context.Context) (string, error) {
	var schema string
	err := r.pool.QueryRow(ctx, `
SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
WHERE e.extname = 'pg_walinspect'`).Scan(&schema)
	if err == pgx.ErrNoRows {
		return "", nil
	}
	return schema, err
}

// fpiBytes returns the bytes of full-page images in the WAL between the
// positions from and to, and whether it could read them. The WAL is
// read up to where it is flushed, which pg_walinspect requires: an
// arm's synchronous commits have flushed all of its own. An arm that
// wrote nothing (a replay) has none.
func (r *runner) fpiBytes(ctx context.Context, from, to string) (int64, bool) {
	if r.walStats == "" || from == "" || to == "" {
		return 0, false
	}
	var fpi int64
	err := r.pool.QueryRow(ctx, `
SELECT CASE WHEN upto > since THEN (SELECT coalesce(sum(fpi_size), 0)::bigint FROM `+r.walStats+`(since, upto)) ELSE 0 END
FROM (SELECT $1::pg_lsn AS since, least($2::pg_lsn, pg_current_wal_flush_lsn()) AS upto) AS w`, from, to).Scan(&fpi)
	if err != nil {
		// The extension went with another run's schema, say: this
		// sample's images are unknown, and the report leaves them out.
		return 0, false
	}
	return fpi, true
}
