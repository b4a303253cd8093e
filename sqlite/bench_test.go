package sqlite_test

import (
	"context"
	"testing"

	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/storetest"
)

// BenchmarkDo: claim+complete and replay on an SQLite file with
// synchronous=FULL.
func BenchmarkDo(b *testing.B) {
	s, _ := testdb.NewSQLite(b)
	if err := s.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	storetest.Benchmark(b, s)
}
