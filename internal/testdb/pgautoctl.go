package testdb

import (
	"testing"

	"github.com/oncehq/once/internal/chaos/ha"
)

// RequirePgAutoctl skips (or, under CI, fails) the test when this machine
// cannot run the failover cluster of internal/chaos/ha: pg_autoctl
// (Debian's postgresql-15-auto-failover), PostgreSQL's initdb and pg_ctl,
// and, as root, the postgres user to run them as.
func RequirePgAutoctl(t testing.TB) {
	t.Helper()
	if err := ha.Check(ha.Config{}); err != nil {
		msg := err.Error() + "; scripts/ha-setup.sh installs what is missing"
		Unavailable(t, msg)
	}
}
