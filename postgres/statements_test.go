package postgres

import (
	"context"
	"reflect"
	"regexp"
	"testing"
)

// Every statement the store renders from queries.sql parses and
// resolves against a migrated schema, and keeps no marker of its own
// ($T, $DUE) that no replacer knew. PostgreSQL parses a statement the
// first time it runs, so one that no other test runs would otherwise
// fail only in production.
func TestEveryStatementPrepares(t *testing.T) {
	conn, s := planStore(t)
	ctx := context.Background()
	marker := regexp.MustCompile(`\$[A-Z][A-Z_]*`)
	v := reflect.ValueOf(s.q)
	for i := range v.NumField() {
		name, sql := v.Type().Field(i).Name, v.Field(i).String()
		if sql == "" {
			t.Errorf("statement %s is empty", name)
			continue
		}
		if m := marker.FindString(sql); m != "" {
			t.Errorf("statement %s keeps the marker %s", name, m)
		}
		if _, err := conn.Prepare(ctx, "", sql); err != nil {
			t.Errorf("statement %s does not prepare: %v\n%s", name, err, sql)
		}
	}
}
