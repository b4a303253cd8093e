package bench

import (
	"errors"
	"fmt"
	neturl "net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/oncehq/once/internal/dburl"
)

// The arms, in the order the report lists them. Ratios compare pairs of
// them (see Ratios).
const (
	ArmRaw         = "raw"
	ArmRawBatched  = "raw_batched"
	ArmDoUnbatched = "do_unbatched"
	ArmDo          = "do"
	// ArmProtocol is do's action over the protocol (/v1): claim, then
	// outcome, from net/http's client to the handler served on loopback
	// over do's client.
	ArmProtocol  = "protocol"
	ArmReplayRaw = "replay_raw"
	ArmReplayDo  = "replay_do"
	// ArmReplayProtocol is replay_do's claim over the protocol.
	ArmReplayProtocol = "replay_protocol"
	ArmSQLiteRaw      = "sqlite_raw"
	// ArmSQLiteDoUnbatched is sqlite_do with sqlite.Config.Unbatched:
	// every claim and outcome a transaction of its own.
	ArmSQLiteDoUnbatched = "sqlite_do_unbatched"
	ArmSQLiteDo          = "sqlite_do"
	// ArmSQLiteProtocol is protocol over sqlite_do's client.
	ArmSQLiteProtocol = "sqlite_protocol"
)

// Arms lists every arm, in report order.
func Arms() []string {
	return []string{ArmRaw, ArmRawBatched, ArmDoUnbatched, ArmDo, ArmProtocol, ArmReplayRaw, ArmReplayDo, ArmReplayProtocol,
		ArmSQLiteRaw, ArmSQLiteDoUnbatched, ArmSQLiteDo, ArmSQLiteProtocol}
}

// isSQLite reports an arm that runs on SQLite files rather than on the
// PostgreSQL pool.
func isSQLite(arm string) bool {
	return arm == ArmSQLiteRaw || arm == ArmSQLiteDoUnbatched || arm == ArmSQLiteDo || arm == ArmSQLiteProtocol
}

// EmptySuffix ends the name of an arm's twin on the empty log. With
// Scale, each PostgreSQL arm runs twice in every round: as itself on
// the filled log, and as its twin ("do_empty") on a log of its own that
// holds only what the arms write, so that what the size costs is a
// ratio of one run ("do/do_empty@16"), not a comparison across runs,
// whose machine and load differ.
const EmptySuffix = "_empty"

// onEmptyLog reports a twin on the empty log and the arm it is a twin of.
func onEmptyLog(arm string) (base string, empty bool) {
	return strings.CutSuffix(arm, EmptySuffix)
}

// withTwins returns arms with each PostgreSQL arm's twin on the empty
// log right after it.
func withTwins(arms []string) []string {
	var out []string
	for _, a := range arms {
		out = append(out, a)
		if !isSQLite(a) {
			out = append(out, a+EmptySuffix)
		}
	}
	return out
}

// Limits on the options: enough for any machine the command is run on,
// and a mistake (a duration in hours, a million workers) is refused
// rather than run.
const (
	MaxWorkers  = 512
	MaxRounds   = 1000
	MaxScale    = 100_000_000
	MinDuration = 10 * time.Millisecond
	MaxDuration = time.Hour
	// DefaultReplayKeys is how many finished actions each replay arm
	// picks from.
	DefaultReplayKeys = 10_000
)

// Options says what a run measures.
type Options struct {
	// DB is the PostgreSQL URL (postgres://…). The run makes a schema of
	// its own there (once_bench_…) and drops it at the end unless Keep.
	// Required.
	DB string
	// Workers lists the worker counts: each arm runs with each, as that
	// many goroutines. Required.
	Workers []int
	// Rounds is how many times each arm runs at each worker count.
	// Zero means 5.
	Rounds int
	// Duration is how long an arm runs in one round. Zero means 2s.
	Duration time.Duration
	// Arms names the arms to run (see Arms). Empty means all.
	Arms []string
	// Scale first fills the action log and the raw table with this many
	// finished rows each, so the arms measure a table of that size. Each
	// PostgreSQL arm then also runs, in the same rounds, on an empty log
	// of its own, as its twin named with EmptySuffix; the replay arms
	// on the filled log replay rows of the fill, spread over all of it.
	Scale int
	// ReplayKeys is how many finished actions each replay arm picks
	// from: at most Scale with a scale. Zero means DefaultReplayKeys.
	ReplayKeys int
	// Keep keeps the run's schema and SQLite directory.
	Keep bool
	// Progress, when not nil, is called as the run moves on.
	Progress func(Progress)
}

// Progress is where a run is, for a progress line.
type Progress struct {
	// Phase is "setup" before the measurements, then "measure".
	Phase string
	// Step counts the arm runs done, of Steps.
	Step, Steps int
	// Workers, Round (from 1) and Arm say what runs now.
	Workers, Round, Rounds int
	Arm                    string
	// Note says what setup does.
	Note string
}

// withDefaults fills in the defaults and checks every option, so a
// mistake is one error naming it before anything runs.
func (o Options) withDefaults() (Options, error) {
	if o.Rounds == 0 {
		o.Rounds = 5
	}
	if o.Duration == 0 {
		o.Duration = 2 * time.Second
	}
	if o.ReplayKeys == 0 {
		o.ReplayKeys = DefaultReplayKeys
	}
	if len(o.Arms) == 0 {
		o.Arms = Arms()
	}
	switch {
	case o.Rounds < 1 || o.Rounds > MaxRounds:
		return o, fmt.Errorf("rounds must be between 1 and %d, not %d", MaxRounds, o.Rounds)
	case o.Duration < MinDuration || o.Duration > MaxDuration:
		return o, fmt.Errorf("duration must be between %v and %v, not %v", MinDuration, MaxDuration, o.Duration)
	case o.Scale < 0 || o.Scale > MaxScale:
		return o, fmt.Errorf("scale must be between 0 and %d rows, not %d", MaxScale, o.Scale)
	case o.ReplayKeys < 1 || o.ReplayKeys > 10_000_000:
		return o, fmt.Errorf("replay keys must be between 1 and 10000000, not %d", o.ReplayKeys)
	case len(o.Workers) == 0:
		return o, errors.New("give at least one worker count")
	}
	if err := checkWorkers(o.Workers); err != nil {
		return o, err
	}
	arms, err := canonicalArms(o.Arms)
	if err != nil {
		return o, err
	}
	o.Arms = arms
	if o.Scale > 0 {
		if !slices.ContainsFunc(arms, func(a string) bool { return !isSQLite(a) }) {
			return o, fmt.Errorf("scale fills PostgreSQL's tables, and only SQLite arms were chosen; add a PostgreSQL arm or leave the scale out")
		}
		o.Arms = withTwins(arms)
		// A fill smaller than the replay keys is read whole, and the
		// twins on the empty log read as many rows.
		o.ReplayKeys = min(o.ReplayKeys, o.Scale)
	}
	return o, checkDB(o.DB)
}

// checkDB refuses anything but a PostgreSQL URL the run can place its
// own schema in.
func checkDB(url string) error {
	if !dburl.IsPostgres(url) {
		what := "that database"
		if _, ok := dburl.SQLitePath(url); ok {
			what = "a SQLite file"
		}
		return fmt.Errorf("the database must be PostgreSQL (--db postgres://user@host:5432/db), not %s; the SQLite arms make files of their own in a temporary directory", what)
	}
	u, err := neturl.Parse(url)
	if err != nil {
		return errors.New("the database URL does not parse; write it as postgres://user@host:5432/db")
	}
	if q := u.Query(); q.Has("once_schema") || q.Has("once_prefix") {
		return errors.New("leave once_schema and once_prefix out of the database URL: each run makes a schema of its own (once_bench_…) and drops it at the end")
	}
	return nil
}

func checkWorkers(ws []int) error {
	seen := map[int]bool{}
	for _, w := range ws {
		if w < 1 || w > MaxWorkers {
			return fmt.Errorf("a worker count must be between 1 and %d, not %d", MaxWorkers, w)
		}
		if seen[w] {
			return fmt.Errorf("the worker count %d is listed twice", w)
		}
		seen[w] = true
	}
	return nil
}

// canonicalArms checks names and returns them in report order.
func canonicalArms(names []string) ([]string, error) {
	all := Arms()
	for _, n := range names {
		if !slices.Contains(all, n) {
			return nil, fmt.Errorf("no arm %q; the arms are %s", n, strings.Join(all, ", "))
		}
	}
	var out []string
	for _, a := range all {
		if slices.Contains(names, a) {
			out = append(out, a)
		}
	}
	return out, nil
}

// ParseWorkers reads a comma-separated list of worker counts ("1,16,64").
func ParseWorkers(s string) ([]int, error) {
	var ws []int
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("%q is not a number; give a comma-separated list such as 1,16,64", f)
		}
		ws = append(ws, n)
	}
	return ws, checkWorkers(ws)
}

// ParseArms reads a comma-separated list of arm names and checks them;
// an empty list is every arm.
func ParseArms(s string) ([]string, error) {
	var names []string
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			names = append(names, f)
		}
	}
	if len(names) == 0 {
		return Arms(), nil
	}
	return canonicalArms(names)
}
