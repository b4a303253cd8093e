package linearize_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/oncehq/once"
	"github.com/oncehq/once/lab/linearize"
)

// The workload: a few keys at a time, two kinds of effect, workers that
// call Do on them through two clients (one of which the faults reach),
// two people who resolve what goes to review, a reaper, and a fault per
// round, with scripted zombies when the fault outlasts a lease: one of
// them a charge whose late outcome a takeover fences out, whatever the
// timing. Then every key is driven to an end, and the history is
// checked.
const (
	// rounds of fresh keys, keysPerRound each, a fault per round.
	rounds       = 12
	keysPerRound = 4
	roundLength  = 700 * time.Millisecond
)

const (
	kindEmail  = "send_email"  // AskPerson: a plain SMTP server cannot be asked
	kindCharge = "charge_card" // RetryWithProviderKey: the provider honours Idempotency-Key
)

// seed is the run's seed: ONCE_LINEARIZE_SEED, or a fixed one. It picks
// the keys' effects, the faults and their order; the interleaving is the
// machine's.
func seed(t *testing.T) uint64 {
	if s := os.Getenv("ONCE_LINEARIZE_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("ONCE_LINEARIZE_SEED=%q is not a number", s)
		}
		return n
	}
	return 11
}

// outbox is the email provider: it delivers every message it is handed,
// and cannot be asked about a key (no idempotency). A message is handed
// over only while the effect's context is live: an effect that was told
// to stop sends nothing.
type outbox struct {
	mu   sync.Mutex
	seq  int
	sent map[once.Key][]string
}

func (o *outbox) send(ctx context.Context, k once.Key) (string, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if err := ctx.Err(); err != nil {
		// Nothing went out: the next delivery may send it.
		return "", once.RetryLater(err)
	}
	o.seq++
	id := fmt.Sprintf("msg-%d", o.seq)
	o.sent[k] = append(o.sent[k], id)
	return id, nil
}

func (o *outbox) of(k once.Key) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.sent[k])
}

// bank is the payments provider. It keeps the first response to each
// Idempotency-Key and answers every later call with it, as Stripe does:
// a declined card stays declined, a charge is made once.
type bank struct {
	mu        sync.Mutex
	seq       int
	responses map[string]response
	calls     map[string]int
}

type response struct {
	declined bool
	receipt  string
}

func (b *bank) charge(providerKey string, decline bool) response {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls[providerKey]++
	if c, ok := b.responses[providerKey]; ok {
		return c
	}
	b.seq++
	c := response{declined: decline, receipt: fmt.Sprintf("ch-%d", b.seq)}
	b.responses[providerKey] = c
	return c
}

func (b *bank) of(providerKey string) (response, int, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	c, ok := b.responses[providerKey]
	return c, b.calls[providerKey], ok
}

// key is one intent of the run.
type key struct {
	in    once.Intent
	key   once.Key
	rec   once.Recovery
	email bool
	// first is what its first attempt does, whoever runs it, and for
	// how long when slow: the plans below go round the keys, so every
	// case happens in every run.
	first behaviour
	slow  time.Duration
	// decline: a charge whose card the bank declines.
	decline bool
	// abandon: a person abandons this email when nothing was sent,
	// rather than retry it.
	abandon bool
}

var (
	emailPlan = []struct {
		first   behaviour
		abandon bool
	}{{bOK, false}, {bLostReply, false}, {bUnsent, false}, {bRetryLater, false}, {bSlow, false}, {bPermanent, false}, {bUnsent, true}, {bSlow, true}}
	chargePlan = []struct {
		first   behaviour
		decline bool
	}{{bOK, false}, {bLostReply, false}, {bRetryLater, false}, {bSlow, false}, {bOK, true}, {bUnsent, false}}
)

// longFault is how long a fault lasts that outlasts RecordTimeout, so
// outcomes go unrecorded.
func longFault(lease time.Duration) time.Duration { return 5*lease + 750*time.Millisecond }

// behaviour is what one call of an effect does.
type behaviour int

const (
	bOK         behaviour = iota // it happens
	bRetryLater                  // refused before it happened (421, 429)
	bPermanent                   // refused for good (550); emails only
	bLostReply                   // it happened, and the reply was lost
	bUnsent                      // an error before anything went out, unclassified
	bSlow                        // runs for 0.3–2.5 leases first
)

func pick(rng *rand.Rand, lease time.Duration) (behaviour, time.Duration) {
	slow := time.Duration((0.3 + 2.2*rng.Float64()) * float64(lease))
	switch r := rng.IntN(100); {
	case r < 40:
		return bOK, 0
	case r < 52:
		return bRetryLater, 0
	case r < 57:
		return bPermanent, 0
	case r < 70:
		return bLostReply, 0
	case r < 75:
		return bUnsent, 0
	default:
		return bSlow, slow
	}
}

// world is one run over one store.
type world struct {
	t    *testing.T
	seed uint64
	// lease is the kinds' lease: short, so claims lapse within a round,
	// and long enough that the store, slowed by the race detector,
	// claims and renews well within it.
	lease time.Duration
	// workers call Do and Get concurrently.
	workers int
	rec     *linearize.Recorder
	direct  *once.Client
	faulted *once.Client
	// stalled is the faulted store as the scripted charge zombies'
	// worker sees it: their heartbeats do not get through, so their
	// claims lapse a lease in, on both stores, whatever the fault.
	stalled *stalledStore
	zombie  *once.Client
	faults  faults
	outbox  *outbox
	bank    *bank

	mu      sync.Mutex
	keys    []*key
	current []*key
	emails  int      // email keys made so far, for the plan
	charges int      // charge keys made so far
	log     []string // what was injected, for a reader of a failure
}

// faults are the partial failures a store's run injects, one per round.
type faults interface {
	// kinds names the faults.
	kinds() []string
	// inject starts one; it lasts until heal is called (nil: it ends by
	// itself, an armed lost reply), which is not before lasts.
	inject(kind string) (heal func(), lasts time.Duration)
	// report says what happened, at the end.
	report() string
}

func newWorld(t *testing.T, lease time.Duration, workers int, direct, faulted once.Store, f faults) *world {
	w := &world{
		t: t, seed: seed(t), lease: lease, workers: workers, rec: linearize.NewRecorder(), faults: f,
		outbox: &outbox{sent: map[once.Key][]string{}},
		bank:   &bank{responses: map[string]response{}, calls: map[string]int{}},
	}
	cfg := once.Config{
		// The reaper holds each action it takes for the longest hold of
		// any policy, Default's included: a decision of its that fails
		// leaves the action held that long, and with Default's 2-minute
		// lease the run would not converge.
		Default: once.KindPolicy{Lease: lease},
		Kinds: map[string]once.KindPolicy{
			kindEmail:  {Recovery: once.AskPerson, Lease: lease, MaxExecution: 10 * time.Second},
			kindCharge: {Recovery: once.RetryWithProviderKey, Lease: lease, MaxExecution: 10 * time.Second},
		},
		// A fault of three leases ends within RecordTimeout; a long
		// one (see longFault) outlasts it.
		ClaimTimeout:  max(time.Second, 5*lease/2),
		RecordTimeout: 4 * lease,
		Hooks:         w.rec.Hooks(),
	}
	var err error
	cfg.Store, cfg.Origin = direct, "direct"
	if w.direct, err = once.New(cfg); err != nil {
		t.Fatal(err)
	}
	cfg.Store, cfg.Origin = faulted, "faulted"
	if w.faulted, err = once.New(cfg); err != nil {
		t.Fatal(err)
	}
	w.stalled = &stalledStore{Store: faulted, keys: map[once.Key]bool{}}
	cfg.Store, cfg.Origin = w.stalled, "stalled"
	if w.zombie, err = once.New(cfg); err != nil {
		t.Fatal(err)
	}
	return w
}

// stalledStore is a store whose heartbeats for some keys do not get
// through (a half-open connection, a worker descheduled between its
// effect and its heartbeats), while every other call does. A claim on
// such a key lapses a lease after it was made, however the run's faults
// fall: on SQLite a held lock stops every writer alike, and once it is
// let go the stalled worker's heartbeat would otherwise race the
// takeover, and often win.
type stalledStore struct {
	once.Store
	mu   sync.Mutex
	keys map[once.Key]bool
}

// stall stops k's heartbeats from getting through, for good (the keys
// are the zombies' own).
func (s *stalledStore) stall(k once.Key) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys[k] = true
}

// Heartbeat hangs for a stalled key until its deadline, as a call over a
// half-open connection does; other keys' go through.
func (s *stalledStore) Heartbeat(ctx context.Context, key once.Key, attempt int, lease time.Duration) (time.Time, bool, error) {
	s.mu.Lock()
	stalled := s.keys[key]
	s.mu.Unlock()
	if !stalled {
		return s.Store.Heartbeat(ctx, key, attempt, lease)
	}
	<-ctx.Done()
	return time.Time{}, false, ctx.Err()
}

func (w *world) newRound(r int) {
	var ks []*key
	for i := range keysPerRound {
		ks = append(ks, w.freshKey(r, i, i%2 == 0))
	}
	w.mu.Lock()
	w.current = ks
	w.mu.Unlock()
}

// freshKey makes step i of round r's run, an email or a charge, with
// its place in the plan.
func (w *world) freshKey(r, i int, email bool) *key {
	k := &key{email: email, rec: once.RetryWithProviderKey}
	k.in = once.Intent{Run: fmt.Sprintf("linearize-%d-%d", w.seed, r), Step: int64(i), Kind: kindCharge, Target: "cus_" + strconv.Itoa(i), Payload: map[string]any{"amount": 100 * (i + 1)}}
	if email {
		k.in.Kind, k.in.Target, k.in.Payload = kindEmail, fmt.Sprintf("user%d@example.com", i), map[string]any{"subject": "receipt"}
		k.rec = once.AskPerson
	}
	var err error
	if k.key, _, err = once.KeyOf(k.in); err != nil {
		w.t.Fatal(err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	n := w.charges
	if email {
		n = w.emails
		p := emailPlan[n%len(emailPlan)]
		k.first, k.abandon = p.first, p.abandon
		w.emails++
	} else {
		p := chargePlan[n%len(chargePlan)]
		k.first, k.decline = p.first, p.decline
		w.charges++
	}
	// 0.3 to 2.5 leases, in steps.
	k.slow = w.lease * time.Duration(3+(7*n)%23) / 10
	w.keys = append(w.keys, k)
	return k
}

// someKey is mostly one of the round's keys, sometimes any key so far.
func (w *world) someKey(rng *rand.Rand) *key {
	w.mu.Lock()
	defer w.mu.Unlock()
	if rng.IntN(5) == 0 {
		return w.keys[rng.IntN(len(w.keys))]
	}
	return w.current[rng.IntN(len(w.current))]
}

func (w *world) allKeys() []*key {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.keys)
}

func (w *world) note(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.log = append(w.log, fmt.Sprintf("%8.1fms ", float64(w.rec.Now())/1e6)+fmt.Sprintf(format, args...))
}

// effect is one call of k's effect, doing b, or k's plan if it runs the
// first attempt.
func (w *world) effect(k *key, b behaviour, slow time.Duration) func(context.Context, once.Attempt) (string, error) {
	plan := func(a once.Attempt) (behaviour, time.Duration) {
		if a.Number == 1 {
			return k.first, k.slow
		}
		return b, slow
	}
	if k.email {
		return func(ctx context.Context, a once.Attempt) (string, error) {
			b, slow := plan(a)
			switch b {
			case bRetryLater:
				return "", once.RetryLater(errors.New("421 4.7.0 try again later"))
			case bPermanent:
				return "", once.Permanent(errors.New("550 5.1.1 no such user"))
			case bUnsent:
				return "", errors.New("connection reset before DATA")
			case bLostReply:
				if _, err := w.outbox.send(ctx, a.Key); err != nil {
					return "", err
				}
				return "", errors.New("timeout waiting for the reply to DATA")
			case bSlow:
				// A slow server, honouring the context as an SMTP
				// client does: a worker that cannot renew its lease
				// stops it.
				t := time.NewTimer(slow)
				defer t.Stop()
				select {
				case <-ctx.Done():
					return "", once.RetryLater(ctx.Err())
				case <-t.C:
				}
			}
			return w.outbox.send(ctx, a.Key)
		}
	}
	return func(ctx context.Context, a once.Attempt) (string, error) {
		b, slow := plan(a)
		switch b {
		case bRetryLater:
			return "", once.RetryLater(errors.New("429 too many requests"))
		case bSlow:
			// A zombie: it ignores its context, as a paused process
			// does, and calls the provider after its lease ran out. The
			// provider's idempotency absorbs it.
			time.Sleep(slow)
		}
		c := w.bank.charge(a.ProviderKey, k.decline)
		switch {
		case c.declined:
			return "", once.Permanent(errors.New("402 card declined"))
		case b == bLostReply || b == bUnsent:
			return "", errors.New("timeout reading the response")
		}
		return c.receipt, nil
	}
}

// worker calls Do (and sometimes Get) until ctx ends.
func (w *world) worker(ctx context.Context, id int) {
	rng := rand.New(rand.NewPCG(w.seed, uint64(id)))
	for ctx.Err() == nil {
		k := w.someKey(rng)
		c := w.direct
		if rng.IntN(2) == 0 {
			c = w.faulted
		}
		// Each call gets its own context: the run's end must not cut a
		// call short (its effect may have happened).
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if rng.IntN(8) == 0 {
			linearize.Get(cctx, w.rec, id, c, k.key, k.rec)
		} else {
			var opts []once.DoOption
			if rng.IntN(4) == 0 {
				opts = append(opts, once.WaitFor(300*time.Millisecond))
			}
			b, slow := pick(rng, w.lease)
			if !k.email && b == bPermanent {
				b = bOK
			}
			linearize.Do(cctx, w.rec, id, c, k.in, w.effect(k, b, slow), opts...)
		}
		cancel()
		time.Sleep(time.Duration(rng.IntN(15)) * time.Millisecond)
	}
}

// person resolves what waits for a person, as one would: after looking
// at the provider, naming the attempt looked at. Now and then a decision
// names an attempt nobody looked at, which must be refused.
func (w *world) person(ctx context.Context, id int) {
	rng := rand.New(rand.NewPCG(w.seed, uint64(id)))
	for ctx.Err() == nil {
		k := w.someKey(rng)
		c := w.direct
		if rng.IntN(3) == 0 {
			c = w.faulted
		}
		w.look(c, id, k, rng, false)
		time.Sleep(time.Duration(20+rng.IntN(40)) * time.Millisecond)
	}
}

// look reads k and, if a person would decide on it, decides. It reports
// the status it read.
func (w *world) look(c *once.Client, id int, k *key, rng *rand.Rand, converging bool) once.Status {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, err := linearize.Get(ctx, w.rec, id, c, k.key, k.rec)
	if err != nil {
		return ""
	}
	// Review always; a failure now and then (a person retries a
	// message that was never sent, a card declined); while converging,
	// a failure is an end.
	decide := a.Status == once.StatusReview || a.Status == once.StatusFailed && !converging && rng.IntN(3) == 0
	if !decide {
		return a.Status
	}
	// A person takes a while to look: whatever the attempt was doing
	// when its lease lapsed has stopped by the time they decide. (While
	// converging, every effect has returned.)
	if !converging {
		time.Sleep(w.lease)
	}
	r := once.Resolution{By: "linearize", Note: "checked the provider", Attempt: a.Attempt}
	if k.email {
		switch sent := w.outbox.of(k.key); {
		case len(sent) > 0:
			r.Decision, r.Result = once.DecisionDone, json.RawMessage(strconv.Quote(sent[0]))
		case k.abandon:
			r.Decision = once.DecisionAbandon
		default:
			r.Decision = once.DecisionRetry
		}
	} else {
		switch ch, _, ok := w.bank.of(string(k.key)); {
		case ok && !ch.declined:
			r.Decision, r.Result = once.DecisionDone, json.RawMessage(strconv.Quote(ch.receipt))
		default:
			r.Decision = once.DecisionRetry
		}
	}
	if !converging && rng.IntN(5) == 0 {
		stale := r
		stale.Attempt = a.Attempt + 1
		linearize.Resolve(ctx, w.rec, id, c, k.key, k.rec, stale)
	}
	linearize.Resolve(ctx, w.rec, id, c, k.key, k.rec, r)
	return a.Status
}

// converge drives every key to succeeded or failed through the direct
// client, once the faults are healed and every effect has returned: the
// workload's own deliveries, and a person for what is in review. It
// reports whether every key got there.
func (w *world) converge() bool {
	keys := make(chan *key)
	var ok atomic.Bool
	ok.Store(true)
	var wg sync.WaitGroup
	deadline := time.Now().Add(30 * time.Second)
	for slot := range convergers {
		id := w.convergeID() + slot
		rng := rand.New(rand.NewPCG(w.seed, uint64(id)))
		wg.Go(func() {
			for k := range keys {
				if !w.settle(k, id, rng, deadline) {
					ok.Store(false)
				}
			}
		})
	}
	for _, k := range w.allKeys() {
		keys <- k
	}
	close(keys)
	wg.Wait()
	return ok.Load()
}

// convergers drive keys to an end at once.
const convergers = 4

// settle drives k to succeeded or failed.
func (w *world) settle(k *key, id int, rng *rand.Rand, deadline time.Time) bool {
	var err error
	for {
		if time.Now().After(deadline) {
			w.trail(k)
			w.t.Errorf("key %s (%s) did not converge in 30s; the last Do returned %v", k.key, k.in.Kind, err)
			return false
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err = linearize.Do(ctx, w.rec, id, w.direct, k.in, w.effect(k, bOK, 0), once.WaitFor(2*w.lease))
		cancel()
		var failed *once.FailedError
		var rev *once.ReviewError
		switch {
		case err == nil, errors.As(err, &failed):
			return true
		case errors.As(err, &rev):
			w.look(w.direct, id, k, rng, true)
		default:
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// trail logs k's row and trail, for a reader of a failure.
func (w *world) trail(k *key) { w.trailOf(k.key) }

// trailOf logs key's row and its events, each with its time on the
// history's clock (milliseconds since the recorder started) as well as
// the database's, so a history that does not linearize can be read
// beside what the store did, and by whom (the event's origin).
func (w *world) trailOf(key once.Key) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := w.direct.Get(ctx, key)
	w.t.Logf("key %s: %s attempt %d, lease until %s, error %q (%v)", key, a.Status, a.Attempt, a.LeaseUntil.Format("15:04:05.000"), a.Error, err)
	evs, err := w.direct.Events(ctx, key)
	if err != nil {
		w.t.Logf("events: %v", err)
	}
	for _, e := range evs {
		w.t.Logf("  %s [%9.1f] %s attempt %d %s→%s by %s (%s): %s", e.At.Format("15:04:05.000"), float64(e.At.Sub(w.rec.Start()))/1e6,
			e.Type, e.Attempt, e.From, e.To, e.Actor, e.Origin, e.Note)
	}
}

// Client ids in the history, after the workers'.
func (w *world) personID() int   { return w.workers }                  // and the next: two people, who may race
func (w *world) convergeID() int { return w.workers + 2 }              // and the next convergers-1: the deliveries that drive every key to an end
func (w *world) zombieID() int   { return w.workers + 2 + convergers } // and up: the scripted zombies, two per round
func (w *world) takeoverID() int { return w.zombieID() + 2*rounds }    // and up: the takeovers of the charge zombies, one per round

// run runs the workload over w and checks what it recorded.
func (w *world) run() {
	t := w.t
	t.Logf("seed %d (set ONCE_LINEARIZE_SEED to change it)", w.seed)
	rng := rand.New(rand.NewPCG(w.seed, 1<<32))
	w.newRound(0)

	reaper, err := once.NewReaper(w.direct, once.ReaperConfig{Interval: 150 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := reaper.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for id := range w.workers {
		wg.Go(func() { w.worker(ctx, id) })
	}
	for id := range 2 {
		wg.Go(func() { w.person(ctx, w.personID()+id) })
	}

	// Every fault at least once, the rest of the rounds drawn, in an
	// order the seed gives.
	// The long faults take several seconds each: once is enough.
	schedule := slices.Clone(w.faults.kinds())
	var short []string
	for _, k := range schedule {
		if !strings.HasSuffix(k, "-long") {
			short = append(short, k)
		}
	}
	for len(schedule) < rounds {
		schedule = append(schedule, short[rng.IntN(len(short))])
	}
	rng.Shuffle(len(schedule), func(i, j int) { schedule[i], schedule[j] = schedule[j], schedule[i] })
	for r, kind := range schedule {
		if r > 0 {
			w.newRound(r)
		}
		// The round's keys get going before the fault strikes, so it
		// finds effects running.
		time.Sleep(roundLength / 4)
		var z *zombie
		if strings.Contains(kind, "past-lease") || strings.Contains(kind, "long") {
			z = w.zombies(&wg, r)
		}
		w.note("round %d: %s", r, kind)
		heal, lasts := w.faults.inject(kind)
		time.Sleep(max(roundLength*3/4, lasts+w.lease/2))
		if heal != nil {
			heal()
		}
		if z != nil {
			// The charge zombie returns now that the fault is over and
			// a newer attempt holds its key: its outcome reaches the
			// database, to be refused, before the next fault can stop
			// it getting there.
			z.healed()
			z.wait(r)
		}
	}
	stop()
	wg.Wait()
	w.note("workload over; converging")
	converged := w.converge()
	reaper.Stop()
	w.note("converged")
	w.mu.Lock()
	t.Logf("the run:\n%s", strings.Join(w.log, "\n"))
	w.mu.Unlock()
	if !converged {
		t.FailNow()
	}

	w.checkProviders()
	w.checkHistory()
}

// zombie is a round's scripted charge zombie.
type zombie struct {
	w *world
	// heal is closed once the round's fault is over.
	heal chan struct{}
	// done is closed when its Do has returned.
	done chan struct{}
}

func (z *zombie) healed() { close(z.heal) }

// wait waits for the zombie's Do to return.
func (z *zombie) wait(r int) {
	select {
	case <-z.done:
	case <-time.After(time.Minute):
		z.w.t.Fatalf("round %d: the charge zombie's Do did not return in a minute", r)
	}
}

// zombies starts two zombies on fresh keys, and returns once both
// effects run. The first is a charge, through a client whose heartbeats
// for its key do not get through: its lease lapses a lease in, a newer
// attempt takes it over (a worker, or the takeover this starts through
// the direct client), and only once that attempt is seen in the ledger
// and the round's fault is over does the zombie call the bank and
// return, so its outcome is refused by fencing in every run. The second
// is an email, through the faulted client, that honours its context:
// the fault that follows cuts it off from the database past its lease,
// and the workers, who get both keys, put it up for review while it
// still runs.
func (w *world) zombies(wg *sync.WaitGroup, r int) *zombie {
	z := &zombie{w: w, heal: make(chan struct{}), done: make(chan struct{})}
	charge := func(k *key) func(context.Context, once.Attempt) (string, error) {
		return func(ctx context.Context, a once.Attempt) (string, error) {
			w.stalled.stall(k.key)
			taken := make(chan struct{})
			go func() {
				defer close(taken)
				if !w.takeOver(k, w.takeoverID()+r) {
					w.trail(k)
					w.t.Errorf("round %d: no newer attempt of the charge zombie's key %.12s was claimed in 30s", r, k.key)
				}
			}()
			// It ignores its context, as a paused process does.
			<-taken
			<-z.heal
			c := w.bank.charge(a.ProviderKey, k.decline)
			if c.declined {
				return "", once.Permanent(errors.New("402 card declined"))
			}
			return c.receipt, nil
		}
	}
	email := func(*key) func(context.Context, once.Attempt) (string, error) {
		return func(ctx context.Context, a once.Attempt) (string, error) {
			<-ctx.Done()
			return "", once.RetryLater(ctx.Err())
		}
	}
	started := make(chan *key, 2)
	for i, fn := range []func(*key) func(context.Context, once.Attempt) (string, error){charge, email} {
		c := w.zombie
		if i == 1 {
			c = w.faulted
		}
		wg.Go(func() {
			if i == 0 {
				defer close(z.done)
			}
			// A claim may time out while the database is busy: then
			// the zombie tries again on a fresh key.
			for try := range 10 {
				k := w.freshKey(r, 100+10*i+try, i == 1)
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				effect, ran := fn(k), false
				_, err := linearize.Do(ctx, w.rec, w.zombieID()+2*r+i, c, k.in, func(ctx context.Context, a once.Attempt) (string, error) {
					ran = true
					started <- k
					return effect(ctx, a)
				})
				cancel()
				if ran {
					if i == 0 {
						var fenced *once.FencedError
						if !errors.As(err, &fenced) {
							w.t.Errorf("round %d: the charge zombie's late outcome on %.12s was not refused: %v", r, k.key, err)
						}
					}
					return
				}
				w.note("round %d: a zombie's Do on %.12s ran nothing: %v", r, k.key, err)
			}
		})
	}
	for range 2 {
		select {
		case k := <-started:
			w.mu.Lock()
			w.current = append(w.current, k)
			w.mu.Unlock()
		case <-time.After(20 * time.Second):
			w.t.Fatal("a scripted zombie's effect did not start in 20s")
		}
	}
	return z
}

// takeOver waits for a newer attempt of k than the first to be claimed,
// calling Do on k through the direct client, which takes the claim over
// once its lease has run out (a worker may get there first). It reports
// whether the ledger showed one within 30 seconds.
func (w *world) takeOver(k *key, id int) bool {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		a, err := linearize.Get(ctx, w.rec, id, w.direct, k.key, k.rec)
		if err == nil && a.Attempt > 1 {
			cancel()
			return true
		}
		if err == nil {
			linearize.Do(ctx, w.rec, id, w.direct, k.in, w.effect(k, bOK, 0), once.WaitFor(2*w.lease))
		}
		cancel()
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// checkProviders compares every key's end in the ledger with what its
// provider saw: at most one message per email, and a success stored with
// exactly the receipt of the one effect that happened.
func (w *world) checkProviders() {
	t := w.t
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var absorbed int
	for _, k := range w.allKeys() {
		a, err := linearize.Get(ctx, w.rec, w.convergeID(), w.direct, k.key, k.rec)
		if err != nil {
			t.Errorf("key %s: %v", k.key, err)
			continue
		}
		var stored string
		if a.Status == once.StatusSucceeded {
			if err := json.Unmarshal(a.Result, &stored); err != nil {
				t.Errorf("key %s: stored result %s is not a receipt", k.key, a.Result)
			}
		}
		if k.email {
			sent := w.outbox.of(k.key)
			switch {
			case len(sent) > 1:
				t.Errorf("email %s was sent %d times (%v); the ledger says %s at attempt %d", k.key, len(sent), sent, a.Status, a.Attempt)
			case a.Status == once.StatusSucceeded && (len(sent) != 1 || stored != sent[0]):
				t.Errorf("email %s: the ledger says succeeded with %q, the outbox has %v", k.key, stored, sent)
			case a.Status == once.StatusFailed && len(sent) != 0:
				t.Errorf("email %s: the ledger says failed, the outbox has %v", k.key, sent)
			case a.Status != once.StatusSucceeded && a.Status != once.StatusFailed:
				t.Errorf("email %s ended %s", k.key, a.Status)
			}
			continue
		}
		ch, calls, made := w.bank.of(string(k.key))
		if calls > 1 {
			absorbed += calls - 1
		}
		switch {
		case a.Status == once.StatusSucceeded && (!made || ch.declined || stored != ch.receipt):
			t.Errorf("charge %s: the ledger says succeeded with %q, the bank has %+v (made %v)", k.key, stored, ch, made)
		case a.Status == once.StatusFailed && made && !ch.declined:
			t.Errorf("charge %s: the ledger says failed, the bank charged it (%s)", k.key, ch.receipt)
		case a.Status != once.StatusSucceeded && a.Status != once.StatusFailed:
			t.Errorf("charge %s ended %s", k.key, a.Status)
		}
	}
	t.Logf("the bank absorbed %d repeated calls through the idempotency key", absorbed)
	// AskPerson never runs an attempt while another may still be
	// running: each attempt of an email starts after the one before it
	// returned.
	ran := w.rec.Ran()
	for _, k := range w.allKeys() {
		if !k.email {
			continue
		}
		for n := 2; ; n++ {
			cur, ok := ran[linearize.Attempt{Key: k.key, Number: n}]
			if !ok {
				break
			}
			if prev, ok := ran[linearize.Attempt{Key: k.key, Number: n - 1}]; ok && prev.End > cur.Start {
				t.Errorf("email %s: attempt %d ran from %.1fms, while attempt %d ran until %.1fms", k.key, n, float64(cur.Start)/1e6, n-1, float64(prev.End)/1e6)
			}
		}
	}
	for _, p := range w.rec.Problems() {
		t.Errorf("recorder: %s", p)
	}
}

// checkHistory runs porcupine over the history, and checks that the run
// went where it was meant to: claims lost, taken over, fenced, reviewed
// and resolved.
func (w *world) checkHistory() {
	t := w.t
	h := w.rec.History()
	counts := map[string]int{}
	for _, op := range h {
		in, out := op.Input.(linearize.Input), op.Output.(linearize.Output)
		name := in.Op.String() + " " + out.Result.String()
		switch in.Op {
		case linearize.OpClaim:
			if in.Attempt > 1 {
				name = "claim of a later attempt"
			}
		case linearize.OpOutcome:
			counts[name]++
			name += " " + string(in.Outcome)
		case linearize.OpResolve:
			name += " " + string(in.Decision)
		case linearize.OpAnswer, linearize.OpRead:
			if out.Result == linearize.Saw {
				name += " " + string(out.Status)
			}
		}
		counts[name]++
	}
	var lines []string
	for name, n := range counts {
		lines = append(lines, fmt.Sprintf("%6d  %s", n, name))
	}
	sort.Strings(lines)
	t.Logf("history:\n%s\nfaults: %s", strings.Join(lines, "\n"), w.faults.report())

	started := time.Now()
	v := linearize.Check(h, time.Minute)
	t.Logf("porcupine: %s, %d operations on %d keys, in %v", v.Result, v.Ops, v.Keys, time.Since(started).Round(time.Millisecond))
	if v.Result != porcupine.Ok {
		if path, err := v.Visualize(); err == nil {
			t.Logf("porcupine's view of the history: %s", path)
		}
		for _, k := range v.Illegal {
			w.trailOf(k)
		}
		if v.Result == porcupine.Unknown {
			t.Fatalf("porcupine could not decide within a minute")
		}
		t.Fatalf("the ledger's history is not linearizable:\n%s", v.Explanation)
	}
	// The run must have reached what it is meant to test; each of these
	// comes from dozens of chances.
	for _, want := range []string{
		"claim of a later attempt",
		"outcome applied succeeded",
		"outcome applied released",
		"outcome applied review",
		"outcome applied failed",
		"resolve applied done",
		"resolve applied retry",
		"resolve applied abandon",
		"outcome refused",
		"do saw succeeded",
		"do saw in_flight",
	} {
		if counts[want] == 0 {
			t.Errorf("the run never saw %q: it does not test what it is meant to", want)
		}
	}
}
