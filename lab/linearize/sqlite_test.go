package linearize_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/storetest"
)

// TestLinearizableSQLite runs the workload over one database file opened
// twice, as two processes would. The fault is SQLite's: another
// connection holds the file's write lock, so every writer waits, for
// less than a lease or for longer than one.
func TestLinearizableSQLite(t *testing.T) {
	if testing.Short() {
		t.Skip("a run of about half a minute")
	}
	h := testdb.SQLite()
	direct, path := h.New(t)
	if err := direct.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	second, f := h.Faults(t, path)
	// The race detector slows SQLite (a C library translated to Go)
	// several times over, and its writers queue for one lock: a longer
	// lease and fewer workers than over PostgreSQL.
	lease := 700 * time.Millisecond
	newWorld(t, lease, 4, direct, second, &lockFaults{f: f, lease: lease}).run()
}

// lockFaults hold the file's write lock.
type lockFaults struct {
	f      storetest.Faults
	lease  time.Duration
	mu     sync.Mutex
	counts map[string]int
}

func (l *lockFaults) kinds() []string {
	return []string{"none", "lock-short", "lock-past-lease", "lock-long"}
}

func (l *lockFaults) inject(kind string) (func(), time.Duration) {
	l.mu.Lock()
	if l.counts == nil {
		l.counts = map[string]int{}
	}
	l.counts[kind]++
	l.mu.Unlock()
	var d time.Duration
	switch kind {
	case "lock-short":
		d = l.lease / 2
	case "lock-past-lease":
		// Past the lease, within RecordTimeout: a cut-off worker's
		// outcome races the recovery of its claim.
		d = 3 * l.lease
	case "lock-long":
		// Past RecordTimeout: outcomes go unrecorded.
		d = longFault(l.lease)
	default:
		return nil, 0
	}
	l.f.Hang(true)
	t := time.AfterFunc(d, func() { l.f.Hang(false) })
	return func() {
		t.Stop()
		l.f.Hang(false)
	}, d
}

func (l *lockFaults) report() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return fmt.Sprint(l.counts)
}
