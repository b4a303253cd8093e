package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncehq/once/internal/childproc"
	"github.com/oncehq/once/internal/faultproxy"
)

// faultKind is one type of fault the run injects.
type faultKind int

const (
	faultKill faultKind = iota
	faultStop
	faultConn
	faultProxy
	faultProviderTimeout
	faultBroker
	faultFailover
	numFaults
)

var faultNames = [numFaults]string{"kill", "stop", "conn", "proxy", "provider_timeout", "broker", "failover"}

func (k faultKind) String() string { return faultNames[k] }

// counters counts the faults that happened.
type counters struct {
	n [numFaults]atomic.Int64
}

func (c *counters) add(k faultKind) { c.n[k].Add(1) }

func (c *counters) faults() Faults {
	return Faults{
		Kill: int(c.n[faultKill].Load()), Stop: int(c.n[faultStop].Load()), Conn: int(c.n[faultConn].Load()),
		Proxy: int(c.n[faultProxy].Load()), ProviderTimeout: int(c.n[faultProviderTimeout].Load()),
		Broker: int(c.n[faultBroker].Load()), Failover: int(c.n[faultFailover].Load()),
	}
}

// supervisor runs the worker processes and starts a worker again when it
// dies, as a process manager would.
type supervisor struct {
	exe    string
	env    func(slot int) []string
	logDir string

	mu       sync.Mutex
	procs    []*exec.Cmd // by slot; nil while one is being started again
	stopping bool
	starts   int
	wg       sync.WaitGroup
}

func (s *supervisor) start(workers int) {
	s.procs = make([]*exec.Cmd, workers)
	for slot := range workers {
		s.wg.Go(func() { s.keep(slot) })
	}
}

// keep runs slot's worker until the supervisor stops.
func (s *supervisor) keep(slot int) {
	for {
		s.mu.Lock()
		if s.stopping {
			s.mu.Unlock()
			return
		}
		cmd := exec.Command(s.exe)
		cmd.Env = append(os.Environ(), s.env(slot)...)
		// A worker must not outlive the harness, nor die with the
		// thread that started it (see childproc).
		cmd.SysProcAttr = childAttr()
		var exited <-chan error
		f, err := os.OpenFile(filepath.Join(s.logDir, fmt.Sprintf("worker-%d.log", slot)), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err == nil {
			cmd.Stdout, cmd.Stderr = f, f
			exited, err = childproc.Start(cmd)
		}
		if err == nil {
			s.procs[slot] = cmd
			s.starts++
		}
		s.mu.Unlock()
		if err == nil {
			<-exited
		}
		if f != nil {
			f.Close()
		}
		s.mu.Lock()
		s.procs[slot] = nil
		s.mu.Unlock()
		time.Sleep(100 * time.Millisecond)
	}
}

// killPid SIGKILLs pid if it is one of the workers, and reports whether
// it was.
func (s *supervisor) killPid(pid int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.procs {
		if c != nil && c.Process.Pid == pid {
			return c.Process.Signal(syscall.SIGKILL) == nil
		}
	}
	return false
}

// signal sends sig to slot's worker, unless skip says no, and returns
// its pid, or 0 when none was signalled.
func (s *supervisor) signal(slot int, sig syscall.Signal, skip func(pid int) bool) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.procs[slot%len(s.procs)]
	if c == nil || skip(c.Process.Pid) || c.Process.Signal(sig) != nil {
		return 0
	}
	return c.Process.Pid
}

// resume sends SIGCONT to pid if it is still a worker.
func (s *supervisor) resume(pid int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.procs {
		if c != nil && c.Process.Pid == pid {
			c.Process.Signal(syscall.SIGCONT)
		}
	}
}

// stop ends every worker: SIGTERM, and SIGKILL for any still running
// after grace.
func (s *supervisor) stop(grace time.Duration) {
	s.mu.Lock()
	s.stopping = true
	for _, c := range s.procs {
		if c != nil {
			c.Process.Signal(syscall.SIGCONT)
			c.Process.Signal(syscall.SIGTERM)
		}
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return
	case <-time.After(grace):
	}
	s.mu.Lock()
	for _, c := range s.procs {
		if c != nil {
			c.Process.Signal(syscall.SIGKILL)
		}
	}
	s.mu.Unlock()
	<-done
}

// scheduled is one fault of the schedule, drawn from the seed before the
// run: it fires once At intents are settled.
type scheduled struct {
	At      int
	Kind    faultKind
	Slot    int
	Variant int
}

// parseFaultCounts turns Options.FaultCounts into counts by kind,
// refusing a name it does not know and a count out of range.
func parseFaultCounts(m map[string]int) (map[faultKind]int, error) {
	out := map[faultKind]int{}
	for name, n := range m {
		k := slices.Index(faultNames[:], name)
		if k < 0 {
			return nil, fmt.Errorf("chaos: no fault type %q; the types are %s", name, strings.Join(faultNames[:], ", "))
		}
		if n < 0 || n > 100000 {
			return nil, fmt.Errorf("chaos: the count of %s faults must be between 0 and 100000, not %d", name, n)
		}
		out[faultKind(k)] = n
	}
	return out, nil
}

// schedule draws the scheduled faults of a run: counts scale with the
// intents (per hundred intents, times scale), at least one of each,
// unless fixed sets a type's count; each fires when a random share,
// between 5% and 85%, of the intents are settled. Failovers are spread
// evenly over the run instead, one by default.
func schedule(rng *rand.Rand, intents, workers int, scale float64, ha bool, fixed map[faultKind]int) []scheduled {
	per := func(per100 float64, most int) int {
		n := int(float64(intents) / 100 * per100 * scale)
		return min(max(n, 1), most)
	}
	counts := map[faultKind]int{
		faultKill:   per(1, 1000),
		faultStop:   per(0.5, 1000),
		faultConn:   per(1, 1000),
		faultProxy:  per(1, 1000),
		faultBroker: per(0.1, 4),
	}
	if ha {
		counts[faultFailover] = 1
	}
	for k, n := range fixed {
		if k == faultProviderTimeout || (k == faultFailover && !ha) {
			continue // planned per intent; a failover needs HA
		}
		counts[k] = n
	}
	var out []scheduled
	for k := faultKind(0); k < numFaults; k++ {
		for i := range counts[k] {
			at := int(float64(intents) * (0.05 + 0.8*rng.Float64()))
			if k == faultFailover {
				at = intents * (i + 1) / (counts[k] + 1)
			}
			out = append(out, scheduled{At: at, Kind: k, Slot: rng.IntN(workers), Variant: rng.IntN(2)})
		}
	}
	slices.SortStableFunc(out, func(a, b scheduled) int { return a.At - b.At })
	return out
}

// plans draws which intents' first application is followed by a kill or
// a withheld reply: per hundred intents, times scale, at least one of
// each for every kind; timeouts, if set, is the number of withheld
// replies instead (at most a third of the intents).
func plans(rng *rand.Rand, intents int, scale float64, timeouts int) []plan {
	p := make([]plan, intents)
	n := max(int(float64(intents)/100*scale), len(kinds))
	for _, pl := range []plan{planKill, planTimeout} {
		n := n
		if pl == planTimeout && timeouts > 0 {
			n = min(timeouts, intents/3)
		}
		for j := 0; j < n; j++ {
			// The j-th of each plan goes to kind j%3, so every kind
			// meets each plan.
			for try := 0; try < 100; try++ {
				i := rng.IntN(intents)
				if i%len(kinds) == j%len(kinds) && p[i] == planNone {
					p[i] = pl
					break
				}
			}
		}
	}
	return p
}

// injector carries out the schedule.
type injector struct {
	sup     *supervisor
	admin   *pgxpool.Pool
	appName string // the workers' application_name prefix
	proxies []*faultproxy.Proxy
	broker  broker
	ha      Failover
	count   *counters
	// crashBroker restarts the broker by SIGKILL instead of a clean
	// shutdown.
	crashBroker bool
	stopFor     time.Duration
	blackout    time.Duration
	logf        func(string, ...any)

	mu      sync.Mutex
	stopped map[int]bool // pids paused now
}

// run fires each scheduled fault once progress reaches it, until ctx
// ends. Each type of fault has a line of its own, so a long one (a
// pause, a broker restart) delays only the next of its type.
func (in *injector) run(ctx context.Context, faults []scheduled, progress func() int) {
	byKind := map[faultKind][]scheduled{}
	for _, f := range faults {
		byKind[f.Kind] = append(byKind[f.Kind], f)
	}
	var wg sync.WaitGroup
	for kind, line := range byKind {
		// Pauses overlap, up to half the workers at once, so they keep
		// up with the work; the other faults go one at a time.
		slots := make(chan struct{}, 1)
		if kind == faultStop {
			slots = make(chan struct{}, max(len(in.sup.procs)/2, 1))
		}
		wg.Go(func() {
			var running sync.WaitGroup
			defer running.Wait()
			for _, f := range line {
				for progress() < f.At {
					select {
					case <-ctx.Done():
						return
					case <-time.After(50 * time.Millisecond):
					}
				}
				select {
				case slots <- struct{}{}:
				case <-ctx.Done():
					return
				}
				running.Go(func() {
					defer func() { <-slots }()
					if err := in.fire(ctx, f); err != nil && ctx.Err() == nil {
						in.logf("fault %s: %v", f.Kind, err)
					}
				})
			}
		})
	}
	wg.Wait()
}

// target sends sig to slot's worker or, when it is being started again
// (or already paused), to the next one that runs, waiting for one for up
// to five seconds. It returns the pid, or 0.
func (in *injector) target(ctx context.Context, slot int, sig syscall.Signal) int {
	deadline := time.Now().Add(5 * time.Second)
	for {
		for j := range len(in.sup.procs) {
			if pid := in.sup.signal(slot+j, sig, in.isPaused); pid != 0 {
				if sig == syscall.SIGSTOP {
					in.paused(pid, true)
				}
				return pid
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return 0
		}
		pause(ctx, 50*time.Millisecond)
	}
}

func (in *injector) isPaused(pid int) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.stopped[pid]
}

func (in *injector) paused(pid int, on bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.stopped == nil {
		in.stopped = map[int]bool{}
	}
	if on {
		in.stopped[pid] = true
	} else {
		delete(in.stopped, pid)
	}
}

func (in *injector) fire(ctx context.Context, f scheduled) error {
	switch f.Kind {
	case faultKill:
		if in.target(ctx, f.Slot, syscall.SIGKILL) != 0 {
			in.count.add(faultKill)
		}
	case faultStop:
		pid := in.target(ctx, f.Slot, syscall.SIGSTOP)
		if pid == 0 {
			return nil
		}
		in.count.add(faultStop)
		pause(ctx, in.stopFor)
		in.sup.resume(pid)
		in.paused(pid, false)
	case faultConn:
		// One worker's connections, or every worker's.
		pattern := fmt.Sprintf("%s-w%d", in.appName, f.Slot)
		if f.Variant == 1 {
			pattern = in.appName + "-w%"
		}
		// A worker started a moment ago may not have connected yet, an
		// idle one (its queue's broker restarting) may hold none, and
		// one whose connections were just cut opens them again only
		// when it next needs one: after a moment, any worker's. Waiting
		// seconds for one worker made a fault cost seconds, and a long
		// run ended before hundreds of them had fired.
		for try := 0; try < 60; try++ {
			if try == 2 {
				pattern = in.appName + "-w%"
			}
			var n int
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := in.admin.QueryRow(cctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name LIKE $1`, pattern).Scan(&n)
			cancel()
			if err != nil {
				return err
			}
			if n > 0 {
				in.count.add(faultConn)
				return nil
			}
			pause(ctx, 100*time.Millisecond)
		}
	case faultProxy:
		in.count.add(faultProxy)
		if f.Variant == 1 {
			// A black hole: every byte is dropped and nobody is told,
			// until the connections are cut.
			for _, p := range in.proxies {
				p.Blackout(true)
			}
			pause(ctx, in.blackout)
			for _, p := range in.proxies {
				p.Blackout(false)
			}
		}
		for _, p := range in.proxies {
			p.Reset()
		}
	case faultBroker:
		in.count.add(faultBroker)
		return in.broker.Restart(ctx, in.crashBroker)
	case faultFailover:
		if in.ha == nil {
			return nil
		}
		in.count.add(faultFailover)
		return in.ha.KillPrimary(ctx)
	case faultProviderTimeout:
		// Planned per intent, carried out by the providers.
	}
	return nil
}
