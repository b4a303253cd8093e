package cli

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/oncehq/once/internal/view"
	"github.com/oncehq/once/lab/bench"
)

func defineBench(fs *flagSet) func(env, []string) error {
	db := fs.db()
	workers := fs.String("workers", "1,16,64", "run each arm with each of these worker counts, a comma-separated `LIST`")
	rounds := fs.Int("rounds", 5, "`N` rounds: each arm runs once per round at each worker count, in an order rotated each round")
	duration := fs.Duration("duration", 2*time.Second, "each arm runs for `DURATION` in each round")
	arms := fs.String("arms", "", "run only these `ARMS`, comma-separated: "+strings.Join(bench.Arms(), ", ")+" (default all)")
	scale := fs.Int("scale", 0, "first fill the action log and the raw table with `N` finished rows each (COPY), measure at that size, and run each PostgreSQL arm's twin (…_empty) on an empty log beside it")
	asJSON := fs.Bool("json", false, "print the result as one JSON object")
	keep := fs.Bool("keep", false, "keep the run's schemas (once_bench_…) and SQLite files")
	return func(e env, _ []string) error {
		o := bench.Options{DB: dbURL(*db), Rounds: *rounds, Duration: *duration, Scale: *scale, Keep: *keep}
		var err error
		if o.Workers, err = bench.ParseWorkers(*workers); err != nil {
			return usagef("--workers: %v", err)
		}
		if o.Arms, err = bench.ParseArms(*arms); err != nil {
			return usagef("--arms: %v", err)
		}
		// Zero is the package's default; here it is a mistake.
		if *rounds < 1 {
			return usagef("--rounds must be at least 1, not %d", *rounds)
		}
		if *duration <= 0 {
			return usagef("--duration must be positive, not %v", *duration)
		}
		return runBench(e, o, *asJSON)
	}
}

func runBench(e env, o bench.Options, asJSON bool) error {
	bar := newBar(e.stderr, "setup", 1)
	measuring := false
	o.Progress = func(p bench.Progress) {
		if p.Phase == "setup" {
			bar.update("setup", 0, p.Note)
			return
		}
		if !measuring {
			// The setup's bar ends; the line says how long the rest takes.
			measuring = true
			bar.finish()
			total := time.Duration(p.Steps) * o.Duration
			if total > time.Second {
				total = total.Round(time.Second)
			}
			fmt.Fprintf(e.stderr, "once bench: %d arm runs of %v each, about %v\n", p.Steps, o.Duration, total)
			bar = newBar(e.stderr, "measure", p.Steps)
		}
		note := ""
		if p.Arm != "" {
			note = fmt.Sprintf("%s, %d workers, round %d/%d", p.Arm, p.Workers, p.Round, p.Rounds)
		}
		bar.update("measure", p.Step, note)
	}
	rep, err := bench.Run(e.ctx, o)
	bar.finish()
	if err != nil {
		return errors.New(strings.TrimPrefix(err.Error(), "bench: "))
	}
	if asJSON {
		return view.Encode(e.stdout, rep)
	}
	return rep.WriteText(e.stdout)
}
