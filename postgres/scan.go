package postgres

import (
	"encoding/binary"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/oncehq/once"
)

// Reading the column list.
//
// Every claim, a replay's included, reads the whole row back: 27
// columns, and the claimed flag and the database's clock. Scanned
// positionally, pgx plans each column's scan again for every row (the
// plans are the row's, not the statement's), allocates each pointer
// destination of a nullable column, and boxes every destination: for a
// replay that was the largest cost on the client after the round trip
// itself. actionRow reads the columns' bytes instead, where they come
// as the store's own statements make them: binary, of the column list's
// types. Any other row (text results, under QueryExecModeExec or the
// simple protocol behind a pooler; a column altered to another type; a
// NULL where the Action holds no zero for it; an infinite time) is
// scanned by pgx as before, so what a caller gets never depends on the
// path taken.

// PostgreSQL's type OIDs of the column list's types.
const (
	oidBool        = 16
	oidBytea       = 17
	oidInt8        = 20
	oidInt4        = 23
	oidText        = 25
	oidJSON        = 114
	oidTimestamptz = 1184
)

// actionColumns are the types of the column list's columns, in order.
var actionColumns = [...]uint32{
	oidText, oidText, oidText, oidInt8, oidText, oidText, oidBytea, oidText, oidInt4, // key … attempt
	oidJSON, oidText, oidTimestamptz, oidTimestamptz, oidTimestamptz, oidTimestamptz, oidTimestamptz, // result … completed_at
	oidInt4, oidText, oidTimestamptz, oidText, oidText, oidText, oidInt8, oidTimestamptz, oidInt8, oidBool, // verify_failures … redrive
	oidText, // on_expiry
}

// nullable marks the columns whose NULL the Action holds as a zero
// value; a NULL in any other is pgx's error to report.
var nullable = [len(actionColumns)]bool{6: true, 9: true, 11: true, 15: true, 18: true, 22: true, 23: true, 24: true}

// actionRow is the column list, then extra destinations, as one
// pgx.RowScanner.
type actionRow struct {
	a     *once.Action
	extra []any
}

// ScanRow implements pgx.RowScanner.
func (r *actionRow) ScanRow(rows pgx.Rows) error {
	fds, vals := rows.FieldDescriptions(), rows.RawValues()
	if loc, ok := timeLocation(rows); ok && decodable(fds, vals, r.extra) {
		decodeAction(r.a, vals, loc)
		for i, dst := range r.extra {
			decodeExtra(dst, vals[len(actionColumns)+i], loc)
		}
		return nil
	}
	return scanPositional(rows, r.a, r.extra...)
}

// timeLocation is where pgx would put a timestamptz it scans: the
// location the connection's codec names, nil for the local one. It
// reports false when the connection reads timestamptz with a codec of
// its own.
func timeLocation(rows pgx.Rows) (*time.Location, bool) {
	conn := rows.Conn()
	if conn == nil {
		return nil, false
	}
	t, ok := conn.TypeMap().TypeForOID(oidTimestamptz)
	if !ok {
		return nil, false
	}
	c, ok := t.Codec.(*pgtype.TimestamptzCodec)
	if !ok {
		return nil, false
	}
	return c.ScanLocation, true
}

// decodable reports whether decodeAction and decodeExtra can read vals
// as pgx would have scanned them: every column of the expected type, in
// binary where its text form differs, not NULL where the destination
// holds no zero for it, and no time beyond time.Time's range.
func decodable(fds []pgconn.FieldDescription, vals [][]byte, extra []any) bool {
	if len(fds) != len(actionColumns)+len(extra) || len(vals) != len(fds) {
		return false
	}
	for i, oid := range actionColumns {
		if !decodableColumn(fds[i], vals[i], oid, nullable[i]) {
			return false
		}
	}
	for i, dst := range extra {
		var oid uint32
		switch dst.(type) {
		case *bool:
			oid = oidBool
		case *int64:
			oid = oidInt8
		case *string:
			oid = oidText
		case *time.Time:
			oid = oidTimestamptz
		default:
			return false
		}
		j := len(actionColumns) + i
		if !decodableColumn(fds[j], vals[j], oid, false) {
			return false
		}
	}
	return true
}

// decodableColumn reports whether one column's value can be read as oid.
func decodableColumn(fd pgconn.FieldDescription, v []byte, oid uint32, null bool) bool {
	if fd.DataTypeOID != oid {
		return false
	}
	if v == nil {
		return null
	}
	switch oid {
	case oidText, oidJSON:
		// The same bytes in either format.
		return true
	case oidBool:
		return fd.Format == pgx.BinaryFormatCode && len(v) == 1
	case oidInt4:
		return fd.Format == pgx.BinaryFormatCode && len(v) == 4
	case oidInt8:
		return fd.Format == pgx.BinaryFormatCode && len(v) == 8
	case oidBytea:
		return fd.Format == pgx.BinaryFormatCode
	case oidTimestamptz:
		if fd.Format != pgx.BinaryFormatCode || len(v) != 8 {
			return false
		}
		// Not ±infinity, which no time.Time holds, nor beyond the
		// range pgx scans.
		us := int64(binary.BigEndian.Uint64(v))
		if us == math.MaxInt64 || us == math.MinInt64 {
			return false
		}
		t := timeOf(v, nil)
		return !t.Before(minTime) && t.Before(endTime)
	}
	return false
}

// decodeAction reads the column list into a, as scanPositional does.
// decodable has checked vals.
func decodeAction(a *once.Action, vals [][]byte, loc *time.Location) {
	*a = once.Action{
		Key:            once.Key(vals[0]),
		Fingerprint:    once.Fingerprint(vals[1]),
		Run:            string(vals[2]),
		Step:           int64(binary.BigEndian.Uint64(vals[3])),
		Kind:           string(vals[4]),
		Target:         string(vals[5]),
		Payload:        copyBytes(vals[6]),
		Status:         once.Status(vals[7]),
		Attempt:        int(int32(binary.BigEndian.Uint32(vals[8]))),
		Result:         copyBytes(vals[9]),
		Error:          string(vals[10]),
		LeaseUntil:     timeOf(vals[11], loc),
		CreatedAt:      timeOf(vals[12], loc),
		ClaimedAt:      timeOf(vals[13], loc),
		UpdatedAt:      timeOf(vals[14], loc),
		CompletedAt:    timeOf(vals[15], loc),
		VerifyFailures: int(int32(binary.BigEndian.Uint32(vals[16]))),
		ResolvedBy:     string(vals[17]),
		ResolvedAt:     timeOf(vals[18], loc),
		ResolveNote:    string(vals[19]),
		Token:          string(vals[20]),
		Recovery:       once.ParseRecovery(string(vals[21])),
		Retention:      microsOf(vals[22]),
		RetainUntil:    timeOf(vals[23], loc),
		RedriveAfter:   microsOf(vals[24]),
		Redrive:        vals[25][0] != 0,
		OnExpiry:       once.Status(vals[26]),
	}
}

// decodeExtra reads one extra column into dst, whose type decodable
// has checked.
func decodeExtra(dst any, v []byte, loc *time.Location) {
	switch d := dst.(type) {
	case *bool:
		*d = v[0] != 0
	case *int64:
		*d = int64(binary.BigEndian.Uint64(v))
	case *string:
		*d = string(v)
	case *time.Time:
		*d = timeOf(v, loc)
	}
}

// copyBytes copies a bytea or json value out of the connection's
// buffer, which the next row reuses; NULL stays nil.
func copyBytes(v []byte) []byte {
	if v == nil {
		return nil
	}
	return append(make([]byte, 0, len(v)), v...)
}

// microsOf is a duration kept in microseconds; NULL is zero.
func microsOf(v []byte) time.Duration {
	if v == nil {
		return 0
	}
	return time.Duration(int64(binary.BigEndian.Uint64(v))) * time.Microsecond
}

// y2k is PostgreSQL's epoch, from which a binary timestamptz counts
// microseconds, in microseconds from Unix's.
const y2k = 946_684_800_000_000

// minTime and endTime bound the times pgx scans (its minDateTime and
// endTimestamp); it refuses the others.
var (
	minTime = time.Date(-4713, 11, 24, 0, 0, 0, 0, time.UTC)
	endTime = time.Date(294277, 1, 1, 0, 0, 0, 0, time.UTC)
)

// timeOf is a binary timestamptz as pgx scans it into a time.Time: in
// loc, or the local location when loc is nil; NULL is the zero time.
func timeOf(v []byte, loc *time.Location) time.Time {
	if v == nil {
		return time.Time{}
	}
	// Added in parts, as pgx does, so that no sum overflows.
	us := int64(binary.BigEndian.Uint64(v))
	t := time.Unix(y2k/1_000_000+us/1_000_000, y2k%1_000_000*1_000+us%1_000_000*1_000)
	if loc != nil {
		t = t.In(loc)
	}
	return t
}
