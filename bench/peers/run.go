package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// options are what one run measures.
type options struct {
	// db is the server and database the run connects to first; each
	// contender gets a database of its own on the same server.
	db string
	// workers are the goroutine counts to measure at, in order.
	workers []int
	// rounds is how many turns each arm gets at each worker count.
	rounds int
	// duration is one turn's length.
	duration time.Duration
	// arms are the arms to measure (allArms' names).
	arms []string
	// progress gets a line after every turn; nil discards.
	progress io.Writer
	// inspect, when set, is called after the last turn and before the
	// contenders' databases are dropped.
	inspect func(ctx context.Context, contenders map[string]*contender) error
}

func (o options) check() error {
	if len(o.workers) == 0 {
		return errors.New("no worker counts: pass --workers, e.g. 1,16,64")
	}
	for _, w := range o.workers {
		if w < 1 {
			return fmt.Errorf("--workers has %d; every count must be at least 1", w)
		}
	}
	if o.rounds < 1 {
		return fmt.Errorf("--rounds is %d; it must be at least 1", o.rounds)
	}
	if o.duration <= 0 {
		return fmt.Errorf("--duration is %v; it must be positive", o.duration)
	}
	if len(o.arms) == 0 {
		return errors.New("no arms: pass --arms with some of " + fmt.Sprint(allArms))
	}
	for _, a := range o.arms {
		if !slices.Contains(allArms, a) {
			return fmt.Errorf("--arms names %q; the arms are %v", a, allArms)
		}
	}
	return nil
}

// report is a run's result, as --json prints it.
type report struct {
	Arms []armReport `json:"arms"`
	// Ratios holds, for every other arm X and worker count W,
	// "do/X@W": the median over rounds of do's actions/s divided by X's
	// in the same round.
	Ratios map[string]float64 `json:"ratios"`
}

// armReport is one arm at one worker count, over all its rounds.
type armReport struct {
	Name    string `json:"name"`
	Workers int    `json:"workers"`
	// ActionsPerS is the median over rounds.
	ActionsPerS float64 `json:"actions_per_s"`
	// P50us and P99us are the latencies of all the rounds' calls together,
	// in microseconds. A river_insert_many call does insertManyBatch
	// actions, each of which waits for the whole call.
	P50us float64 `json:"p50_us"`
	P99us float64 `json:"p99_us"`
	// CommitsPerAction is the median over rounds of committed transactions
	// (read-only ones too) in the contender's database per action.
	CommitsPerAction float64 `json:"commits_per_action"`
	// WALBytesPerAction is the median over rounds of the server's WAL
	// written per action: the whole server's, so anything else running
	// on it is counted too.
	WALBytesPerAction float64 `json:"wal_bytes_per_action"`

	// actions and retries are totals over the rounds, for tests: retries
	// are calls refused at the server's connection limit and done again.
	actions, retries int64
}

// turn is one arm's measurement in one round.
type turn struct {
	actions int64
	elapsed time.Duration
	latency []time.Duration
	commits int64
	wal     int64
	retries int64
}

func (t turn) perSecond() float64 { return float64(t.actions) / t.elapsed.Seconds() }

// contenderOf names the contender an arm belongs to.
func contenderOf(armName string) string {
	switch armName {
	case armDo:
		return "do"
	case armDBOSWorkflow:
		return "dbos"
	default:
		return "river"
	}
}

// run sets the contenders up, measures every arm at every worker count
// in rounds, and removes what it made, also when it fails.
func run(ctx context.Context, o options) (rep report, err error) {
	if err := o.check(); err != nil {
		return report{}, err
	}
	if o.progress == nil {
		o.progress = io.Discard
	}
	ad, err := openAdmin(ctx, o.db)
	if err != nil {
		return report{}, err
	}
	cleanupCtx := context.WithoutCancel(ctx)
	defer func() { err = errors.Join(err, ad.close(cleanupCtx)) }()

	idBytes := make([]byte, 4)
	rand.Read(idBytes)
	runID := hex.EncodeToString(idBytes)
	// One pool per contender, big enough for the most workers and the
	// library's own connections; only the arm whose turn it is holds
	// connections (settle empties the pool after each turn).
	poolSize := slices.Max(o.workers) + 4

	contenders := map[string]*contender{}
	var order []string
	for _, a := range o.arms {
		if name := contenderOf(a); !slices.Contains(order, name) {
			order = append(order, name)
		}
	}
	defer func() {
		for _, name := range order {
			c := contenders[name]
			if c == nil {
				continue
			}
			if c.close != nil {
				err = errors.Join(err, c.close(cleanupCtx))
			}
			if c.pool != nil {
				c.pool.Close()
			}
			err = errors.Join(err, ad.dropDatabase(cleanupCtx, c.db))
		}
	}()
	for _, name := range order {
		c := &contender{name: name, db: "once_peers_" + runID + "_" + name}
		if err := ad.createDatabase(ctx, c.db); err != nil {
			return report{}, err
		}
		contenders[name] = c
		if c.pool, err = ad.openPool(ctx, c.db, poolSize); err != nil {
			return report{}, err
		}
		switch name {
		case "do":
			err = setupDo(ctx, c, runID)
		case "dbos":
			err = setupDBOS(ctx, c, runID)
		case "river":
			err = setupRiver(ctx, c)
		}
		if err != nil {
			return report{}, fmt.Errorf("setting up %s: %w", name, err)
		}
		if err := ad.settle(ctx, c.db, c.pool); err != nil {
			return report{}, err
		}
	}
	var arms []*arm
	for _, name := range allArms {
		if !slices.Contains(o.arms, name) {
			continue
		}
		for _, a := range contenders[contenderOf(name)].arms {
			if a.name == name {
				a.owner = contenders[contenderOf(name)]
				arms = append(arms, a)
			}
		}
	}

	seq := map[string]*atomic.Int64{}
	for _, a := range arms {
		seq[a.name] = new(atomic.Int64)
	}
	turns := map[string]map[int][]turn{}
	for _, a := range arms {
		turns[a.name] = map[int][]turn{}
	}
	for _, w := range o.workers {
		for r := range o.rounds {
			for i := range arms {
				a := arms[(i+r)%len(arms)]
				t, err := measure(ctx, ad, a, seq[a.name], w, o.duration)
				if err != nil {
					return report{}, err
				}
				turns[a.name][w] = append(turns[a.name][w], t)
				fmt.Fprintf(o.progress, "peers: %d workers, round %d/%d, %-17s %9.0f actions/s  p50 %7.0fµs  p99 %7.0fµs  %.2f commits/action\n",
					w, r+1, o.rounds, a.name, t.perSecond(), micros(percentile(t.latency, 0.50)), micros(percentile(t.latency, 0.99)),
					float64(t.commits)/float64(t.actions))
			}
		}
	}
	if o.inspect != nil {
		if err := o.inspect(ctx, contenders); err != nil {
			return report{}, err
		}
	}
	return summarize(arms, o.workers, turns), nil
}

// measure gives arm a one turn of d with the given number of workers, each
// calling it in a loop with a new n each time.
func measure(ctx context.Context, ad *admin, a *arm, seq *atomic.Int64, workers int, d time.Duration) (turn, error) {
	c := a.owner
	if err := warm(ctx, c.pool, workers); err != nil {
		return turn{}, fmt.Errorf("opening %d connections for %s: %w", workers, a.name, err)
	}
	before, err := ad.counters(ctx, c.db)
	if err != nil {
		return turn{}, err
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	latency := make([][]time.Duration, workers)
	retries := make([]int64, workers)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for i := range workers {
		wg.Go(func() {
			for time.Now().Before(deadline) && wctx.Err() == nil {
				n := seq.Add(1)
				t0 := time.Now()
				err := a.call(wctx, n)
				took := time.Since(t0)
				if err != nil {
					if tooManyClients(err) {
						retries[i]++
						time.Sleep(50 * time.Millisecond)
						continue
					}
					if wctx.Err() == nil {
						errs[i] = fmt.Errorf("%s at %d workers: %w", a.name, workers, err)
					}
					cancel()
					return
				}
				latency[i] = append(latency[i], took)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return turn{}, err
	}
	if err := ctx.Err(); err != nil {
		return turn{}, err
	}
	if err := ad.settle(ctx, c.db, c.pool); err != nil {
		return turn{}, err
	}
	after, err := ad.counters(ctx, c.db)
	if err != nil {
		return turn{}, err
	}
	wal, err := ad.walSince(ctx, before.lsn)
	if err != nil {
		return turn{}, err
	}
	t := turn{elapsed: elapsed, commits: after.commits - before.commits, wal: wal}
	for i := range workers {
		t.latency = append(t.latency, latency[i]...)
		t.retries += retries[i]
	}
	t.actions = int64(len(t.latency) * a.batch)
	if t.actions == 0 {
		return turn{}, fmt.Errorf("%s at %d workers did no action in %v", a.name, workers, d)
	}
	return t, nil
}

// summarize reduces the turns to one armReport per arm and worker count,
// and the ratios of do to every other arm.
func summarize(arms []*arm, workers []int, turns map[string]map[int][]turn) report {
	rep := report{Ratios: map[string]float64{}}
	for _, w := range workers {
		for _, a := range arms {
			ts := turns[a.name][w]
			var lat []time.Duration
			var perS, commits, wal []float64
			ar := armReport{Name: a.name, Workers: w}
			for _, t := range ts {
				lat = append(lat, t.latency...)
				perS = append(perS, t.perSecond())
				commits = append(commits, float64(t.commits)/float64(t.actions))
				wal = append(wal, float64(t.wal)/float64(t.actions))
				ar.actions += t.actions
				ar.retries += t.retries
			}
			slices.Sort(lat)
			ar.ActionsPerS = round(median(perS), 1)
			ar.P50us = round(micros(percentileSorted(lat, 0.50)), 1)
			ar.P99us = round(micros(percentileSorted(lat, 0.99)), 1)
			ar.CommitsPerAction = round(median(commits), 3)
			ar.WALBytesPerAction = round(median(wal), 1)
			rep.Arms = append(rep.Arms, ar)
		}
		do := turns[armDo][w]
		if do == nil {
			continue
		}
		for _, a := range arms {
			if a.name == armDo {
				continue
			}
			var ratios []float64
			for r, t := range turns[a.name][w] {
				ratios = append(ratios, do[r].perSecond()/t.perSecond())
			}
			rep.Ratios[fmt.Sprintf("do/%s@%d", a.name, w)] = round(median(ratios), 3)
		}
	}
	return rep
}
