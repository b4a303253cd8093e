package postgres_test

import (
	"context"
	"strings"
	"testing"

	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/postgres"
)

// TestConfigRefusesSystemSchema: Config.Schema naming one of
// PostgreSQL's own schemas is refused by Open and Migrations, before any
// table is written; information_schema was migrated into.
func TestConfigRefusesSystemSchema(t *testing.T) {
	url := testdb.RequirePostgres(t)
	for _, schema := range []string{"information_schema", "pg_catalog", "pg_toast", "pg_temp_3", "PG_Catalog"} {
		cfg := postgres.Config{Schema: schema}
		if _, err := postgres.Migrations(cfg); err == nil || !strings.Contains(err.Error(), "is a system schema") {
			t.Errorf("Migrations with Schema %q: %v; want it refused as a system schema", schema, err)
		}
		s, err := postgres.Open(context.Background(), url, cfg)
		if err == nil {
			s.Close()
		}
		if err == nil || !strings.Contains(err.Error(), "Config.Schema") || !strings.Contains(err.Error(), "is a system schema") {
			t.Errorf("Open with Schema %q: %v; want it refused as a system schema", schema, err)
		}
	}
}
