package cli

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/oncehq/once/internal/view"
	"github.com/oncehq/once/lab/chaos"
	"github.com/oncehq/once/lab/chaos/ha"
)

// startHA starts the pg_auto_failover cluster --ha runs the ledger on: a
// monitor, a primary and a synchronous standby (synchronous_commit on,
// synchronous_standby_names naming the standby), what once's guarantee
// needs from a database that fails over. The cluster makes its own
// directory (the postgres user it runs as must reach it) and removes it
// on Close.
var startHA = startCluster(true)

// startHAAsync is the same cluster with an asynchronous standby, which
// once's guarantee does not hold on: --ha-async shows what it loses.
var startHAAsync = startCluster(false)

func startCluster(sync bool) chaos.StartFailover {
	return func(ctx context.Context, _ string) (chaos.Failover, error) {
		c, err := ha.Start(ctx, ha.Config{Sync: sync})
		if err != nil {
			return nil, err
		}
		return &haCluster{c: c}, nil
	}
}

// haCluster is an ha.Cluster as the harness uses it. A second failover
// first brings the node the first one killed back as the standby, so
// there is always one to promote.
type haCluster struct {
	c      *ha.Cluster
	killed string // the node the last failover killed
}

func (h *haCluster) URL() string  { return h.c.URL() }
func (h *haCluster) Close() error { return h.c.Close() }
func (h *haCluster) KillPrimary(ctx context.Context) error {
	if h.killed != "" {
		if _, err := h.c.RestartNode(ctx, h.killed); err != nil {
			return err
		}
		h.killed = ""
	}
	f, err := h.c.KillPrimary(ctx)
	h.killed = f.Killed.Name
	return err
}

func defineChaos(fs *flagSet) func(env, []string) error {
	var o chaos.Options
	db := fs.db()
	fs.StringVar(&o.Queue, "queue", "", "the `QUEUE` the jobs go through: nats or rabbitmq (the run starts and restarts a broker of its own)")
	fs.require("queue")
	fs.IntVar(&o.Intents, "intents", 2000, "`N` intents, a third each of email, charge and post")
	fs.IntVar(&o.Workers, "workers", 4, "`N` worker processes")
	fs.IntVar(&o.Concurrency, "concurrency", 4, "`N` jobs each worker runs at once")
	fs.Uint64Var(&o.Seed, "seed", 0, "draw the faults from seed `N` (0 picks one; the report prints it)")
	fs.Float64Var(&o.FaultScale, "fault-scale", 1, "multiply the number of faults by `X`")
	fs.Func("faults", "schedule exactly the faults `LIST` names, as TYPE=N pairs separated by commas (kill, stop, conn, proxy, provider_timeout, broker, failover), in place of --fault-scale for those types", func(v string) error {
		m, err := parseCounts(v)
		o.FaultCounts = m
		return err
	})
	fs.BoolVar(&o.CrashBroker, "crash-broker", false, "restart the broker by SIGKILL, a crash, instead of a clean shutdown (on RabbitMQ a crash can lose retried jobs: see docs/chaos.md)")
	fs.BoolVar(&o.Naive, "naive", false, "run the naive check-then-send workers instead of once, to see duplicates")
	fs.StringVar(&o.SMTP, "smtp", "", "send the emails through this SMTP server (`HOST:PORT`) instead of the run's own; each intent has its own recipient")
	ha := fs.Bool("ha", false, "put the ledger on a pg_auto_failover primary with a synchronous standby, and kill the primary half way (--db is then not used)")
	haAsync := fs.Bool("ha-async", false, "as --ha, with an asynchronous standby, which once's guarantee does not hold on: shows what a failover loses (expect the run to fail)")
	fs.BoolVar(&o.Keep, "keep", false, "keep the run's schema and its directory of logs")
	fs.DurationVar(&o.Timeout, "timeout", 0, "give up after `DURATION` (default 10m)")
	asJSON := fs.Bool("json", false, "print the result as one JSON object")
	return func(e env, _ []string) error {
		if *ha && *haAsync {
			return usagef("--ha and --ha-async are two clusters; choose one")
		}
		if *haAsync {
			o.HA = startHAAsync
		} else if *ha {
			if startHA == nil {
				return errors.New("--ha needs the pg_auto_failover cluster (lab/chaos/ha), which this build does not include")
			}
			o.HA = startHA
		} else {
			o.DB = dbURL(*db)
		}
		return runChaos(e, o, *asJSON)
	}
}

func runChaos(e env, o chaos.Options, asJSON bool) error {
	if o.Queue != chaos.QueueNATS && o.Queue != chaos.QueueRabbitMQ {
		return usagef("--queue must be nats or rabbitmq, not %q", o.Queue)
	}
	if o.Seed == 0 {
		o.Seed = chaos.NewSeed()
	}
	bar := newBar(e.stderr, "", o.Intents)
	var started sync.Once
	o.Progress = func(p chaos.Progress) {
		// Once everything is up, so a run refused at the start says only why.
		started.Do(func() {
			fmt.Fprintf(e.stderr, "once chaos: seed %d (--seed %d draws the same faults)\n", o.Seed, o.Seed)
		})
		bar.update(p.Phase, p.Settled, p.Line())
	}
	rep, err := chaos.Run(e.ctx, o)
	bar.finish()
	if err != nil {
		// The command's name already heads the line.
		return errors.New(strings.TrimPrefix(err.Error(), "chaos: "))
	}
	if asJSON {
		if err := view.Encode(e.stdout, rep); err != nil {
			return err
		}
	} else if err := rep.WriteText(e.stdout); err != nil {
		return err
	}
	if !rep.OK() {
		return fmt.Errorf("invariants failed (seed %d reproduces the faults' draws): %s", rep.Seed, strings.Join(rep.Failures, "; "))
	}
	return nil
}

// parseCounts reads --faults: comma-separated TYPE=N pairs. The types
// are checked by the harness, which knows them.
func parseCounts(v string) (map[string]int, error) {
	m := map[string]int{}
	for pair := range strings.SplitSeq(v, ",") {
		name, n, ok := strings.Cut(strings.TrimSpace(pair), "=")
		count, err := strconv.Atoi(n)
		if !ok || name == "" || err != nil {
			return nil, fmt.Errorf("%q is not TYPE=N (for example broker=300)", pair)
		}
		m[name] = count
	}
	return m, nil
}
