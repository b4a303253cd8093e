package sqlite

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/oncehq/once"
)

// TestStatementsPreparedAfterMigrate: a call before the schema exists
// cannot prepare the statements and runs from their text; Migrate lets
// the next call prepare them, without waiting for the retry delay.
func TestStatementsPreparedAfterMigrate(t *testing.T) {
	ctx := context.Background()
	s, err := Open(filepath.Join(t.TempDir(), "once.db"), Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Get(ctx, once.Key("k")); err == nil {
		t.Fatal("Get before Migrate found no error")
	}
	if s.stmts.ready {
		t.Fatal("statements prepared on a database with no schema")
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, once.Key("k")); err == nil {
		t.Fatal("Get of a missing key found it")
	}
	if !s.stmts.ready {
		t.Fatal("the statements are not prepared after Migrate")
	}
	s.Close()
	if _, err := s.Get(ctx, once.Key("k")); err == nil {
		t.Fatal("Get on a closed store found no error")
	}
}
