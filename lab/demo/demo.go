// Package demo runs the seed's story for real: a queue that delivers at
// least once, worker processes that send emails over SMTP and are killed
// with SIGKILL at random moments — including between the server's
// acceptance and the record — and the same workload twice, once with the
// naive "check, then send" and once through once.
//
// It is part of the lab module (github.com/oncehq/once/lab): the project's
// harnesses and tools, not a stable API; it may change in any release.
package demo

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/dburl"
)

// Options configures a demo run.
type Options struct {
	// DB is the action log for the once half (a URL as the command takes).
	DB string
	// SMTP is an external server's host:port; empty starts one on
	// loopback that counts what it accepts.
	SMTP string
	// Intents is the number of emails to send in each half. Zero means 200.
	Intents int
	// Workers is the number of worker processes. Zero means 4.
	Workers int
	// Progress, if set, is told how far each half has got.
	Progress func(half string, acked, total, kills int)
	// Seed fixes the random kills; zero picks one.
	Seed uint64
	// KillBeforeLog places half the deliberate kills after the server's
	// acceptance and before the worker logs it, where a random kill can
	// land too: with SMTP, those sends are known only to the server, and
	// the counts become ranges. The command leaves it off, so that the
	// log misses only what random kills hide from it.
	KillBeforeLog bool
}

// Naive is what the naive half did.
type Naive struct {
	Delivered  int `json:"delivered"`
	Duplicates int `json:"duplicates"`
	Lost       int `json:"lost"`
	Bounds
}

// Once is what the once half did.
type Once struct {
	Delivered  int `json:"delivered"`
	Duplicates int `json:"duplicates"`
	Review     int `json:"review"`
	Lost       int `json:"lost"`
	Bounds
}

// Bounds say how sure a half's counts are. Delivered and Duplicates
// count only messages the server is known to have accepted, so they are
// lower bounds, and Lost counts intents with no such message, an upper
// bound; the fields here are the other end of each range, had every
// unknown send been accepted. With the demo's own server, which counts
// what it accepts, SendsUnknown is 0 and each range is one number.
type Bounds struct {
	// SendsAccepted is the number of messages the server is known to
	// have accepted.
	SendsAccepted int `json:"sends_accepted"`
	// SendsUnknown is the number of sends whose reply no worker logged:
	// the worker was killed after it began the SMTP transaction and
	// before it logged how it ended (or the reply never came). The
	// server may or may not have accepted each of them.
	SendsUnknown     int `json:"sends_unknown"`
	DeliveredAtMost  int `json:"delivered_at_most"`
	DuplicatesAtMost int `json:"duplicates_at_most"`
	LostAtLeast      int `json:"lost_at_least"`
}

// Report is the result; its JSON is what `once demo --json` prints.
type Report struct {
	Intents int     `json:"intents"`
	Workers int     `json:"workers"`
	Kills   int     `json:"kills"`
	Naive   Naive   `json:"naive"`
	Once    Once    `json:"once"`
	Run     string  `json:"run"`
	DB      string  `json:"db"`
	SMTP    string  `json:"smtp"`
	Seconds float64 `json:"seconds"`
	// Counted says where delivery counts come from: the demo's own SMTP
	// server, or, with --smtp, the workers' log of the server's replies.
	Counted string `json:"counted"`
	// Exact is true when every count is exact: always with the demo's
	// own server; with --smtp, when every send's reply was logged. When
	// it is false, see each half's Bounds.
	Exact bool `json:"exact"`
	// Recipients is the pattern of the recipients, one per intent, by
	// which the server's own log can be searched.
	Recipients string `json:"recipients"`
}

// Report.Counted's values.
const (
	countedByServer = "the demo's SMTP server"
	countedByLog    = "the workers' log of the server's replies"
)

// count makes a half's counts from its tally. reviewed reports whether
// a job's action waits for a person, which is not a loss.
func count(t tally, reviewed func(job int) bool) (delivered, duplicates, lost int, b Bounds) {
	for i, a := range t.accepted {
		most := a + t.unknown[i]
		b.SendsAccepted += a
		b.SendsUnknown += t.unknown[i]
		if a > 0 {
			delivered++
			duplicates += a - 1
		} else if !reviewed(i) {
			lost++
		}
		if most > 0 {
			b.DeliveredAtMost++
			b.DuplicatesAtMost += most - 1
		} else if !reviewed(i) {
			b.LostAtLeast++
		}
	}
	return delivered, duplicates, lost, b
}

// Run runs both halves and reports.
func Run(ctx context.Context, opts Options) (Report, error) {
	started := time.Now()
	if opts.Intents == 0 {
		opts.Intents = 200
	}
	if opts.Workers == 0 {
		opts.Workers = 4
	}
	if opts.Intents < 0 || opts.Intents > 100000 || opts.Workers < 1 || opts.Workers > 64 {
		return Report{}, fmt.Errorf("--intents must be 1 to 100000 and --workers 1 to 64")
	}
	if opts.Seed == 0 {
		opts.Seed = mrand.Uint64()
	}
	if opts.SMTP != "" {
		if err := checkSMTP(opts.SMTP); err != nil {
			return Report{}, err
		}
	}
	store, err := dburl.Open(ctx, opts.DB)
	if err != nil {
		return Report{}, err
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		return Report{}, err
	}
	tmp, err := os.MkdirTemp("", "once-demo")
	if err != nil {
		return Report{}, err
	}
	defer os.RemoveAll(tmp)

	rep := Report{Intents: opts.Intents, Workers: opts.Workers, DB: store.Name, Run: newRunID()}
	rep.Recipients = fmt.Sprintf("{naive,once}-N-%s@demo.once.localhost", rep.Run[5:13])
	var mail *mailServer
	sendLog := ""
	if opts.SMTP == "" {
		if mail, err = startMailServer(); err != nil {
			return Report{}, err
		}
		defer mail.close()
		rep.SMTP, rep.Counted = mail.addr(), countedByServer
	} else {
		rep.SMTP, rep.Counted = opts.SMTP, countedByLog
		sendLog = filepath.Join(tmp, "sends.log")
	}

	naiveDB := filepath.Join(tmp, "naive.db")
	if err := createNaive(naiveDB); err != nil {
		return Report{}, err
	}
	for _, half := range []string{"naive", "once"} {
		jobs := make([]Job, opts.Intents)
		for i := range jobs {
			unlogged := opts.KillBeforeLog && i%16 == 3
			jobs[i] = Job{ID: i, Run: rep.Run, Rcpt: fmt.Sprintf("%s-%d-%s@demo.once.localhost", half, i, rep.Run[5:13]),
				Subject: fmt.Sprintf("Your report #%d", i), PauseAfterSend: i%8 == 3 && !unlogged, PauseBeforeLog: unlogged}
		}
		cfg := workerConfig{Mode: half, SMTP: rep.SMTP, DB: opts.DB, NaiveDB: naiveDB, SendLog: sendLog, Lease: "1s"}
		kills, err := runHalf(ctx, jobs, cfg, opts, opts.Seed)
		rep.Kills += kills
		if err != nil {
			return rep, err
		}
		var t tally
		if mail != nil {
			t = tallyServer(mail, jobs)
		} else if t, err = tallyLog(sendLog, half, jobs); err != nil {
			return rep, err
		}
		if half == "naive" {
			rep.Naive.Delivered, rep.Naive.Duplicates, rep.Naive.Lost, rep.Naive.Bounds = count(t, func(int) bool { return false })
			continue
		}
		review, err := store.List(ctx, once.Filter{Run: rep.Run, Status: once.StatusReview, Limit: opts.Intents + 1})
		if err != nil {
			return rep, err
		}
		inReview := map[string]bool{}
		for _, a := range review {
			inReview[a.Target] = true
		}
		rep.Once.Review = len(review)
		rep.Once.Delivered, rep.Once.Duplicates, rep.Once.Lost, rep.Once.Bounds = count(t, func(i int) bool { return inReview[jobs[i].Rcpt] })
	}
	rep.Exact = rep.Naive.SendsUnknown == 0 && rep.Once.SendsUnknown == 0
	rep.Seconds = math.Round(time.Since(started).Seconds()*100) / 100
	return rep, nil
}

func newRunID() string {
	var b [6]byte
	rand.Read(b[:])
	return "demo-" + hex.EncodeToString(b[:])
}

func createNaive(path string) error {
	db, err := sql.Open("sqlite", path+"?_pragma=journal_mode(WAL)")
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.Exec(`CREATE TABLE sent (rcpt TEXT PRIMARY KEY)`)
	return err
}

// supervisor keeps the worker processes running and kills them.
type supervisor struct {
	mu     sync.Mutex
	procs  []*os.Process
	kills  int
	failed int
	last   string
}

func (s *supervisor) kill(slot, pid int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.procs[slot]
	if p == nil || (pid != 0 && p.Pid != pid) {
		return false
	}
	if p.Signal(syscall.SIGKILL) == nil {
		s.kills++
		s.procs[slot] = nil
		return true
	}
	return false
}

// stopAll ends every worker still running, without counting it as one of
// the demo's kills.
func (s *supervisor) stopAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, p := range s.procs {
		if p != nil {
			p.Kill()
			s.procs[i] = nil
		}
	}
}

// runHalf drains one queue with worker processes, killing them as it
// goes, and returns the number of kills.
func runHalf(ctx context.Context, jobs []Job, cfg workerConfig, opts Options, seed uint64) (int, error) {
	rng := mrand.New(mrand.NewPCG(seed, uint64(len(cfg.Mode))))
	exe, err := os.Executable()
	if err != nil {
		return 0, err
	}
	sup := &supervisor{procs: make([]*os.Process, opts.Workers)}
	onPause := func(slot, pid int) {
		if slot >= 0 && slot < opts.Workers {
			sup.kill(slot, pid)
		}
	}
	var onAck func(int)
	if opts.Progress != nil {
		onAck = func(n int) {
			sup.mu.Lock()
			k := sup.kills
			sup.mu.Unlock()
			opts.Progress(cfg.Mode, n, len(jobs), k)
		}
	}
	q, err := newQueue(jobs, 3*time.Second, onPause, onAck)
	if err != nil {
		return 0, err
	}
	defer q.close()
	cfg.Queue = q.url()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	stop := make(chan struct{})
	fatal := make(chan error, 1)
	var wg sync.WaitGroup
	for slot := range opts.Workers {
		wg.Go(func() {
			wc := cfg
			wc.Slot = slot
			conf, _ := json.Marshal(wc)
			for {
				select {
				case <-stop:
					return
				default:
				}
				cmd := exec.Command(exe)
				cmd.Env = append(os.Environ(), envWorker+"="+string(conf))
				var errOut strings.Builder
				cmd.Stderr = &errOut
				if err := cmd.Start(); err != nil {
					select {
					case fatal <- err:
					default:
					}
					return
				}
				sup.mu.Lock()
				sup.procs[slot] = cmd.Process
				sup.mu.Unlock()
				werr := cmd.Wait()
				sup.mu.Lock()
				if sup.procs[slot] == cmd.Process {
					sup.procs[slot] = nil
				}
				sup.mu.Unlock()
				q.workerDied(slot)
				var ee *exec.ExitError
				if errors.As(werr, &ee) && !ee.Sys().(syscall.WaitStatus).Signaled() {
					sup.mu.Lock()
					sup.failed++
					sup.last = errOut.String()
					n := sup.failed
					sup.mu.Unlock()
					if n > 20 {
						select {
						case fatal <- fmt.Errorf("workers keep failing; the last said: %s", strings.TrimSpace(errOut.String())):
						default:
						}
						return
					}
					time.Sleep(50 * time.Millisecond)
				}
				if werr == nil {
					return // the queue is drained
				}
			}
		})
	}
	// Random kills, at random moments, on top of the ones placed between
	// the send and the record.
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(150+rng.IntN(350)) * time.Millisecond):
				sup.kill(rng.IntN(opts.Workers), 0)
			}
		}
	}()
	var runErr error
	select {
	case <-q.done:
	case err := <-fatal:
		runErr = err
	case <-ctx.Done():
		runErr = fmt.Errorf("the %s half did not finish (%w); still waiting: %s", cfg.Mode, ctx.Err(), q.pending())
	}
	close(stop)
	sup.stopAll()
	wg.Wait()
	sup.mu.Lock()
	defer sup.mu.Unlock()
	return sup.kills, runErr
}
