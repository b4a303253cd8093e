// Package storetest holds the tests every once store passes, in two
// layers with an entry point each:
//
//   - RunStore checks the Store contract itself, calling a store's
//     methods directly: claims (raced by 64 goroutines and by 4 OS
//     processes), heartbeats, fenced transitions and hold tokens,
//     recoverable batches, purge, list filters and key prefixes, events,
//     stats, migrations run twice and concurrently, and Wait for a
//     store that implements once.Waiter. A new store passes this first.
//   - RunClient checks the engine above the store, everything that goes
//     through *once.Client: Do and DoTx, replay, fencing, leases and
//     heartbeats, RetryLater, Permanent, unknown outcomes and panics,
//     fingerprints, size limits, bad input, recovery per policy, the
//     reaper, resolution, runs, duplicates that wait for the attempt in
//     flight (WaitFor), and worker processes killed with SIGKILL inside
//     the effect or paused with SIGSTOP past their lease.
//
// Both take a Harness that says how to make, open and transact on the
// store, and what it can do (Features). A store package runs both; the
// root package runs RunClient over SQLite, so the engine's own tests and
// its coverage live where the engine does:
//
//	func TestMain(m *testing.M) {
//		storetest.MaybeChild(open) // worker processes re-enter here
//		os.Exit(m.Run())
//	}
//
//	func TestStore(t *testing.T)  { storetest.RunStore(t, harness) }
//	func TestClient(t *testing.T) { storetest.RunClient(t, harness) }
//
// Every subtest runs on a store of its own, in parallel but for a few
// whose second-long leases a crowded machine could stretch.
package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncehq/once"
)

// Harness tells the suite how to make stores and what they can do.
type Harness struct {
	// New returns a fresh, isolated, not yet migrated store, and a spec
	// that Open understands, so a worker process can open the same store.
	// It registers its own cleanup.
	New func(t *testing.T) (once.Store, string)
	// Open opens the store a spec names. Worker processes call it, and
	// tests that need a second connection to the same store.
	Open func(ctx context.Context, spec string) (once.Store, error)
	// Tx returns the transactions of s, a migrated store New returned
	// with spec, for the DoTx tests; make its result with TxOf. It may
	// create the application table TxFuncs.Insert writes to. Nil leaves
	// the DoTx tests out.
	Tx func(t *testing.T, s once.Store, spec string) TxHarness
	// Faults returns a second store on the database spec names, with
	// the partial failures the harness can put between that store and
	// the database, for the partial-failure tests. Nil leaves them out.
	Faults func(t *testing.T, spec string) (once.Store, Faults)
	// Markers name statements for Faults.LoseReply (with
	// Features.LostReplies).
	Markers Markers
	// Features says what the store can do; tests that need what it
	// cannot are left out, and the suite logs which.
	Features Features
}

// Features are what a store can do beyond the Store contract, in the
// manner of Watermill's pubsub/tests.Features. The suite only runs a
// test whose needs the harness declares.
type Features struct {
	// Processes: another process that opens the spec shares the store
	// (a file, a server), so the tests with real worker processes
	// (claim races, SIGKILL inside the effect, SIGSTOP past the lease)
	// run. The process calls MaybeChild first thing in TestMain.
	Processes bool
	// RowLocks: a transaction locks the rows it writes, not the whole
	// database, so a DoTx left open holds up claims of its own key only
	// (PostgreSQL; SQLite has one write lock per file).
	RowLocks bool
	// Refusal: Faults.Refuse makes the faulted store's connections fail,
	// and Faults.End ends them (a server reached over a network).
	Refusal bool
	// LostReplies: Faults.LoseReply can lose a committed statement's
	// reply (a server reached over a network; SQLite runs in the
	// process, so its replies cannot be lost, only the process killed).
	LostReplies bool
	// Partition: Faults.Hang is a network partition, which holds up the
	// faulted store's reads as well as its writes, and nothing else: the
	// harness's own store goes on. SQLite's hang is its write lock,
	// which reads pass and every store on the file meets.
	Partition bool
}

// namedTest is one subtest of a layer.
type namedTest struct {
	name string
	fn   func(*testing.T, Harness)
	// needs is what the test needs of the harness; zero means nothing
	// beyond New and Open.
	needs need
	// serial runs it alone, before the parallel subtests: it holds a
	// lease or a hold of a second or less against a lock or a pause,
	// which a crowded machine could stretch into another outcome.
	serial bool
}

type need int

const (
	needProcesses need = 1 << iota
	needTx
	needRowLocks
	needFaults
	needRefusal
	needLostReplies
	needPartition
)

// missing names what the harness lacks of n; empty if nothing.
func (h Harness) missing(n need) string {
	var s []string
	if n&needProcesses != 0 && !h.Features.Processes {
		s = append(s, "Features.Processes")
	}
	if n&needTx != 0 && h.Tx == nil {
		s = append(s, "Harness.Tx")
	}
	if n&needRowLocks != 0 && !h.Features.RowLocks {
		s = append(s, "Features.RowLocks")
	}
	if n&needFaults != 0 && h.Faults == nil {
		s = append(s, "Harness.Faults")
	}
	if n&needRefusal != 0 && !h.Features.Refusal {
		s = append(s, "Features.Refusal")
	}
	if n&needLostReplies != 0 && !h.Features.LostReplies {
		s = append(s, "Features.LostReplies")
	}
	if n&needPartition != 0 && !h.Features.Partition {
		s = append(s, "Features.Partition")
	}
	return strings.Join(s, ", ")
}

// RunStore runs the Store contract tests. They call the store's methods
// directly and use no *once.Client.
func RunStore(t *testing.T, h Harness) { run(t, h, storeTests()) }

// RunClient runs the engine's tests over the store: everything that goes
// through *once.Client, with the store underneath.
func RunClient(t *testing.T, h Harness) {
	tests := clientTests()
	tests = append(tests, recoveryTests()...)
	tests = append(tests, processTests()...)
	tests = append(tests, txTests()...)
	tests = append(tests, edgeTests()...)
	tests = append(tests, faultTests()...)
	tests = append(tests, renewalTests()...)
	tests = append(tests, partialTests()...)
	tests = append(tests, idleTests()...)
	tests = append(tests, waitTests()...)
	tests = append(tests, attemptTests()...)
	tests = append(tests, claimIDTests()...)
	tests = append(tests, reviewTests()...)
	tests = append(tests, approvalTests()...)
	tests = append(tests, approvalAdversaryTests()...)
	run(t, h, tests)
}

func run(t *testing.T, h Harness, tests []namedTest) {
	t.Helper()
	if h.New == nil || h.Open == nil {
		t.Fatal("storetest: Harness.New and Harness.Open are required")
	}
	for _, tt := range tests {
		if lacks := h.missing(tt.needs); lacks != "" {
			t.Logf("%s left out: the harness does not declare %s", tt.name, lacks)
			continue
		}
		t.Run(tt.name, func(t *testing.T) {
			if !tt.serial {
				t.Parallel()
			}
			tt.fn(t, h)
		})
	}
}

// newStore returns a migrated store of the harness and its spec.
func newStore(t *testing.T, h Harness) (once.Store, string) {
	t.Helper()
	s, spec := h.New(t)
	if err := s.Migrate(ctx(t)); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return s, spec
}

// setup returns a migrated store and a client over it.
func setup(t *testing.T, h Harness, cfg once.Config) (once.Store, *once.Client, string) {
	t.Helper()
	s, spec := newStore(t, h)
	cfg.Store = s
	c, err := once.New(cfg)
	if err != nil {
		t.Fatalf("once.New: %v", err)
	}
	childRecovery.Store(spec, c.Policy(processIntent.Kind).Recovery)
	return s, c, spec
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

func intent(step int64) once.Intent {
	return once.Intent{Run: "run-1", Step: step, Kind: "send_email", Target: "ada@example.com", Payload: map[string]any{"subject": "hello", "n": step}}
}

// counter is an effect that counts its executions.
type counter struct{ n atomic.Int64 }

func (c *counter) fn(v string) func(context.Context, once.Attempt) (string, error) {
	return func(context.Context, once.Attempt) (string, error) {
		c.n.Add(1)
		return v, nil
	}
}

func mustGet(t *testing.T, s once.Store, k once.Key) once.Action {
	t.Helper()
	a, err := s.Get(ctx(t), k)
	if err != nil {
		t.Fatalf("Get(%s): %v", k, err)
	}
	return a
}

func keyOf(t *testing.T, in once.Intent) once.Key {
	t.Helper()
	k, _, err := once.KeyOf(in)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// claimReq is the request Do would make for in, with lease.
func claimReq(t *testing.T, in once.Intent, lease time.Duration) once.ClaimRequest {
	t.Helper()
	k, fp, err := once.KeyOf(in)
	if err != nil {
		t.Fatal(err)
	}
	return once.ClaimRequest{Key: k, Fingerprint: fp, Run: in.Run, Step: in.Step, Kind: in.Kind, Target: in.Target, Lease: lease}
}

// mustClaim claims req and fails unless it won.
func mustClaim(t *testing.T, s once.Store, req once.ClaimRequest) once.ClaimResult {
	t.Helper()
	cr, err := s.Claim(ctx(t), req)
	if err != nil || !cr.Claimed {
		t.Fatalf("Claim(%s) = %+v, %v; want it won", req.Key, cr, err)
	}
	return cr
}

// trail is an action's event types, oldest first, joined by commas.
func trail(t *testing.T, s once.Store, k once.Key) string {
	t.Helper()
	evs, err := s.Events(ctx(t), k)
	if err != nil {
		t.Fatalf("Events: %v", err)
	}
	var types []string
	for _, e := range evs {
		if e.Key != k || e.At.IsZero() {
			t.Fatalf("event %+v", e)
		}
		types = append(types, string(e.Type))
	}
	return strings.Join(types, ",")
}

func closeStore(s once.Store) { s.Close() }

func isNotFound(err error) bool { return errors.Is(err, once.ErrNotFound) }

func jsonRaw(s string) json.RawMessage { return json.RawMessage(s) }

// jsonEqual reports whether a and b are the same JSON value.
func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return string(xa) == string(ya)
}

// Counted sums the cells of stats, a store's Stats, in status.
func Counted(stats []once.StatusCount, status once.Status) int64 {
	var n int64
	for _, c := range stats {
		if c.Status == status {
			n += c.Count
		}
	}
	return n
}
