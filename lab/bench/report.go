package bench

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is what a run measured.
type Report struct {
	// Arms has one entry per arm and worker count, by worker count, then
	// in Arms order.
	Arms []ArmResult `json:"arms"`
	// Ratios compares pairs of arms: "A/B@W" is the median, over the
	// rounds, of A's actions per second divided by B's in the same round,
	// with W workers. Above 1, A did more per second. The pairs are
	// do_unbatched/raw, do/raw, do/raw_batched, replay_do/replay_raw,
	// sqlite_do_unbatched/sqlite_raw and sqlite_do/sqlite_raw (once over
	// the hand-written floor), and protocol/do, replay_protocol/replay_do
	// and sqlite_protocol/sqlite_do (the HTTP hop over the Do it
	// serves), where both arms ran; with Scale, the same
	// between the twins on the empty log, and each arm over its twin:
	// "do/do_empty@16" is what the filled log leaves of do's rate.
	Ratios map[string]float64 `json:"ratios"`
	// Rounds, Duration and Scale are the run's options.
	Rounds     int   `json:"rounds"`
	DurationMS int64 `json:"duration_ms"`
	Scale      int   `json:"scale"`
	// Server is the PostgreSQL server's version.
	Server string `json:"server"`
	// Schema and Dir are where the run's tables and SQLite files were
	// kept (--keep); empty when they were removed.
	Schema string `json:"schema,omitempty"`
	Dir    string `json:"dir,omitempty"`
	// EmptySchema is where the twins on the empty log ran (Scale),
	// when kept.
	EmptySchema string `json:"empty_schema,omitempty"`
	// Note says what the run could not measure, and why.
	Note string `json:"note,omitempty"`
}

// ArmResult is one arm at one worker count, over all rounds.
type ArmResult struct {
	Name    string `json:"name"`
	Workers int    `json:"workers"`
	// Actions is how many actions the arm completed, in all rounds.
	Actions int64 `json:"actions"`
	// ActionsPerS is the median over rounds of the round's actions per
	// second.
	ActionsPerS float64 `json:"actions_per_s"`
	// P50us and P99us are percentiles of the actions' latencies, of all
	// rounds together, in microseconds. A raw_batched action's latency is
	// its batch's.
	P50us float64 `json:"p50_us"`
	P99us float64 `json:"p99_us"`
	// CommitsPerAction is the median over rounds of the database's
	// committed transactions (pg_stat_database.xact_commit, read-only
	// ones included) per action. Another client's transactions in the
	// same database count too. Omitted for SQLite arms.
	CommitsPerAction *float64 `json:"commits_per_action,omitempty"`
	// WALBytesPerAction is the median over rounds of the WAL the
	// PostgreSQL cluster wrote per action; all its databases' writes
	// count. Omitted for SQLite arms.
	WALBytesPerAction *float64 `json:"wal_bytes_per_action,omitempty"`
	// WALFPIBytesPerAction is the median over rounds of how much of that
	// WAL was full-page images: the first change to each page after a
	// checkpoint writes the whole page, so it is the checkpoint's timing
	// more than the arm's writes. Omitted when the run could not read
	// the WAL back (pg_walinspect; see Report.Note) and for SQLite arms.
	WALFPIBytesPerAction *float64 `json:"wal_fpi_bytes_per_action,omitempty"`
	// AllocsPerAction is the median over rounds of this process's heap
	// allocations (runtime.MemStats.Mallocs) per action, the driver's
	// included.
	AllocsPerAction float64 `json:"allocs_per_action"`
}

// ratioPairs are the comparisons a report makes: once against the floor
// it stands on, and the protocol against the Do beneath it.
var ratioPairs = [][2]string{
	{ArmDoUnbatched, ArmRaw},
	{ArmDo, ArmRaw},
	{ArmDo, ArmRawBatched},
	{ArmReplayDo, ArmReplayRaw},
	{ArmSQLiteDoUnbatched, ArmSQLiteRaw},
	{ArmSQLiteDo, ArmSQLiteRaw},
	// What the HTTP hop costs: the protocol over the Do it serves.
	{ArmProtocol, ArmDo},
	{ArmReplayProtocol, ArmReplayDo},
	{ArmSQLiteProtocol, ArmSQLiteDo},
}

// comparedPairs are ratioPairs, the same between the twins on the empty
// log, and each PostgreSQL arm over its twin; a report gives those whose
// arms both ran.
var comparedPairs = func() [][2]string {
	pairs := slices.Clone(ratioPairs)
	for _, p := range ratioPairs {
		if !isSQLite(p[0]) {
			pairs = append(pairs, [2]string{p[0] + EmptySuffix, p[1] + EmptySuffix})
		}
	}
	for _, a := range Arms() {
		if !isSQLite(a) {
			pairs = append(pairs, [2]string{a, a + EmptySuffix})
		}
	}
	return pairs
}()

// RatioKey names a ratio in Report.Ratios: "do/raw@16".
func RatioKey(a, b string, workers int) string {
	return a + "/" + b + "@" + strconv.Itoa(workers)
}

// summarize turns a run's samples into its report.
func summarize(o Options, all samples) *Report {
	rep := &Report{Ratios: map[string]float64{}, Rounds: o.Rounds, DurationMS: o.Duration.Milliseconds(), Scale: o.Scale}
	rates := func(arm string, w int) []float64 {
		var out []float64
		for _, s := range all[arm][w] {
			out = append(out, perSecond(s))
		}
		return out
	}
	for _, w := range o.Workers {
		for _, arm := range o.Arms {
			ss := all[arm][w]
			if len(ss) == 0 {
				continue
			}
			res := ArmResult{Name: arm, Workers: w, ActionsPerS: round(median(rates(arm, w)), 1)}
			var lat []time.Duration
			var commits, wal, fpi, allocs []float64
			fpiKnown := true
			for _, s := range ss {
				res.Actions += s.actions
				lat = append(lat, s.lat...)
				allocs = append(allocs, per(float64(s.mallocs), s.actions))
				commits = append(commits, per(float64(s.commits), s.actions))
				wal = append(wal, per(float64(s.wal), s.actions))
				fpi = append(fpi, per(float64(s.fpi), s.actions))
				fpiKnown = fpiKnown && s.fpiKnown
			}
			slices.Sort(lat)
			res.P50us = micros(percentile(lat, 50))
			res.P99us = micros(percentile(lat, 99))
			res.AllocsPerAction = round(median(allocs), 1)
			if ss[0].pg {
				c, b := round(median(commits), 3), round(median(wal), 1)
				res.CommitsPerAction, res.WALBytesPerAction = &c, &b
				if fpiKnown {
					f := round(median(fpi), 1)
					res.WALFPIBytesPerAction = &f
				}
			}
			rep.Arms = append(rep.Arms, res)
		}
		for _, p := range comparedPairs {
			if r, ok := ratioMedian(rates(p[0], w), rates(p[1], w)); ok {
				rep.Ratios[RatioKey(p[0], p[1], w)] = round(r, 3)
			}
		}
	}
	return rep
}

func perSecond(s sample) float64 {
	if s.elapsed <= 0 {
		return 0
	}
	return float64(s.actions) / s.elapsed.Seconds()
}

func per(x float64, actions int64) float64 {
	if actions == 0 {
		return 0
	}
	return x / float64(actions)
}

func micros(d time.Duration) float64 { return round(float64(d)/float64(time.Microsecond), 1) }

// round rounds x to n decimals, so the report carries no false precision.
func round(x float64, n int) float64 {
	p := math.Pow(10, float64(n))
	return math.Round(x*p) / p
}

// WriteText writes the report as a table for people, with the ratios
// under it.
func (r *Report) WriteText(w io.Writer) error {
	rounds := "rounds"
	if r.Rounds == 1 {
		rounds = "round"
	}
	fmt.Fprintf(w, "once bench: %s, %d %s of %v per arm", r.Server, r.Rounds, rounds, time.Duration(r.DurationMS)*time.Millisecond)
	if r.Scale > 0 {
		fmt.Fprintf(w, ", action log and raw table filled with %d rows (the arms named %s ran on empty ones)", r.Scale, "…"+EmptySuffix)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	// The cells align right, and the names are padded to one width so
	// they read left-aligned.
	width := len("arm")
	for _, a := range r.Arms {
		width = max(width, len(a.Name))
	}
	fmt.Fprintf(tw, "%-*s\tworkers\tactions/s\tp50 µs\tp99 µs\tcommits/action\tWAL B/action\tof it FPI\tallocs/action\t\n", width, "arm")
	for _, a := range r.Arms {
		commits, wal, fpi := "-", "-", "-"
		if a.CommitsPerAction != nil {
			commits = strconv.FormatFloat(*a.CommitsPerAction, 'f', 3, 64)
		}
		if a.WALBytesPerAction != nil {
			wal = strconv.FormatFloat(*a.WALBytesPerAction, 'f', 0, 64)
		}
		if a.WALFPIBytesPerAction != nil {
			fpi = strconv.FormatFloat(*a.WALFPIBytesPerAction, 'f', 0, 64)
		}
		fmt.Fprintf(tw, "%-*s\t%d\t%.0f\t%.0f\t%.0f\t%s\t%s\t%s\t%.0f\t\n", width, a.Name, a.Workers, a.ActionsPerS, a.P50us, a.P99us, commits, wal, fpi, a.AllocsPerAction)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.Ratios) > 0 {
		fmt.Fprintln(w, "\nratios (median over rounds of the first arm's actions/s over the second's):")
		keys := make([]string, 0, len(r.Ratios))
		for k := range r.Ratios {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, compareRatioKeys)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, k := range keys {
			fmt.Fprintf(tw, "  %s\t%.3f\n", k, r.Ratios[k])
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintln(w, "\ncommits and WAL are the server's counts over each arm's run: other clients' work in the database")
	fmt.Fprintln(w, "(commits) or the cluster (WAL) adds to them; '-' is a SQLite arm, which has neither")
	fmt.Fprintln(w, "FPI is how much of the WAL was full-page images, written by whichever arm first changes a page")
	fmt.Fprintln(w, "after a checkpoint; the WAL less them is what the arm's own writes cost")
	if r.Note != "" {
		fmt.Fprintln(w, r.Note)
	}
	if r.Schema != "" {
		fmt.Fprintf(w, "kept: schema %s", r.Schema)
		if r.EmptySchema != "" {
			fmt.Fprintf(w, ", empty log's schema %s", r.EmptySchema)
		}
		if r.Dir != "" {
			fmt.Fprintf(w, ", SQLite files in %s", r.Dir)
		}
		fmt.Fprintln(w)
	}
	return nil
}

// compareRatioKeys orders ratios by worker count, then by pair.
func compareRatioKeys(a, b string) int {
	pa, wa, _ := strings.Cut(a, "@")
	pb, wb, _ := strings.Cut(b, "@")
	na, _ := strconv.Atoi(wa)
	nb, _ := strconv.Atoi(wb)
	if na != nb {
		return na - nb
	}
	return strings.Compare(pa, pb)
}
