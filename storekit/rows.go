package storekit

import (
	"encoding/json"
	"time"

	"github.com/oncehq/once"
)

// Rows is what pgx.Rows and *sql.Rows have in common.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// Collect scans every row with scan. The caller closes rows.
func Collect[T any](rows Rows, scan func(Rows) (T, error)) ([]T, error) {
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// ScanInt scans a single integer column.
func ScanInt(r Rows) (int, error) {
	var n int
	err := r.Scan(&n)
	return n, err
}

// ScanString scans a single text column.
func ScanString(r Rows) (string, error) {
	var v string
	err := r.Scan(&v)
	return v, err
}

// ScanStatusCount scans kind, status, recovery and count, as a Stats
// query returns them.
func ScanStatusCount(r Rows) (once.StatusCount, error) {
	var c once.StatusCount
	var status, recovery string
	err := r.Scan(&c.Kind, &status, &recovery, &c.Count)
	c.Status, c.Recovery = once.Status(status), once.ParseRecovery(recovery)
	return c, err
}

// ScanEvent returns a scanner for the event columns (id, key, at, type,
// attempt, from_status, to_status, actor, note, origin), reading at as
// an A (the driver's type for the column) and turning it into a time.
func ScanEvent[A any](at func(A) time.Time) func(Rows) (once.Event, error) {
	return func(r Rows) (once.Event, error) {
		var e once.Event
		var k, typ, from, to string
		var when A
		err := r.Scan(&e.ID, &k, &when, &typ, &e.Attempt, &from, &to, &e.Actor, &e.Note, &e.Origin)
		e.Key, e.At, e.Type, e.From, e.To = once.Key(k), at(when), once.EventType(typ), once.Status(from), once.Status(to)
		return e, err
	}
}

// KindHolds is RecoverRequest.KindHolds as a JSON object from kind to
// hold, in the unit the store counts durations in (in, from a
// duration), for a statement to look each taken action's kind up in.
func KindHolds(holds map[string]time.Duration, in func(time.Duration) int64) (string, error) {
	m := make(map[string]int64, len(holds))
	for kind, d := range holds {
		m[kind] = in(d)
	}
	b, err := json.Marshal(m)
	return string(b), err
}

// RecoveryText is a recovery mode as the schemas store it: its name, or
// the empty string for the zero mode (not recorded).
func RecoveryText(r once.Recovery) string {
	if r == once.RecoveryDefault {
		return ""
	}
	return r.String()
}
