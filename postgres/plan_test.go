package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/oncehq/once/internal/testdb"
)

// Inline recovery of one key must find it by its primary key, whatever
// plan PostgreSQL caches: a statement shared with the batch query (key =
// $1 OR $1 = ”) gets a generic plan that scans every due action to
// recover one. Checked on the plan PostgreSQL really executes, with
// generic plans forced and 20,000 actions due.
func TestRecoverOneKeyUsesThePrimaryKey(t *testing.T) {
	url := testdb.RequirePostgres(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var b [6]byte
	rand.Read(b[:])
	schema := "once_plan_" + hex.EncodeToString(b[:])
	s, err := Open(ctx, url, Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	defer conn.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	table := s.names.Table("action")
	if _, err := conn.Exec(ctx, `INSERT INTO `+table+` (key, fingerprint, run_id, step, kind, target, status, attempt, lease_until)
SELECT md5(g::text), '', 'r', g, 'k', '', 'in_flight', 1, now() - interval '1 hour' FROM generate_series(1, 20000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `ANALYZE `+table); err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Prepare(ctx, "recover_one", s.q.recoverKey); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, `EXPLAIN (ANALYZE, FORMAT TEXT) EXECUTE recover_one('`+strings.Repeat("0", 32)+`', 60000000, 'tok', '{}', false, '{}')`)
	if err != nil {
		t.Fatal(err)
	}
	var plan []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, line)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	text := strings.Join(plan, "\n")
	if !strings.Contains(text, "_pkey") || strings.Contains(text, "Seq Scan") || strings.Contains(text, "action_due") {
		t.Fatalf("recovering one key scans the due actions:\n%s", text)
	}
}
