package storekit

import (
	"strconv"
	"strings"
	"time"

	"github.com/oncehq/once"
)

// Dialect is how a store writes what ListClause needs.
type Dialect struct {
	// Placeholder writes the n-th (from 1) parameter marker.
	Placeholder func(n int) string
	// Time converts Filter.Since and Filter.Before to the column's type,
	// rounding up to its precision.
	Time func(time.Time) any
	// Waiting is the condition for Filter.Waiting, given the marker of
	// a parameter that holds DefaultRedriveAfter (in Duration's form).
	Waiting func(defaultMarker string) string
	// Duration converts a duration to the form the store keeps them in.
	Duration func(time.Duration) any
	// Now is the database's clock, as an SQL expression in the form
	// the store keeps times in.
	Now string
}

// ListClause renders f as the WHERE, ORDER BY and LIMIT that follow the
// list query, with its arguments.
func ListClause(f once.Filter, d Dialect) (string, []any) {
	where, args := whereClause(f, d, true)
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	order := " ORDER BY updated_at DESC, key"
	switch {
	case f.ByStep:
		order = " ORDER BY step, key"
	case f.OldestFirst:
		order = " ORDER BY updated_at, key"
	}
	return where + order + " LIMIT " + strconv.Itoa(limit), args
}

// CountClause renders f as the WHERE clause that follows a count of the
// action table: List's, its cursor, order and limit aside.
func CountClause(f once.Filter, d Dialect) (string, []any) {
	return whereClause(f, d, false)
}

func whereClause(f once.Filter, d Dialect, cursor bool) (string, []any) {
	placeholder, since := d.Placeholder, d.Time
	var where []string
	var args []any
	add := func(column string, v any) {
		args = append(args, v)
		where = append(where, column+" = "+placeholder(len(args)))
	}
	if f.Status.Valid() {
		// A literal, not a parameter: the partial indexes on the open
		// statuses serve a query whose condition implies theirs, which
		// a parameter's generic plan cannot show.
		where = append(where, "status = '"+string(f.Status)+"'")
	} else if f.Status != "" {
		add("status", string(f.Status))
	}
	if f.Kind != "" {
		add("kind", f.Kind)
	}
	if f.Run != "" {
		add("run_id", f.Run)
	}
	if !f.Since.IsZero() {
		args = append(args, since(f.Since))
		where = append(where, "updated_at >= "+placeholder(len(args)))
	}
	if !f.Before.IsZero() {
		args = append(args, since(f.Before))
		where = append(where, "updated_at < "+placeholder(len(args)))
	}
	if f.Due {
		where = append(where, "status IN ('in_flight', 'unknown') AND lease_until <= "+d.Now)
	}
	if f.Expired {
		where = append(where, "status = 'awaiting_approval' AND lease_until <= "+d.Now)
	}
	if f.Recovery != once.RecoveryDefault {
		add("recovery", f.Recovery.String())
	}
	if f.Waiting {
		args = append(args, d.Duration(once.DefaultRedriveAfter))
		where = append(where, d.Waiting(placeholder(len(args))))
	}
	if f.KeyPrefix != "" {
		// A range on the primary key, which both databases answer from
		// its index: keys are lowercase hex, and "g" sorts after "f".
		args = append(args, f.KeyPrefix, f.KeyPrefix+"g")
		where = append(where, "key >= "+placeholder(len(args)-1)+" AND key < "+placeholder(len(args)))
	}
	if cursor && f.ByStep && f.AfterKey != "" {
		args = append(args, f.AfterStep, f.AfterStep, string(f.AfterKey))
		n := len(args)
		where = append(where, "(step > "+placeholder(n-2)+" OR step = "+placeholder(n-1)+" AND key > "+placeholder(n)+")")
	}
	if len(where) == 0 {
		return "", args
	}
	return " WHERE " + strings.Join(where, " AND "), args
}

// BriefColumns is a store's column list with the payload and the result
// read as NULL of their types, for Filter.Brief: a list carries neither.
func BriefColumns(columns, payloadNull, resultNull string) string {
	fields := strings.Split(columns, ", ")
	for i, f := range fields {
		switch f {
		case "payload":
			fields[i] = payloadNull + " AS payload"
		case "result":
			fields[i] = resultNull + " AS result"
		case "payload IS NULL":
			fields[i] = "true"
		}
	}
	return strings.Join(fields, ", ")
}
