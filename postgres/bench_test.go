package postgres_test

import (
	"context"
	"testing"

	"github.com/oncehq/once"
	"github.com/oncehq/once/storetest"
)

func benchStore(b *testing.B) once.Store {
	s, _ := newStore(b)
	if err := s.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	return s
}

// BenchmarkDo: claim+complete and replay on PostgreSQL.
func BenchmarkDo(b *testing.B) { storetest.Benchmark(b, benchStore(b)) }
