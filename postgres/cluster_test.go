package postgres

import (
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/oncehq/once/internal/testdb"
)

// The disk-full and idle-connection tests run throwaway PostgreSQL
// clusters of their own (fullCluster), as the postgres user.

// clusterUser returns the postgres user's ids, and skips t (whose tests
// are named by what) unless it is root, with PostgreSQL's binaries in
// pgBin and a postgres user.
func clusterUser(t *testing.T, what string) (uid, gid int) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("not root: %s run PostgreSQL as the postgres user", what)
	}
	for _, p := range []string{"initdb", "pg_ctl", "postgres"} {
		if _, err := os.Stat(filepath.Join(pgBin, p)); err != nil {
			t.Skipf("PostgreSQL's %s is missing from %s (%v): %s run a cluster of their own", p, pgBin, err, what)
		}
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		t.Skipf("no postgres user to run the cluster of %s as: %v", what, err)
	}
	uid, _ = strconv.Atoi(u.Uid)
	gid, _ = strconv.Atoi(u.Gid)
	return uid, gid
}

// configure appends conf to the cluster's postgresql.conf.
func (c *fullCluster) configure(conf string) {
	c.t.Helper()
	f, err := os.OpenFile(filepath.Join(c.data, "postgresql.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		c.t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(conf); err != nil {
		c.t.Fatal(err)
	}
}

// startOnFreePort starts the cluster on a port port finds free, and
// stops it at t's end. Another test's server may take the port between
// the look and this server's bind: then another port.
func (c *fullCluster) startOnFreePort(port func(*testing.T) int) {
	c.t.Helper()
	c.t.Cleanup(c.stop)
	for try := 0; ; try++ {
		c.port = port(c.t)
		err := c.tryStart()
		if err == nil {
			return
		}
		if try == 4 || !strings.Contains(c.log(), "Address already in use") {
			c.t.Fatalf("pg_ctl start: %v\n%s", err, c.log())
		}
	}
}

// portIn returns a function that finds a free port from low to low+n-1
// (testdb.FreeLowPort), and skips its test when there is none.
func portIn(low, n int) func(*testing.T) int {
	return func(t *testing.T) int {
		t.Helper()
		p, err := testdb.FreeLowPort(low, n)
		if err != nil {
			t.Skipf("the test's cluster: %v", err)
		}
		return p
	}
}
