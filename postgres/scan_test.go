package postgres

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/testdb"
)

// The column list read from its bytes (actionRow) is what pgx scans
// positionally: for rows with every column set and with every nullable
// one NULL, times before 1970 and 2000, negative and large numbers; and
// a row pgx refuses (an infinite lease) is still refused. The same rows
// read through a pool that gets text results, which pgx scans, agree.
func TestScanReadsWhatPgxReads(t *testing.T) {
	ctx := context.Background()
	conn, s := planStore(t)
	table := s.names.Table("action")
	rows := map[string]string{
		"full": `('full', 'fp', 'run', -7, 'kind', 'target', '\x00ff', 'review', 3, '{"a":[1,"é"]}', 'why',
			'1969-12-31 23:59:59.999999+00', '1999-12-31 23:59:59.5+00', '2000-01-01 00:00:00.000001+00', '2026-05-01 12:00:00+02',
			'2026-05-01 12:00:01+00', 2147483647, 'ada', '2026-05-02 00:00:00+00', 'note', 'tok', 'verify_then_decide',
			9223372036854775807, '4000-01-01 00:00:00+00', 1, true, 'review', 'origin')`,
		"nulls": `('nulls', '', '', 0, '', '', NULL, 'in_flight', 1, NULL, '',
			NULL, '0001-01-01 00:00:00+00', '2026-01-01 00:00:00+00', '2026-01-01 00:00:00+00',
			NULL, 0, '', NULL, '', '', '', NULL, NULL, NULL, false, '', '')`,
		"infinite": `('infinite', 'fp', 'run', 1, 'kind', 'target', '\x', 'unknown', 1, NULL, '',
			'infinity', now(), now(), now(), NULL, 0, '', NULL, '', '', '', NULL, NULL, NULL, false, '', '')`,
	}
	for _, v := range rows {
		if _, err := conn.Exec(ctx, `INSERT INTO `+table+` (`+columns+`, origin) VALUES `+v); err != nil {
			t.Fatal(err)
		}
	}
	read := func(db dbtx, key string, scan func(pgx.Row, *once.Action, ...any) error) (once.Action, string, error) {
		var a once.Action
		var origin string
		err := scan(db.QueryRow(ctx, s.q.eventsRow, key), &a, &origin)
		return a, origin, err
	}
	url := testdb.RequirePostgres(t)
	sep := map[bool]string{false: "?", true: "&"}[strings.Contains(url, "?")]
	text, err := Open(ctx, url+sep+"default_query_exec_mode=exec&pool_max_conns=1", Config{Schema: s.schema})
	if err != nil {
		t.Fatal(err)
	}
	defer text.Close()
	// Which path reads a row: its bytes, unless text results or an
	// infinite time send it to pgx.
	fast := func(db dbtx, key string) bool {
		r, err := db.Query(ctx, s.q.eventsRow, key)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if !r.Next() {
			t.Fatalf("%s: no row", key)
		}
		var origin string
		return decodable(r.FieldDescriptions(), r.RawValues(), []any{&origin})
	}
	for key := range rows {
		if got, want := fast(s.pool, key), key != "infinite"; got != want {
			t.Errorf("%s: read from its bytes: %v, want %v", key, got, want)
		}
		if fast(text.pool, key) {
			t.Errorf("%s: text results read as binary ones", key)
		}
		a, origin, err := read(s.pool, key, scanAction)
		want, wantOrigin, wantErr := read(s.pool, key, scanPositional)
		if (err == nil) != (wantErr == nil) || !reflect.DeepEqual(a, want) || origin != wantOrigin {
			t.Errorf("%s: read as\n%+v, %q, %v\nwant\n%+v, %q, %v", key, a, origin, err, want, wantOrigin, wantErr)
		}
		if key == "infinite" {
			if err == nil {
				t.Errorf("an infinite lease was read as %v", a.LeaseUntil)
			}
			continue
		}
		if a.Payload == nil && key == "full" || a.Result == nil && key == "full" {
			t.Errorf("%s: payload %q, result %q", key, a.Payload, a.Result)
		}
		tx, _, err := read(text.pool, key, scanAction)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(inUTC(tx), inUTC(a)) {
			t.Errorf("%s: read from text results as\n%+v\nfrom binary as\n%+v", key, tx, a)
		}
	}
	// The claim statement's replay, with its claimed flag and clock.
	req := once.ClaimRequest{Key: "full", Fingerprint: "fp", Run: "run", Kind: "kind", Lease: time.Minute, Token: "t"}
	cr, err := s.claimOne(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	var want once.ClaimResult
	if err := scanPositional(s.pool.QueryRow(ctx, s.q.claim, claimArgs(req)...), &want.Action, &want.Claimed, &want.Now); err != nil {
		t.Fatal(err)
	}
	if cr.Claimed || cr.Now.IsZero() || !cr.Now.Before(want.Now) || !reflect.DeepEqual(cr.Action, want.Action) {
		t.Errorf("claim read as %+v, want %+v", cr, want)
	}
}

// inUTC is a with its times in UTC: text results carry the offset the
// server wrote, binary ones none.
func inUTC(a once.Action) once.Action {
	for _, p := range []*time.Time{&a.LeaseUntil, &a.CreatedAt, &a.ClaimedAt, &a.UpdatedAt, &a.CompletedAt, &a.ResolvedAt, &a.RetainUntil} {
		if !p.IsZero() {
			*p = p.UTC()
		}
	}
	return a
}
