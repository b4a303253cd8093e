package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/oncehq/once"
)

func recoveryTests() []namedTest {
	return []namedTest{
		{name: "RecoverAskPersonAfterKill", fn: testRecoverAskPerson, needs: needProcesses},
		{name: "RecoverRetryAfterKill", fn: testRecoverRetry, needs: needProcesses},
		{name: "RecoverVerifyLandedAfterKill", fn: testRecoverVerifyLanded, needs: needProcesses},
		{name: "RecoverVerifyNotLandedAfterKill", fn: testRecoverVerifyNotLanded, needs: needProcesses},
		{name: "RecoverVerifyErrorsAfterKill", fn: testRecoverVerifyErrors, needs: needProcesses},
		{name: "ReaperAfterKill", fn: testReaperAfterKill, needs: needProcesses},
		{name: "TwoReapers1000Claims", fn: testTwoReapers},
		{name: "ZombieFencedAfterTakeover", fn: testZombieTakeover, needs: needProcesses},
		{name: "ZombieAcceptedAfterReview", fn: testZombieReview, needs: needProcesses},
		{name: "ZombieNoteFencedAfterTakeover", fn: testZombieNote, needs: needProcesses},
		{name: "ResolveRacesLateCompletion", fn: testResolveRace},
		{name: "Resolve", fn: testResolve},
		{name: "RefusedResolutionsDoNotGrowTheTrail", fn: testRefusalsBounded},
		{name: "ResumeRunAfterKill", fn: testResumeRun, needs: needProcesses},
		{name: "PurgeKeepsOpenActions", fn: testPurge},
		{name: "UnknownOutcomeVerified", fn: testUnknownVerified},
		{name: "UnknownAwaitingVerification", fn: testUnknownAwaitingVerification},
		{name: "ReaperLoop", fn: testReaperLoop},
		{name: "HeartbeatOutlivesDeadline", fn: testHeartbeatOutlivesDeadline},
		{name: "UnknownUnderRetryPolicy", fn: testUnknownUnderRetry},
		{name: "ReleasedAfterNoTraceVerifiedAgain", fn: testReleasedAfterNoTraceVerifiedAgain},
		{name: "ReleasedAfterNoTraceStillNoTrace", fn: testReleasedAfterNoTraceStillNoTrace},
		{name: "ReleasedAfterNoTraceVerifierFails", fn: testReleasedAfterNoTraceVerifierFails},
		{name: "ReleasedAfterNoTraceCallerGone", fn: testReleasedAfterNoTraceCallerGone},
		{name: "ReleasedAfterNoTraceLandedWithoutResult", fn: testReleasedAfterNoTraceLandedWithoutResult},
		{name: "ReleasedAfterNoTraceSlowClaimReply", fn: testReleasedAfterNoTraceSlowClaimReply},
		{name: "ReleasedAfterNoTraceLandedAsCallerLeaves", fn: testReleasedAfterNoTraceLandedAsCallerLeaves},
		{name: "ReleasedAfterNoTraceVerifierOutlivesLease", fn: testReleasedAfterNoTraceVerifierOutlivesLease},
	}
}

// childLease is the lease of the worker processes whose claim the tests
// let lapse. A worker starts its effect only while enough of the lease
// is left (Lease−margin from when the claim was sent, renewing it first
// when less than a third is left), so the lease must outlast the slowest
// claim of a freshly started process: under the race detector and the
// load of parallel packages that is hundreds of milliseconds, and a
// 150ms lease made the worker refuse to start. The tests wait for the
// lease to lapse (lapse), not for a fixed time, so a longer one costs
// only its own length.
const childLease = "1s"

// deadWorker leaves an action claimed by a worker that was killed after
// its effect, and waits for the claim's lease to lapse.
func deadWorker(t *testing.T, s once.Store, spec string) (file string) {
	file = filepath.Join(t.TempDir(), "effects")
	killAfterEffect(t, spec, file, childLease)
	lapse(t, s, processKey())
	return file
}

// lapse waits until the lease of k's claim has run out: it reads the
// row, sleeps past the lease it holds and reads again, until a read
// finds the lease over (a heartbeat sent before the worker was stopped
// may have moved it on meanwhile). The store's clock is this machine's,
// as for every timing in this suite (SQLite in the process, the
// PostgreSQL server on the same host).
func lapse(t *testing.T, s once.Store, k once.Key) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for {
		a := mustGet(t, s, k)
		if a.Status != once.StatusInFlight {
			t.Fatalf("waiting for the worker's lease to lapse, the action is %s (attempt %d, %q)", a.Status, a.Attempt, a.Error)
		}
		left := time.Until(a.LeaseUntil)
		if left < 0 {
			return
		}
		if time.Now().Add(left).After(deadline) {
			t.Fatalf("the worker's lease (until %v) did not lapse within %v", a.LeaseUntil, patience)
		}
		time.Sleep(left + 10*time.Millisecond)
	}
}

func policyConfig(p once.KindPolicy) once.Config {
	return once.Config{Kinds: map[string]once.KindPolicy{processIntent.Kind: p}}
}

func processKey() once.Key {
	k, _, _ := once.KeyOf(processIntent)
	return k
}

func testRecoverAskPerson(t *testing.T, h Harness) {
	s, c, spec := setup(t, h, policyConfig(once.KindPolicy{Recovery: once.AskPerson}))
	file := deadWorker(t, s, spec)
	_, err := once.Do(ctx(t), c, processIntent, func(context.Context, once.Attempt) (int, error) {
		t.Error("AskPerson re-executed an ambiguous effect")
		return 0, nil
	})
	var re *once.ReviewError
	if !errors.As(err, &re) || !strings.Contains(re.Reason, "lease expired") {
		t.Fatalf("redelivery = %v, want *ReviewError saying the lease expired", err)
	}
	a := mustGet(t, s, processKey())
	if a.Status != once.StatusReview || effectLines(t, file) != 1 {
		t.Fatalf("stored %s, effects %d", a.Status, effectLines(t, file))
	}
	if got := trail(t, s, a.Key); got != "claimed,review" {
		t.Fatalf("trail %s", got)
	}
}

func testRecoverRetry(t *testing.T, h Harness) {
	s, c, spec := setup(t, h, policyConfig(once.KindPolicy{Recovery: once.RetryWithProviderKey}))
	file := deadWorker(t, s, spec)
	res, err := once.Do(ctx(t), c, processIntent, func(ctx context.Context, a once.Attempt) (int, error) {
		return 7, appendLine(file, fmt.Sprintf("effect pid=parent attempt=%d provider=%s", a.Number, a.ProviderKey))
	})
	if err != nil || res.Attempt != 2 || res.Value != 7 {
		t.Fatalf("redelivery = %+v, %v; want attempt 2 to run", res, err)
	}
	lines := readLines(t, file)
	if len(lines) != 2 || providerOf(lines[0]) != providerOf(lines[1]) || providerOf(lines[0]) == "" {
		t.Fatalf("effects %q: want two calls with the same provider key", lines)
	}
	if got := trail(t, s, res.Key); got != "claimed,taken_over,succeeded" {
		t.Fatalf("trail %s", got)
	}
}

func testRecoverVerifyLanded(t *testing.T, h Harness) {
	var asked atomic.Int64
	s, c, spec := setup(t, h, policyConfig(once.KindPolicy{Recovery: once.VerifyThenDecide,
		Verifier: func(ctx context.Context, a once.Action) (bool, json.RawMessage, error) {
			asked.Add(1)
			return true, json.RawMessage(`4242`), nil
		}}))
	deadWorker(t, s, spec)
	res, err := once.Do(ctx(t), c, processIntent, func(context.Context, once.Attempt) (int, error) {
		t.Error("re-executed an effect the verifier found had landed")
		return 0, nil
	})
	if err != nil || res.Value != 4242 || !res.Replayed || asked.Load() != 1 {
		t.Fatalf("redelivery = %+v, %v (asked %d)", res, err, asked.Load())
	}
	a := mustGet(t, s, processKey())
	if a.Status != once.StatusSucceeded || string(a.Result) != "4242" || a.Attempt != 1 {
		t.Fatalf("stored %+v", a)
	}
	if got := trail(t, s, a.Key); got != "claimed,verified" {
		t.Fatalf("trail %s", got)
	}
}

func testRecoverVerifyNotLanded(t *testing.T, h Harness) {
	s, c, spec := setup(t, h, policyConfig(once.KindPolicy{Recovery: once.VerifyThenDecide,
		Verifier: func(ctx context.Context, a once.Action) (bool, json.RawMessage, error) { return false, nil, nil }}))
	deadWorker(t, s, spec)
	res, err := once.Do(ctx(t), c, processIntent, func(context.Context, once.Attempt) (int, error) { return 9, nil })
	if err != nil || res.Attempt != 2 || res.Value != 9 || res.Replayed {
		t.Fatalf("redelivery = %+v, %v; want it retried as attempt 2", res, err)
	}
	if got := trail(t, s, res.Key); got != "claimed,taken_over,succeeded" {
		t.Fatalf("trail %s", got)
	}
}

func testRecoverVerifyErrors(t *testing.T, h Harness) {
	var asked atomic.Int64
	s, c, spec := setup(t, h, policyConfig(once.KindPolicy{Recovery: once.VerifyThenDecide, MaxVerifyFailures: 2, VerifyBackoff: time.Hour,
		Verifier: func(ctx context.Context, a once.Action) (bool, json.RawMessage, error) {
			asked.Add(1)
			return false, nil, errors.New("provider API down")
		}}))
	deadWorker(t, s, spec)
	never := func(context.Context, once.Attempt) (int, error) {
		t.Error("executed while the verifier could not tell")
		return 0, nil
	}
	// First failure: left for later, with backoff.
	_, err := once.Do(ctx(t), c, processIntent, never)
	var ife *once.InFlightError
	if !errors.As(err, &ife) || ife.Expired {
		t.Fatalf("after one verifier error Do = %v; want it deferred (in flight, not due)", err)
	}
	a := mustGet(t, s, processKey())
	if a.VerifyFailures != 1 || a.Status != once.StatusInFlight || a.LeaseUntil.Before(a.UpdatedAt.Add(59*time.Minute)) {
		t.Fatalf("stored %+v; want in flight, one verifier failure, asked again in an hour", a)
	}
	// Second failure, from the reaper after the backoff: review. The
	// backoff is brought forward, as the passing of an hour would.
	if ok, err := s.Transition(ctx(t), once.Transition{Key: a.Key, Attempt: a.Attempt, From: inFlight, To: once.StatusInFlight,
		Lease: time.Millisecond, VerifyFailures: a.VerifyFailures}); err != nil || !ok {
		t.Fatalf("bringing the backoff forward: %v, %v", ok, err)
	}
	time.Sleep(20 * time.Millisecond)
	r, _ := once.NewReaper(c, once.ReaperConfig{})
	rep, err := r.RunOnce(ctx(t))
	if err != nil || rep.Review != 1 || asked.Load() != 2 {
		t.Fatalf("reaper = %+v, %v (asked %d)", rep, err, asked.Load())
	}
	a = mustGet(t, s, processKey())
	if a.Status != once.StatusReview || !strings.Contains(a.Error, "provider API down") {
		t.Fatalf("stored %+v", a)
	}
	if got := trail(t, s, a.Key); got != "claimed,verify_failed,review" {
		t.Fatalf("trail %s", got)
	}
}

func testReaperAfterKill(t *testing.T, h Harness) {
	var seen []once.Observation
	var mu sync.Mutex
	cfg := policyConfig(once.KindPolicy{Recovery: once.RetryWithProviderKey})
	cfg.Hooks.OnEvent = func(_ context.Context, o once.Observation) {
		mu.Lock()
		seen = append(seen, o)
		mu.Unlock()
	}
	s, c, spec := setup(t, h, cfg)
	deadWorker(t, s, spec)
	r, err := once.NewReaper(c, once.ReaperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := r.RunOnce(ctx(t))
	if err != nil || rep.Examined != 1 || rep.Released != 1 || rep.ByKind[processIntent.Kind] != 1 {
		t.Fatalf("reaper = %+v, %v", rep, err)
	}
	if rep, _ := r.RunOnce(ctx(t)); rep.Examined != 0 {
		t.Fatalf("second pass examined %d", rep.Examined)
	}
	// The job comes back: released, so it runs as attempt 2.
	res, err := once.Do(ctx(t), c, processIntent, func(context.Context, once.Attempt) (int, error) { return 1, nil })
	if err != nil || res.Attempt != 2 {
		t.Fatalf("redelivery after reaping = %+v, %v", res, err)
	}
	if got := trail(t, s, res.Key); got != "claimed,released,claimed,succeeded" {
		t.Fatalf("trail %s", got)
	}
	mu.Lock()
	defer mu.Unlock()
	var types []string
	for _, o := range seen {
		types = append(types, string(o.Type))
		if o.Kind != processIntent.Kind {
			t.Errorf("observation without its kind: %+v", o)
		}
	}
	if got := strings.Join(types, ","); got != "lease_expired,released,claimed,succeeded" {
		t.Fatalf("hooks saw %s", got)
	}
}

func testTwoReapers(t *testing.T, h Harness) {
	const n = 1000
	var verified sync.Map // key -> count
	pol := once.KindPolicy{Recovery: once.VerifyThenDecide, Verifier: func(ctx context.Context, a once.Action) (bool, json.RawMessage, error) {
		v, _ := verified.LoadOrStore(a.Key, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
		return true, json.RawMessage(`"ok"`), nil
	}}
	// Each call may wait long for the store: SQLite's busy handler does
	// not queue waiters, so under load (the race detector, a busy CI
	// machine) one reaper can starve behind the other's back-to-back
	// write transactions for longer than the default ClaimTimeout. A
	// call that gives up is safe (the action stays held and comes back),
	// but this test is about two reapers never handling one action
	// twice, so it lets every call finish.
	const patient = 2 * time.Minute
	s, c1, spec := setup(t, h, once.Config{Default: pol, ClaimTimeout: patient})
	other, err := h.Open(ctx(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeStore(other) })
	c2, _ := once.New(once.Config{Store: other, Default: pol, ClaimTimeout: patient})

	// 1,000 claims whose workers died: leases of a millisecond.
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 8)
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			in := once.Intent{Run: "bulk", Step: int64(i), Kind: "charge_card", Target: "cus"}
			if _, err := s.Claim(ctx(t), claimReq(t, in, time.Millisecond)); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)

	reps := make([]once.ReapReport, 2)
	for i, c := range []*once.Client{c1, c2} {
		wg.Go(func() {
			r, _ := once.NewReaper(c, once.ReaperConfig{})
			pass, cancel := context.WithTimeout(context.Background(), 2*patient)
			defer cancel()
			rep, err := r.RunOnce(pass)
			if err != nil {
				t.Error(err)
			}
			reps[i] = rep
		})
	}
	wg.Wait()
	if reps[0].Examined+reps[1].Examined != n || reps[0].Verified+reps[1].Verified != n {
		t.Fatalf("reapers examined %d + %d, verified %d + %d; want %d in all", reps[0].Examined, reps[1].Examined, reps[0].Verified, reps[1].Verified, n)
	}
	count := 0
	verified.Range(func(k, v any) bool {
		count++
		if got := v.(*atomic.Int64).Load(); got != 1 {
			t.Errorf("action %s verified %d times", k, got)
		}
		return true
	})
	if count != n {
		t.Fatalf("%d actions verified, want %d", count, n)
	}
	rows, _ := s.List(ctx(t), once.Filter{Status: once.StatusSucceeded, Limit: 2 * n})
	if len(rows) != n {
		t.Fatalf("%d succeeded, want %d", len(rows), n)
	}
	t.Logf("reaper 1 took %d, reaper 2 took %d", reps[0].Examined, reps[1].Examined)
}

// zombie starts a worker that runs its effect and is then stopped with
// SIGSTOP until its lease lapses; go lets it continue.
func zombie(t *testing.T, s once.Store, spec string) (file string, resume func() string) {
	return zombieIn(t, s, spec, "zombie")
}

// zombieIn is zombie with the child's mode.
func zombieIn(t *testing.T, s once.Store, spec, mode string) (file string, resume func() string) {
	file = filepath.Join(t.TempDir(), "effects")
	cmd, out := startChild(t, mode, spec, file, envLease+"="+childLease)
	t.Cleanup(func() { cmd.Process.Kill() })
	waitLines(t, cmd, out, file, 1)
	stopBetweenWrites(t, cmd, s)
	lapse(t, s, processKey())
	return file, func() string {
		if err := appendLine(file+".go", "go"); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("zombie worker: %v\n%s", err, out)
		}
		return strings.TrimSpace(out.String())
	}
}

// stopBetweenWrites stops the worker (SIGSTOP) at a moment it is not
// inside a write to the store. The case under test is a worker paused
// past its lease. A worker paused inside a write to an SQLite file is
// another one: it holds the whole file's write lock, and nothing but
// letting it go on releases it (a PostgreSQL server finishes the
// statement without its client). So after each stop a write of the
// parent's that matches no row (a heartbeat of attempt 0) probes the
// lock; if it waits, the worker is let go for a moment and stopped again.
func stopBetweenWrites(t *testing.T, cmd *exec.Cmd, s once.Store) {
	t.Helper()
	for range 50 {
		if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		probe := make(chan error, 1)
		go func() {
			_, _, err := s.Heartbeat(context.Background(), processKey(), 0, time.Second)
			probe <- err
		}()
		select {
		case err := <-probe:
			if err != nil {
				t.Fatalf("probe: %v", err)
			}
			return
		case <-time.After(500 * time.Millisecond):
		}
		if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		if err := <-probe; err != nil {
			t.Fatalf("probe: %v", err)
		}
	}
	t.Fatal("the worker was inside a write every time it was stopped")
}

func testZombieTakeover(t *testing.T, h Harness) {
	s, c, spec := setup(t, h, policyConfig(once.KindPolicy{Recovery: once.RetryWithProviderKey}))
	_, resume := zombie(t, s, spec)
	res, err := once.Do(ctx(t), c, processIntent, func(context.Context, once.Attempt) (int, error) { return -2, nil })
	if err != nil || res.Attempt != 2 {
		t.Fatalf("takeover = %+v, %v", res, err)
	}
	if out := resume(); out != "fenced" {
		t.Fatalf("the zombie said %q, want its late completion refused (fenced)", out)
	}
	a := mustGet(t, s, processKey())
	if a.Status != once.StatusSucceeded || a.Attempt != 2 || string(a.Result) != "-2" {
		t.Fatalf("stored %+v; the zombie overwrote the newer attempt", a)
	}
	if got := trail(t, s, a.Key); got != "claimed,taken_over,succeeded,refused" {
		t.Fatalf("trail %s", got)
	}
}

// A worker paused (SIGSTOP) past its lease just before its note, while
// another worker takes the action over and runs the effect, then goes
// on: its note is refused (ErrFenced), so its effect never starts, and
// the note is not written over the newer attempt's row.
func testZombieNote(t *testing.T, h Harness) {
	s, c, spec := setup(t, h, policyConfig(once.KindPolicy{Recovery: once.RetryWithProviderKey}))
	file, resume := zombieIn(t, s, spec, "note")
	res, err := once.Do(ctx(t), c, processIntent, func(context.Context, once.Attempt) (int, error) { return -2, nil })
	if err != nil || res.Attempt != 2 {
		t.Fatalf("takeover = %+v, %v", res, err)
	}
	if out := resume(); out != "fenced" {
		t.Fatalf("the paused worker said %q, want its note refused (fenced)", out)
	}
	if exists(file + ".effect") {
		t.Fatal("the paused worker's effect started after its note was refused")
	}
	a := mustGet(t, s, processKey())
	if a.Status != once.StatusSucceeded || a.Attempt != 2 || string(a.Result) != "-2" || a.Error != "" {
		t.Fatalf("stored %+v; the paused worker's note or outcome overwrote the newer attempt", a)
	}
}

func testZombieReview(t *testing.T, h Harness) {
	s, c, spec := setup(t, h, policyConfig(once.KindPolicy{Recovery: once.AskPerson}))
	_, resume := zombie(t, s, spec)
	if _, err := once.Do(ctx(t), c, processIntent, func(context.Context, once.Attempt) (int, error) { return 0, nil }); !errors.Is(err, once.ErrReview) {
		t.Fatalf("redelivery = %v, want review", err)
	}
	if out := resume(); out != "executed" {
		t.Fatalf("the slow worker said %q, want its completion accepted", out)
	}
	a := mustGet(t, s, processKey())
	if a.Status != once.StatusSucceeded || a.Attempt != 1 {
		t.Fatalf("stored %+v; the outcome became known and should be recorded", a)
	}
	if got := trail(t, s, a.Key); got != "claimed,review,succeeded" {
		t.Fatalf("trail %s", got)
	}
}

func testResolveRace(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{})
	outcomes := map[string]int{}
	for i := range 20 {
		in := intent(int64(i))
		k := keyOf(t, in)
		release := make(chan struct{})
		workerErr := make(chan error, 1)
		running := make(chan struct{})
		go func() {
			_, err := once.Do(ctx(t), c, in, func(context.Context, once.Attempt) (string, error) {
				close(running)
				<-release
				return "late", nil
			})
			workerErr <- err
		}()
		<-running
		// The reaper gave up on the worker and asked a person …
		if ok, err := s.Transition(ctx(t), once.Transition{Key: k, Attempt: 1, From: []once.Status{once.StatusInFlight}, To: once.StatusReview, Error: "lease expired",
			Event: once.Event{Type: once.EventReview, From: once.StatusInFlight, Actor: "reaper"}}); !ok || err != nil {
			t.Fatalf("to review: %v %v", ok, err)
		}
		// … who abandons it just as the worker finishes.
		var wg sync.WaitGroup
		var resolveErr error
		wg.Go(func() {
			_, resolveErr = c.Resolve(ctx(t), k, once.Resolution{Decision: once.DecisionAbandon, By: "ops@example.com", Note: "customer asked us to stop"})
		})
		close(release)
		wg.Wait()
		werr := <-workerErr
		a := mustGet(t, s, k)
		tr := trail(t, s, k)
		// Either way the worker's success is what is stored: it is the
		// outcome, and it became known. Whichever came second is in the
		// trail beside it.
		switch {
		case a.Status != once.StatusSucceeded || werr != nil || string(a.Result) != `"late"`:
			t.Fatalf("stored %s (%s), worker=%v; the worker's success must be recorded", a.Status, a.Result, werr)
		case tr == "claimed,review,succeeded,refused":
			if !errors.Is(resolveErr, once.ErrConflict) {
				t.Fatalf("worker first, but resolve=%v", resolveErr)
			}
			outcomes["worker first"]++
		case tr == "claimed,review,resolved,succeeded":
			if resolveErr != nil || a.ResolvedBy != "ops@example.com" {
				t.Fatalf("resolution first, but resolve=%v by=%q", resolveErr, a.ResolvedBy)
			}
			outcomes["resolution first"]++
		default:
			t.Fatalf("inconsistent trail %s", tr)
		}
	}
	t.Logf("outcomes over 20 races: %v", outcomes)
}

func testResolve(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{})
	unknown := func(step int64) once.Key {
		in := intent(step)
		once.Do(ctx(t), c, in, func(context.Context, once.Attempt) (string, error) { return "", errors.New("timeout after DATA") })
		return keyOf(t, in)
	}
	// Done with a result: duplicates replay it.
	k := unknown(1)
	a, err := c.Resolve(ctx(t), k, once.Resolution{Decision: once.DecisionDone, Result: json.RawMessage(`"msg-from-provider-log"`), By: "ada", Note: "found it in the provider's log"})
	if err != nil || a.Status != once.StatusSucceeded || a.ResolvedBy != "ada" || a.ResolveNote == "" || a.ResolvedAt.IsZero() {
		t.Fatalf("Resolve done = %+v, %v", a, err)
	}
	res, err := once.Do(ctx(t), c, intent(1), (&counter{}).fn("x"))
	if err != nil || !res.Replayed || res.Value != "msg-from-provider-log" {
		t.Fatalf("after done: %+v, %v", res, err)
	}
	// Retry: the next delivery runs it again.
	k = unknown(2)
	if _, err := c.Resolve(ctx(t), k, once.Resolution{Decision: once.DecisionRetry, By: "ada", Note: "bounced; send again"}); err != nil {
		t.Fatal(err)
	}
	res, err = once.Do(ctx(t), c, intent(2), (&counter{}).fn("again"))
	if err != nil || res.Attempt != 2 || res.Value != "again" {
		t.Fatalf("after retry: %+v, %v", res, err)
	}
	// Abandon: failed for good.
	k = unknown(3)
	if _, err := c.Resolve(ctx(t), k, once.Resolution{Decision: once.DecisionAbandon, By: "ada", Note: "duplicate campaign"}); err != nil {
		t.Fatal(err)
	}
	if _, err := once.Do(ctx(t), c, intent(3), (&counter{}).fn("x")); !errors.Is(err, once.ErrFailed) {
		t.Fatalf("after abandon: %v", err)
	}
	evs, _ := s.Events(ctx(t), k)
	last := evs[len(evs)-1]
	if last.Type != once.EventResolved || last.Actor != "ada" || !strings.Contains(last.Note, "duplicate campaign") || last.To != once.StatusFailed {
		t.Fatalf("last event %+v", last)
	}
	// Bad resolutions are refused before any write.
	for _, r := range []once.Resolution{
		{Decision: "maybe", By: "a", Note: "n"},
		{Decision: once.DecisionDone, Note: "n"},
		{Decision: once.DecisionDone, By: "a"},
		{Decision: once.DecisionDone, By: "a", Note: "n", Result: json.RawMessage(`{`)},
		{Decision: once.DecisionRetry, By: "a", Note: "n", Result: json.RawMessage(`1`)},
	} {
		if _, err := c.Resolve(ctx(t), k, r); err == nil {
			t.Errorf("Resolve(%+v) accepted", r)
		}
	}
	// A succeeded action is not for resolving.
	if _, err := c.Resolve(ctx(t), keyOf(t, intent(1)), once.Resolution{Decision: once.DecisionAbandon, By: "a", Note: "n"}); !errors.Is(err, once.ErrConflict) {
		t.Fatalf("resolving a succeeded action = %v", err)
	}
	if _, err := c.Resolve(ctx(t), keyOf(t, intent(99)), once.Resolution{Decision: once.DecisionAbandon, By: "a", Note: "n"}); !errors.Is(err, once.ErrNotFound) {
		t.Fatalf("resolving a missing action = %v", err)
	}
}

func testResumeRun(t *testing.T, h Harness) {
	_, c, spec := setup(t, h, once.Config{})
	file := filepath.Join(t.TempDir(), "effects")
	cmd, out := startChild(t, "run5", spec, file, envHangAfter+"=4")
	for !exists(file + ".paused") {
		time.Sleep(5 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	if lines := readLines(t, file); len(lines) != 4 {
		t.Fatalf("before the kill %d steps ran, want 4:\n%s", len(lines), out)
	}
	// Resume in another process: only step 4 (the fifth) runs.
	cmd, out = startChild(t, "run5", spec, file)
	if err := cmd.Wait(); err != nil || strings.TrimSpace(out.String()) != "run complete" {
		t.Fatalf("resume: %v\n%s", err, out)
	}
	lines := readLines(t, file)
	if strings.Join(lines, ",") != "step 0,step 1,step 2,step 3,step 4" {
		t.Fatalf("effects %q, want each step once", lines)
	}
	steps, err := c.Run("agent-run-5").Steps(ctx(t))
	if err != nil || len(steps) != 5 {
		t.Fatalf("steps = %d, %v", len(steps), err)
	}
	for i, a := range steps {
		if a.Step != int64(i) || a.Status != once.StatusSucceeded || a.Attempt != 1 {
			t.Fatalf("step %d = %+v", i, a)
		}
	}
}

func testPurge(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{
		Default: once.KindPolicy{Retention: time.Millisecond, Recovery: once.VerifyThenDecide, VerifyBackoff: time.Hour,
			Verifier: func(context.Context, once.Action) (bool, json.RawMessage, error) {
				return false, nil, errors.New("cannot tell")
			}},
		Kinds: map[string]once.KindPolicy{"kept": {Retention: time.Hour}},
	})
	mk := func(step int64, kind string, fn func(context.Context, once.Attempt) (int, error)) once.Key {
		in := once.Intent{Run: "p", Step: step, Kind: kind}
		once.Do(ctx(t), c, in, fn)
		return keyOf(t, in)
	}
	ok := func(context.Context, once.Attempt) (int, error) { return 1, nil }
	succeeded := mk(0, "k", ok)
	failed := mk(1, "k", func(context.Context, once.Attempt) (int, error) { return 0, once.Permanent(errors.New("no")) })
	released := mk(2, "k", func(context.Context, once.Attempt) (int, error) { return 0, once.RetryLater(nil) })
	unknown := mk(3, "k", func(context.Context, once.Attempt) (int, error) { return 0, errors.New("?") })
	review := mk(4, "k", func(context.Context, once.Attempt) (int, error) { return 0, errors.New("?") })
	s.Transition(ctx(t), once.Transition{Key: review, Attempt: 1, From: []once.Status{once.StatusUnknown}, To: once.StatusReview})
	inflight := claimReq(t, once.Intent{Run: "p", Step: 5, Kind: "k"}, time.Hour)
	s.Claim(ctx(t), inflight)
	kept := mk(6, "kept", ok)
	time.Sleep(20 * time.Millisecond)

	n, err := c.Purge(ctx(t), once.PurgeOptions{BatchSize: 1, DryRun: true})
	if err != nil || n != 2 {
		t.Fatalf("dry run counted %d, %v; want 2", n, err)
	}
	var progress []int
	n, err = c.Purge(ctx(t), once.PurgeOptions{BatchSize: 1, Progress: func(d int) { progress = append(progress, d) }})
	if err != nil || n != 2 || len(progress) == 0 || progress[len(progress)-1] != 2 {
		t.Fatalf("purged %d, %v (progress %v); want 2", n, err, progress)
	}
	for _, k := range []once.Key{succeeded, failed} {
		if _, err := s.Get(ctx(t), k); !errors.Is(err, once.ErrNotFound) {
			t.Errorf("finished action %s survived the purge: %v", k, err)
		}
		if evs, _ := s.Events(ctx(t), k); len(evs) != 0 {
			t.Errorf("purged action %s kept %d events", k, len(evs))
		}
	}
	// A released action is not finished: its attempt number fences a
	// presumed-dead attempt, and purging it would let the next claim be
	// attempt 1 again.
	for _, k := range []once.Key{released, unknown, review, inflight.Key, kept} {
		if _, err := s.Get(ctx(t), k); err != nil {
			t.Errorf("purge touched %s: %v", k, err)
		}
	}
	stats, err := s.Stats(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, st := range stats {
		got[st.Kind+"/"+string(st.Status)] += st.Count
	}
	if got["k/released"] != 1 || got["k/unknown"] != 1 || got["k/review"] != 1 || got["k/in_flight"] != 1 || got["kept/succeeded"] != 1 || len(got) != 5 {
		t.Fatalf("stats after purge %v", got)
	}
}

func testUnknownVerified(t *testing.T, h Harness) {
	landed := atomic.Bool{}
	s, c, _ := setup(t, h, once.Config{Default: once.KindPolicy{Recovery: once.VerifyThenDecide,
		Verifier: func(context.Context, once.Action) (bool, json.RawMessage, error) {
			return landed.Load(), json.RawMessage(`"v"`), nil
		}}})
	var effects counter
	_, err := once.Do(ctx(t), c, intent(1), func(context.Context, once.Attempt) (string, error) {
		effects.n.Add(1)
		return "", errors.New("EOF after the request was sent")
	})
	if !errors.Is(err, once.ErrOutcomeUnknown) {
		t.Fatal(err)
	}
	if a := mustGet(t, s, keyOf(t, intent(1))); a.Status != once.StatusUnknown {
		t.Fatalf("stored %s, want unknown awaiting verification", a.Status)
	}
	landed.Store(true)
	time.Sleep(5 * time.Millisecond)
	res, err := once.Do(ctx(t), c, intent(1), effects.fn("x"))
	if err != nil || res.Value != "v" || effects.n.Load() != 1 {
		t.Fatalf("redelivery = %+v, %v (ran %d); want the verifier's result", res, err, effects.n.Load())
	}
}

// An unknown outcome whose verifier cannot tell waits, deferred, for its
// next try: duplicates are told so, run nothing and ask nothing, and the
// error matches retry-later (the job must go back to its queue: the next
// delivery asks the verifier), never review.
func testUnknownAwaitingVerification(t *testing.T, h Harness) {
	var asked atomic.Int64
	s, c, _ := setup(t, h, once.Config{Default: once.KindPolicy{Recovery: once.VerifyThenDecide, VerifyBackoff: time.Hour,
		Verifier: func(context.Context, once.Action) (bool, json.RawMessage, error) {
			asked.Add(1)
			return false, nil, errors.New("provider API down")
		}}})
	_, err := once.Do(ctx(t), c, intent(1), func(context.Context, once.Attempt) (string, error) {
		return "", errors.New("EOF after the request was sent")
	})
	var ue *once.UnknownOutcomeError
	if !errors.As(err, &ue) || ue.Status != once.StatusUnknown || !errors.Is(err, once.ErrRetryLater) || errors.Is(err, once.ErrReview) ||
		once.Dispose(err).Action != once.JobRetry {
		t.Fatalf("Do = %v; want an unknown outcome awaiting verification", err)
	}
	time.Sleep(20 * time.Millisecond) // due for verification at once
	var effects counter
	for i := range 2 {
		_, err = once.Do(ctx(t), c, intent(1), effects.fn("x"))
		if !errors.As(err, &ue) || ue.Status != once.StatusUnknown || !strings.Contains(ue.Message, "EOF") || errors.Is(err, once.ErrReview) {
			t.Fatalf("duplicate %d = %v; want the unknown outcome, still awaiting verification", i+1, err)
		}
	}
	if effects.n.Load() != 0 || asked.Load() != 1 {
		t.Fatalf("ran %d, asked the verifier %d times; want 0 and 1 (then deferred)", effects.n.Load(), asked.Load())
	}
	a := mustGet(t, s, keyOf(t, intent(1)))
	if a.Status != once.StatusUnknown || a.VerifyFailures != 1 || a.LeaseUntil.Before(a.UpdatedAt.Add(59*time.Minute)) {
		t.Fatalf("stored %+v; want unknown, one verifier failure, next try in an hour", a)
	}
	if got := trail(t, s, a.Key); got != "claimed,unknown,verify_failed" {
		t.Fatalf("trail %s", got)
	}
}

func testReaperLoop(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{})
	type pass struct {
		rep once.ReapReport
		err error
	}
	passes := make(chan pass, 100)
	r, _ := once.NewReaper(c, once.ReaperConfig{Interval: 50 * time.Millisecond, OnPass: func(rep once.ReapReport, err error) {
		passes <- pass{rep, err}
	}})
	if err := r.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx(t)); err == nil {
		t.Error("second Start accepted")
	}
	if p := <-passes; p.err != nil || p.rep.Examined != 0 {
		t.Fatalf("first pass over an empty store = %+v, %v", p.rep, p.err)
	}
	// An action dies between passes; a later pass reaps it.
	s.Claim(ctx(t), claimReq(t, intent(1), time.Millisecond))
	reviewed := 0
	for reviewed == 0 {
		select {
		case p := <-passes:
			if p.err != nil {
				t.Fatalf("pass failed: %v", p.err)
			}
			reviewed += p.rep.Review
		case <-ctx(t).Done():
			t.Fatal("no pass reaped the dead claim")
		}
	}
	r.Stop()
	r.Stop() // twice is fine
	if a := mustGet(t, s, keyOf(t, intent(1))); a.Status != once.StatusReview {
		t.Fatalf("stored %s after a pass, want review", a.Status)
	}
	if reviewed != 1 {
		t.Fatalf("passes reported %d reviews, want 1", reviewed)
	}
}

func readLines(t *testing.T, file string) []string {
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(b)) == "" {
		return nil
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

func providerOf(line string) string {
	_, p, _ := strings.Cut(line, "provider=")
	return p
}

// An effect that ignores its context runs past MaxExecution; its claim
// must hold until it returns, or recovery would run it a second time
// beside it.
func testHeartbeatOutlivesDeadline(t *testing.T, h Harness) {
	_, c, _ := setup(t, h, once.Config{Default: once.KindPolicy{Lease: heartbeatLease, MaxExecution: 200 * time.Millisecond,
		Recovery: once.RetryWithProviderKey}})
	var running, most atomic.Int64
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	effect := func(ctx context.Context, a once.Attempt) (string, error) {
		n := running.Add(1)
		defer running.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		if n > 1 {
			return "sent again", nil // the failure this test looks for
		}
		started <- struct{}{}
		<-release // ignores ctx
		return "sent", nil
	}
	done := make(chan error, 1)
	go func() {
		_, err := once.Do(ctx(t), c, intent(1), effect)
		done <- err
	}()
	<-started
	// Past MaxExecution, and past the lease the claim began with: only
	// heartbeats after the deadline can have kept it.
	time.Sleep(heartbeatLease + 800*time.Millisecond)
	_, err := once.Do(ctx(t), c, intent(1), effect)
	close(release)
	if !errors.Is(err, once.ErrInFlight) {
		t.Fatalf("duplicate while a slow effect runs = %v; want ErrInFlight", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if most.Load() != 1 {
		t.Fatalf("the effect ran %d times at once", most.Load())
	}
}

// Under RetryWithProviderKey an unclassified error releases the action,
// and the caller is told to put the job back, not to drop it.
func testUnknownUnderRetry(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{Default: once.KindPolicy{Recovery: once.RetryWithProviderKey}})
	var keys []string
	_, err := once.Do(ctx(t), c, intent(1), func(ctx context.Context, a once.Attempt) (string, error) {
		keys = append(keys, a.ProviderKey)
		return "", errors.New("timeout reading the response")
	})
	if !errors.Is(err, once.ErrOutcomeUnknown) || !errors.Is(err, once.ErrRetryLater) || errors.Is(err, once.ErrReview) {
		t.Fatalf("Do = %v; want an unknown outcome that says retry later", err)
	}
	if a := mustGet(t, s, keyOf(t, intent(1))); a.Status != once.StatusReleased {
		t.Fatalf("stored %s, want released", a.Status)
	}
	res, err := once.Do(ctx(t), c, intent(1), func(ctx context.Context, a once.Attempt) (string, error) {
		keys = append(keys, a.ProviderKey)
		return "ok", nil
	})
	if err != nil || res.Attempt != 2 || keys[0] != keys[1] {
		t.Fatalf("redelivery = %+v, %v (provider keys %q)", res, err, keys)
	}
	// Under the default, the same error asks a person.
	_, c2, _ := setup(t, h, once.Config{})
	_, err = once.Do(ctx(t), c2, intent(1), func(context.Context, once.Attempt) (string, error) { return "", errors.New("?") })
	if !errors.Is(err, once.ErrReview) || errors.Is(err, once.ErrRetryLater) {
		t.Fatalf("default policy: %v; want review", err)
	}
}

// releasedAfterNoTrace leaves intent(1) as the reaper leaves a dead
// claim whose verifier found no trace of it: released, for the next
// delivery. landed is what the verifier says from then on; asked counts
// its calls.
func releasedAfterNoTrace(t *testing.T, h Harness, verify func(ctx context.Context, a once.Action) (bool, json.RawMessage, error)) (once.Store, *once.Client) {
	t.Helper()
	s, c, _ := setup(t, h, once.Config{Default: once.KindPolicy{Recovery: once.VerifyThenDecide, VerifyBackoff: time.Hour, Verifier: verify}})
	reapedNoTrace(t, s, c, intent(1))
	return s, c
}

// reapedNoTrace makes in's action a dead claim of attempt 1 that c's
// reaper, whose verifier is to find no trace of it, releases.
func reapedNoTrace(t *testing.T, s once.Store, c *once.Client, in once.Intent) {
	t.Helper()
	mustClaim(t, s, claimReq(t, in, time.Millisecond))
	lapse(t, s, keyOf(t, in))
	r, err := once.NewReaper(c, once.ReaperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := r.RunOnce(ctx(t)); err != nil || rep.Released != 1 {
		t.Fatalf("the reaper's pass = %+v, %v; want the dead claim released", rep, err)
	}
}

// The reaper asked the verifier about a dead claim, found no trace of
// it, and released it; attempt 1's request, still in the provider's
// queue then, landed before the next delivery. That delivery asks the
// verifier again before it runs anything: the effect happened once, and
// the delivery gets the verifier's result.
func testReleasedAfterNoTraceVerifiedAgain(t *testing.T, h Harness) {
	var landed atomic.Bool
	var asked atomic.Int64
	s, c := releasedAfterNoTrace(t, h, func(context.Context, once.Action) (bool, json.RawMessage, error) {
		asked.Add(1)
		return landed.Load(), json.RawMessage(`"v"`), nil
	})
	landed.Store(true)
	var effects counter
	res, err := once.Do(ctx(t), c, intent(1), effects.fn("x"))
	if effects.n.Load() != 0 {
		t.Fatalf("the delivery ran the effect again (%d), though attempt 1's had landed since the reaper asked", effects.n.Load())
	}
	if err != nil || res.Value != "v" || !res.Replayed {
		t.Fatalf("the delivery = %+v, %v; want the verifier's result, replayed", res, err)
	}
	if a := mustGet(t, s, keyOf(t, intent(1))); a.Status != once.StatusSucceeded || string(a.Result) != `"v"` {
		t.Fatalf("stored %s %s, want succeeded with the verifier's result", a.Status, a.Result)
	}
	if n := asked.Load(); n != 2 {
		t.Fatalf("the verifier was asked %d times, want twice: by the reaper, and before the next attempt", n)
	}
}

// Still no trace when the next delivery asks: it runs the effect, once.
func testReleasedAfterNoTraceStillNoTrace(t *testing.T, h Harness) {
	var asked atomic.Int64
	s, c := releasedAfterNoTrace(t, h, func(context.Context, once.Action) (bool, json.RawMessage, error) {
		asked.Add(1)
		return false, nil, nil
	})
	runsOnceAfterAsking(t, s, c, &asked)
}

// runsOnceAfterAsking delivers intent(1), released after no trace, and
// checks that the verifier was asked again and the effect ran once, as
// attempt 2.
func runsOnceAfterAsking(t *testing.T, s once.Store, c *once.Client, asked *atomic.Int64) {
	t.Helper()
	var effects counter
	res, err := once.Do(ctx(t), c, intent(1), effects.fn("x"))
	if err != nil || res.Value != "x" || res.Replayed || effects.n.Load() != 1 || asked.Load() != 2 {
		t.Fatalf("the delivery = %+v, %v (ran %d, the verifier asked %d times); want the effect run once, after asking again", res, err, effects.n.Load(), asked.Load())
	}
	if a := mustGet(t, s, keyOf(t, intent(1))); a.Status != once.StatusSucceeded || a.Attempt != 2 {
		t.Fatalf("stored %s attempt %d, want succeeded by attempt 2", a.Status, a.Attempt)
	}
}

// A verifier that cannot tell before the next attempt leaves the
// release's answer standing: the attempt runs, as it did before the
// question was asked, and a release a person chose, or one an effect
// asked for, is not held up while the provider's lookup is down.
func testReleasedAfterNoTraceVerifierFails(t *testing.T, h Harness) {
	var asked atomic.Int64
	s, c := releasedAfterNoTrace(t, h, func(context.Context, once.Action) (bool, json.RawMessage, error) {
		if asked.Add(1) == 1 {
			return false, nil, nil
		}
		return false, nil, errors.New("provider API down")
	})
	runsOnceAfterAsking(t, s, c, &asked)
}

// A verifier that says the effect landed, with no result to store, is
// believed: the action succeeded, with no result, and nothing runs.
func testReleasedAfterNoTraceLandedWithoutResult(t *testing.T, h Harness) {
	var asked atomic.Int64
	s, c := releasedAfterNoTrace(t, h, func(context.Context, once.Action) (bool, json.RawMessage, error) {
		return asked.Add(1) > 1, nil, nil
	})
	var effects counter
	res, err := once.Do(ctx(t), c, intent(1), effects.fn("x"))
	if err != nil || !res.Replayed || effects.n.Load() != 0 {
		t.Fatalf("the delivery = %+v, %v (ran %d); want nothing run, replayed", res, err, effects.n.Load())
	}
	if a := mustGet(t, s, keyOf(t, intent(1))); a.Status != once.StatusSucceeded || a.VerifyFailures != 0 {
		t.Fatalf("stored %s (verify failures %d), want succeeded", a.Status, a.VerifyFailures)
	}
}

// A caller that gives up while the verifier is asked runs nothing; the
// attempt is released again, and the caller told to come back.
func testReleasedAfterNoTraceCallerGone(t *testing.T, h Harness) {
	var asked atomic.Int64
	callerCtx, cancel := context.WithCancel(ctx(t))
	defer cancel()
	s, c := releasedAfterNoTrace(t, h, func(vctx context.Context, _ once.Action) (bool, json.RawMessage, error) {
		if asked.Add(1) == 1 {
			return false, nil, nil
		}
		cancel()
		<-vctx.Done()
		return false, nil, vctx.Err()
	})
	var effects counter
	_, err := once.Do(callerCtx, c, intent(1), effects.fn("x"))
	if effects.n.Load() != 0 || !errors.Is(err, once.ErrRetryLater) || !errors.Is(err, context.Canceled) {
		t.Fatalf("the delivery = %v (ran %d); want nothing run, to retry later, with the caller's cancellation", err, effects.n.Load())
	}
	if a := mustGet(t, s, keyOf(t, intent(1))); a.Status != once.StatusReleased || a.Attempt != 2 {
		t.Fatalf("stored %s attempt %d; want attempt 2 released again, unrun", a.Status, a.Attempt)
	}
}

// slowReply is a store whose claims' replies come back late: the claim
// applies, and its answer arrives delay later.
type slowReply struct {
	once.Store
	delay time.Duration
}

func (s slowReply) Claim(ctx context.Context, req once.ClaimRequest) (once.ClaimResult, error) {
	cr, err := s.Store.Claim(ctx, req)
	time.Sleep(s.delay)
	return cr, err
}

// A claim whose reply took most of its lease still gives the verifier a
// window to answer in: asked with a deadline already past, it could not
// tell, and the effect ran again though attempt 1's had landed.
func testReleasedAfterNoTraceSlowClaimReply(t *testing.T, h Harness) {
	var landed atomic.Bool
	var expired atomic.Int64
	verify := func(vctx context.Context, _ once.Action) (bool, json.RawMessage, error) {
		if vctx.Err() != nil {
			expired.Add(1)
			return false, nil, vctx.Err()
		}
		return landed.Load(), json.RawMessage(`"v"`), nil
	}
	s, _ := releasedAfterNoTrace(t, h, verify)
	landed.Store(true)
	const lease = time.Second
	c, err := once.New(once.Config{Store: slowReply{s, lease * 85 / 100}, Default: once.KindPolicy{Recovery: once.VerifyThenDecide, Verifier: verify, Lease: lease}})
	if err != nil {
		t.Fatal(err)
	}
	var effects counter
	res, err := once.Do(ctx(t), c, intent(1), effects.fn("x"))
	if effects.n.Load() != 0 || expired.Load() != 0 {
		t.Fatalf("the delivery ran the effect %d times, the verifier asked %d times with its deadline past; want it asked in time, and nothing run", effects.n.Load(), expired.Load())
	}
	if err != nil || res.Value != "v" || !res.Replayed {
		t.Fatalf("the delivery = %+v, %v; want the verifier's result, replayed", res, err)
	}
}

// The verifier's answer is kept when the caller leaves while it is asked:
// the effect landed, and the next delivery, perhaps on a process without
// the verifier, must not run it again.
func testReleasedAfterNoTraceLandedAsCallerLeaves(t *testing.T, h Harness) {
	var asked atomic.Int64
	callerCtx, cancel := context.WithCancel(ctx(t))
	defer cancel()
	s, c := releasedAfterNoTrace(t, h, func(context.Context, once.Action) (bool, json.RawMessage, error) {
		if asked.Add(1) == 1 {
			return false, nil, nil
		}
		cancel()
		return true, json.RawMessage(`"v"`), nil
	})
	var effects counter
	once.Do(callerCtx, c, intent(1), effects.fn("x"))
	if a := mustGet(t, s, keyOf(t, intent(1))); effects.n.Load() != 0 || a.Status != once.StatusSucceeded || string(a.Result) != `"v"` {
		t.Fatalf("stored %s %s (ran %d); want the verifier's answer kept: succeeded with its result, nothing run", a.Status, a.Result, effects.n.Load())
	}
}

// A verifier that outlives the claim's lease (the process paused, or
// the provider was slow, and nothing renews the lease meanwhile) finds
// the action recovered by the reaper when it answers: its answer, landed,
// is refused by the newer state (*FencedError), nothing runs, and the
// action stands as the reaper left it, for the next delivery to ask
// again.
func testReleasedAfterNoTraceVerifierOutlivesLease(t *testing.T, h Harness) {
	const lease = 300 * time.Millisecond
	var asked atomic.Int64
	reaped := make(chan error, 1)
	verify := func(context.Context, once.Action) (bool, json.RawMessage, error) {
		if asked.Add(1) == 2 {
			// The delivery's question, answered once the reaper has
			// recovered the attempt whose lease lapsed meanwhile.
			select {
			case err := <-reaped:
				reaped <- err
			case <-time.After(patience):
			}
			return true, json.RawMessage(`"v"`), nil
		}
		return false, nil, nil // the reapers' questions
	}
	s, c := releasedAfterNoTrace(t, h, verify)
	worker, err := once.New(once.Config{Store: s, Default: once.KindPolicy{Recovery: once.VerifyThenDecide, Verifier: verify, Lease: lease}})
	if err != nil {
		t.Fatal(err)
	}
	k := keyOf(t, intent(1))
	go func() {
		reaped <- func() error {
			for deadline := time.Now().Add(patience); ; time.Sleep(10 * time.Millisecond) {
				a, err := s.Get(ctx(t), k)
				if err != nil {
					return err
				}
				if a.Status == once.StatusInFlight && a.Attempt == 2 && time.Now().After(a.LeaseUntil) {
					break
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("attempt 2's lease never lapsed: %s attempt %d", a.Status, a.Attempt)
				}
			}
			r, err := once.NewReaper(c, once.ReaperConfig{})
			if err != nil {
				return err
			}
			if rep, err := r.RunOnce(ctx(t)); err != nil || rep.Released != 1 {
				return fmt.Errorf("the reaper's pass = %+v, %v; want the lapsed attempt released", rep, err)
			}
			return nil
		}()
	}()
	var effects counter
	_, err = once.Do(ctx(t), worker, intent(1), effects.fn("x"))
	if err := <-reaped; err != nil {
		t.Fatal(err)
	}
	if effects.n.Load() != 0 || !errors.Is(err, once.ErrFenced) {
		t.Fatalf("the delivery = %v (ran %d); want nothing run, and its late answer refused as fenced", err, effects.n.Load())
	}
	// Its error must not read as an effect run whose outcome was lost.
	if !strings.Contains(err.Error(), "nothing ran") {
		t.Fatalf("the delivery's error %q does not say that nothing ran", err)
	}
	if a := mustGet(t, s, k); a.Status != once.StatusReleased || a.Attempt != 2 {
		t.Fatalf("stored %s attempt %d; want attempt 2 released by the reaper", a.Status, a.Attempt)
	}
}

// testRefusalsBounded resolves a succeeded action 200 times, each with a
// note of 4 KB, and a review action 50 times for an attempt it is not
// at: each is refused, and the trail holds one refusal for each run of
// them, not 250. A refusal after the action moved on is written again.
func testRefusalsBounded(t *testing.T, h Harness) {
	s, c, _ := setup(t, h, once.Config{})
	if _, err := once.Do(ctx(t), c, intent(1), (&counter{}).fn("sent")); err != nil {
		t.Fatal(err)
	}
	k := keyOf(t, intent(1))
	count := func(k once.Key) (refused, total int64) {
		t.Helper()
		p, err := s.EventPage(ctx(t), once.EventQuery{Key: k, Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range p.Events {
			if e.Type == once.EventRefused {
				refused++
			}
		}
		return refused, p.Total
	}
	_, before := count(k)
	for i := range 200 {
		note := fmt.Sprintf("%d %s", i, strings.Repeat("n", 4000))
		if _, err := c.Resolve(ctx(t), k, once.Resolution{Decision: once.DecisionAbandon, By: "mallory", Note: note}); !errors.Is(err, once.ErrConflict) {
			t.Fatalf("resolution %d of a succeeded action = %v, want a conflict", i, err)
		}
	}
	if refused, total := count(k); refused != 1 || total != before+1 {
		t.Errorf("after 200 refused resolutions the trail holds %d refusals and %d events (%d before); want 1 and %d", refused, total, before, before+1)
	}

	in := intent(2)
	once.Do(ctx(t), c, in, func(context.Context, once.Attempt) (string, error) { return "", errors.New("timeout after DATA") })
	r := keyOf(t, in)
	if a, _ := s.Get(ctx(t), r); a.Status != once.StatusReview && a.Status != once.StatusUnknown {
		t.Fatalf("action is %s, want review", a.Status)
	}
	for i := range 50 {
		if _, err := c.Resolve(ctx(t), r, once.Resolution{Decision: once.DecisionRetry, By: "ops", Note: fmt.Sprint("stale page ", i), Attempt: 7}); !errors.Is(err, once.ErrConflict) {
			t.Fatalf("stale resolution %d = %v, want a conflict", i, err)
		}
	}
	if refused, _ := count(r); refused != 1 {
		t.Errorf("after 50 stale resolutions the trail holds %d refusals, want 1", refused)
	}
	// Decided, the action has moved on: the next refusal is news, and is
	// written.
	if _, err := c.Resolve(ctx(t), r, once.Resolution{Decision: once.DecisionDone, By: "ops", Note: "found it"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Resolve(ctx(t), r, once.Resolution{Decision: once.DecisionDone, By: "ops", Note: "again"}); !errors.Is(err, once.ErrConflict) {
		t.Fatalf("resolving a resolved action = %v, want a conflict", err)
	}
	if refused, _ := count(r); refused != 2 {
		t.Errorf("a refusal after the action moved on: %d refusals in the trail, want 2", refused)
	}

	// A failed action abandoned once is abandoned: abandoning it again
	// changes nothing, and is refused as a repeat, not written 50 times.
	in = intent(3)
	once.Do(ctx(t), c, in, func(context.Context, once.Attempt) (string, error) {
		return "", once.Permanent(errors.New("550 no such user"))
	})
	f := keyOf(t, in)
	if _, err := c.Resolve(ctx(t), f, once.Resolution{Decision: once.DecisionAbandon, By: "ops", Note: "bounced for good"}); err != nil {
		t.Fatalf("abandoning a failed action: %v", err)
	}
	_, before = count(f)
	for i := range 50 {
		if _, err := c.Resolve(ctx(t), f, once.Resolution{Decision: once.DecisionAbandon, By: "mallory", Note: fmt.Sprint("again ", i)}); !errors.Is(err, once.ErrConflict) {
			t.Fatalf("abandoning an abandoned action (%d) = %v, want a conflict", i, err)
		}
	}
	if refused, total := count(f); refused != 1 || total != before+1 {
		t.Errorf("after 50 abandons of an abandoned action the trail holds %d refusals and %d events (%d before); want 1 and %d", refused, total, before, before+1)
	}
	// Done and Retry still apply: a person may find the effect happened.
	if a, err := c.Resolve(ctx(t), f, once.Resolution{Decision: once.DecisionDone, By: "ops", Note: "it went out after all"}); err != nil || a.Status != once.StatusSucceeded {
		t.Errorf("Done on an abandoned action = %s, %v", a.Status, err)
	}

	// A person retried a review item, and the worker's late outcome
	// then failed the action at the same attempt: nobody abandoned it,
	// so Abandon applies, and no refusal says someone did.
	in = intent(4)
	once.Do(ctx(t), c, in, func(context.Context, once.Attempt) (string, error) { return "", errors.New("timeout after DATA") })
	l := keyOf(t, in)
	a, err := c.Resolve(ctx(t), l, once.Resolution{Decision: once.DecisionRetry, By: "ops", Note: "not in the mail log"})
	if err != nil || a.Status != once.StatusReleased {
		t.Fatalf("Retry of a review item = %s, %v", a.Status, err)
	}
	// What the worker's late outcome writes (recordLate): released to
	// failed at the attempt it ran.
	late := once.Transition{Key: l, Attempt: a.Attempt, From: []once.Status{once.StatusReleased}, To: once.StatusFailed, Error: "550 no such user",
		Event: once.Event{Key: l, Type: once.EventFailed, Attempt: a.Attempt, From: once.StatusReleased, To: once.StatusFailed, Actor: once.ActorWorker,
			Note: "550 no such user; late outcome of attempt 1, recorded after the action was released"}}
	if ok, err := s.Transition(ctx(t), late); !ok || err != nil {
		t.Fatalf("the late outcome: %v, %v", ok, err)
	}
	if a, err := c.Resolve(ctx(t), l, once.Resolution{Decision: once.DecisionAbandon, By: "oncall", Note: "the address is gone"}); err != nil || a.Status != once.StatusFailed {
		t.Errorf("Abandon of an action a person retried and the worker failed = %s, %v; want it applied (nobody abandoned it)", a.Status, err)
	}
}
