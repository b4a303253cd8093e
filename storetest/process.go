package storetest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/oncehq/once"
)

// Worker processes are the test binary itself, re-executed with these
// variables set; MaybeChild, called first thing in TestMain, runs the
// worker and exits.
const (
	envMode = "ONCE_STORETEST_CHILD"
	envSpec = "ONCE_STORETEST_SPEC"
	envFile = "ONCE_STORETEST_FILE"
	// envLease sets the worker's lease, so a killed or stopped worker's
	// claim lapses within the test.
	envLease = "ONCE_STORETEST_LEASE"
	// envHangAfter makes the run5 worker stop after that many steps.
	envHangAfter = "ONCE_STORETEST_HANG_AFTER"
	// envRecovery sets the worker's recovery for its kind, so the row it
	// claims records the policy the test's own client has.
	envRecovery = "ONCE_STORETEST_RECOVERY"
)

// childRecovery remembers, by spec, the recovery each test's client has
// for the worker's kind, so worker processes claim under the same one.
var childRecovery sync.Map

// MaybeChild runs a worker and exits when the process was started as one
// by this suite; otherwise it returns at once. Call it first in TestMain.
func MaybeChild(open func(ctx context.Context, spec string) (once.Store, error)) {
	mode := os.Getenv(envMode)
	if mode == "" {
		return
	}
	err := child(mode, os.Getenv(envSpec), os.Getenv(envFile), open)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func child(mode, spec, file string, open func(context.Context, string) (once.Store, error)) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := open(ctx, spec)
	if err != nil {
		return err
	}
	defer closeStore(s)
	if mode == "claim" {
		return claimChild(ctx, s, file)
	}
	if mode == "approve" {
		return approveChild(ctx, s)
	}
	lease, _ := time.ParseDuration(os.Getenv(envLease))
	pol := once.KindPolicy{Lease: lease, Recovery: once.ParseRecovery(os.Getenv(envRecovery))}
	if pol.Recovery == once.VerifyThenDecide {
		// The worker never recovers; only its claim records the mode.
		pol.Verifier = func(context.Context, once.Action) (bool, json.RawMessage, error) {
			return false, nil, errors.New("the worker process does not verify")
		}
	}
	c, err := once.New(once.Config{Store: s, Default: pol})
	if err != nil {
		return err
	}
	effect := func(ctx context.Context, a once.Attempt) (int, error) {
		if mode == "note" {
			// Paused by the parent (SIGSTOP) before its note, past its
			// lease; let go, it notes, and starts the effect only if
			// the note was written.
			if err := appendLine(file, fmt.Sprintf("noting pid=%d attempt=%d", os.Getpid(), a.Number)); err != nil {
				return 0, once.RetryLater(err)
			}
			for !exists(file + ".go") {
				time.Sleep(5 * time.Millisecond)
			}
			if err := a.Note(ctx, fmt.Sprintf("sending pid=%d", os.Getpid())); err != nil {
				return 0, err
			}
			return os.Getpid(), appendLine(file+".effect", "effect")
		}
		// The effect: an append to a file the parent counts, standing for
		// an email handed to a server.
		if err := appendLine(file, fmt.Sprintf("effect pid=%d attempt=%d provider=%s", os.Getpid(), a.Number, a.ProviderKey)); err != nil {
			return 0, once.RetryLater(err)
		}
		switch mode {
		case "race":
			time.Sleep(100 * time.Millisecond) // widen the window
		case "hang":
			// Effect done, record not yet written: the parent kills us here.
			select {}
		case "zombie":
			// Effect done; the parent stops this process (SIGSTOP), lets
			// the lease lapse, recovers, and lets it go on (SIGCONT).
			for !exists(file + ".go") {
				time.Sleep(5 * time.Millisecond)
			}
		}
		return os.Getpid(), nil
	}
	if mode == "run5" {
		return runFive(ctx, c, file, os.Getenv(envHangAfter))
	}
	res, err := once.Do(ctx, c, processIntent, effect)
	switch {
	case errors.Is(err, once.ErrInFlight):
		fmt.Println("inflight")
	case errors.Is(err, once.ErrFenced):
		fmt.Println("fenced")
	case err != nil:
		return err
	case res.Replayed:
		fmt.Println("replayed")
	default:
		fmt.Println("executed")
	}
	return nil
}

// runFive is an agent run of five steps: three emails and two records.
// With hangAfter set it stops dead after that many steps, for the parent
// to kill.
func runFive(ctx context.Context, c *once.Client, file, hangAfter string) error {
	run := c.Run("agent-run-5")
	kinds := []string{"send_email", "write_record", "send_email", "write_record", "send_email"}
	for i, kind := range kinds {
		if hangAfter == fmt.Sprint(i) {
			appendLine(file+".paused", "paused")
			select {}
		}
		_, err := once.Do(ctx, c, run.Next(once.Intent{Kind: kind, Target: fmt.Sprintf("target-%d", i), Payload: map[string]int{"step": i}}),
			func(ctx context.Context, a once.Attempt) (string, error) {
				return fmt.Sprintf("done-%d", i), appendLine(file, fmt.Sprintf("step %d", a.Intent.Step))
			})
		if err != nil {
			return err
		}
	}
	fmt.Println("run complete")
	return nil
}

// claimChild is a worker of the Store contract's process race: it claims
// with the store alone, and the winner runs the effect and records it.
func claimChild(ctx context.Context, s once.Store, file string) error {
	req := processClaim()
	cr, err := s.Claim(ctx, req)
	if err != nil {
		return err
	}
	if !cr.Claimed {
		fmt.Println("held")
		return nil
	}
	if err := appendLine(file, fmt.Sprintf("effect pid=%d attempt=%d", os.Getpid(), cr.Action.Attempt)); err != nil {
		return err
	}
	time.Sleep(100 * time.Millisecond) // widen the window
	ok, err := s.Transition(ctx, once.Transition{Key: req.Key, Attempt: cr.Action.Attempt, From: []once.Status{once.StatusInFlight}, To: once.StatusSucceeded,
		Result: []byte(fmt.Sprint(os.Getpid())), Event: once.Event{Type: once.EventSucceeded, From: once.StatusInFlight, Actor: once.ActorWorker}})
	if err != nil {
		return err
	}
	if !ok {
		return errors.New("the winning claim's own transition was refused")
	}
	fmt.Println("claimed")
	return nil
}

// processClaim is the claim Do would make for processIntent.
func processClaim() once.ClaimRequest {
	k, fp, _ := once.KeyOf(processIntent)
	in := processIntent
	return once.ClaimRequest{Key: k, Fingerprint: fp, Run: in.Run, Step: in.Step, Kind: in.Kind, Target: in.Target, Lease: time.Minute}
}

var processIntent = once.Intent{Run: "proc-run", Step: 3, Kind: "send_email", Target: "grace@example.com", Payload: map[string]string{"body": "hi"}}

func appendLine(file, line string) error {
	f, err := os.OpenFile(file, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintln(f, line); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func startChild(t *testing.T, mode, spec, file string, env ...string) (*exec.Cmd, *syncBuf) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envMode+"="+mode, envSpec+"="+spec, envFile+"="+file)
	if r, ok := childRecovery.Load(spec); ok {
		cmd.Env = append(cmd.Env, envRecovery+"="+r.(once.Recovery).String())
	}
	cmd.Env = append(cmd.Env, env...)
	out := &syncBuf{}
	cmd.Stdout = out
	cmd.Stderr = out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start worker: %v", err)
	}
	return cmd, out
}

// syncBuf collects a worker's output; it may be read while the worker
// still writes.
type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func effectLines(t *testing.T, file string) int {
	t.Helper()
	f, err := os.Open(file)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n++
	}
	return n
}

func processTests() []namedTest {
	return []namedTest{
		{name: "DoRace4Processes", fn: testDoRaceProcesses, needs: needProcesses},
		{name: "KilledAfterEffect", fn: testKilledAfterEffect, needs: needProcesses},
	}
}

// testClaimRaceProcesses races four processes for one claim through the
// Store alone: one wins, runs the effect and records it.
func testClaimRaceProcesses(t *testing.T, h Harness) {
	s, spec := newStore(t, h)
	file := filepath.Join(t.TempDir(), "effects")
	counts := raceChildren(t, "claim", spec, file, 4)
	if got := effectLines(t, file); got != 1 {
		t.Fatalf("effect ran %d times across 4 processes, want 1 (outcomes %v)", got, counts)
	}
	if counts["claimed"] != 1 || counts["held"] != 3 {
		t.Fatalf("outcomes %v, want one claimed and three held", counts)
	}
	k := processClaim().Key
	if a := mustGet(t, s, k); a.Status != once.StatusSucceeded || a.Attempt != 1 {
		t.Fatalf("stored %+v", a)
	}
	if got := trail(t, s, k); got != "claimed,succeeded" {
		t.Fatalf("trail %s", got)
	}
}

// raceChildren starts n workers in mode at once, waits for them all, and
// counts what they printed.
func raceChildren(t *testing.T, mode, spec, file string, n int) map[string]int {
	t.Helper()
	var cmds []*exec.Cmd
	var outs []*syncBuf
	for range n {
		cmd, out := startChild(t, mode, spec, file)
		cmds = append(cmds, cmd)
		outs = append(outs, out)
	}
	counts := map[string]int{}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("worker %d: %v\n%s", i, err, outs[i])
		}
		counts[strings.TrimSpace(outs[i].String())]++
	}
	return counts
}

func testDoRaceProcesses(t *testing.T, h Harness) {
	_, spec := newStore(t, h)
	file := filepath.Join(t.TempDir(), "effects")
	const n = 4
	counts := raceChildren(t, "race", spec, file, n)
	if got := effectLines(t, file); got != 1 {
		t.Fatalf("effect ran %d times across %d processes, want 1 (outcomes %v)", got, n, counts)
	}
	if counts["executed"] != 1 || counts["executed"]+counts["replayed"]+counts["inflight"] != n {
		t.Fatalf("outcomes %v, want exactly one executed and the rest replayed or in flight", counts)
	}
}

// killAfterEffect starts a worker whose effect happens and whose record
// never does, and kills it with SIGKILL in between.
func killAfterEffect(t *testing.T, spec, file, lease string) {
	t.Helper()
	cmd, out := startChild(t, "hang", spec, file, envLease+"="+lease)
	waitLines(t, cmd, out, file, 1)
	// The effect happened; the record did not. Kill the worker for real.
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("worker did not die of SIGKILL: %v", err)
	}
}

// waitLines waits for the worker to have written n effect lines. The
// workers it waits for (hang, zombie) write nothing else until their
// effect returns, which it does not before the test lets it: output
// before the lines means the worker ended without them (its Do failed,
// or answered without running the effect), and the test fails at once
// with it instead of waiting out the deadline.
func waitLines(t *testing.T, cmd *exec.Cmd, out *syncBuf, file string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for effectLines(t, file) < n {
		if said := out.String(); said != "" || time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("worker never got to effect %d:\n%s", n, said)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func testKilledAfterEffect(t *testing.T, h Harness) {
	s, c, spec := setup(t, h, once.Config{})
	file := filepath.Join(t.TempDir(), "effects")
	killAfterEffect(t, spec, file, "")
	// The queue redelivers: the next attempt must not send again.
	_, err := once.Do(ctx(t), c, processIntent, func(context.Context, once.Attempt) (int, error) {
		t.Error("the effect ran a second time after the worker was killed")
		return 0, nil
	})
	var ife *once.InFlightError
	if !errors.As(err, &ife) || ife.Attempt != 1 {
		t.Fatalf("redelivery after the kill = %v, want *InFlightError for attempt 1", err)
	}
	if got := effectLines(t, file); got != 1 {
		t.Fatalf("effect lines = %d, want 1", got)
	}
	k, _, _ := once.KeyOf(processIntent)
	if a := mustGet(t, s, k); a.Status != once.StatusInFlight || a.Attempt != 1 {
		t.Fatalf("stored = %+v, want the dead worker's claim still in flight", a)
	}
}
