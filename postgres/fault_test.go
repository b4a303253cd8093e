package postgres_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/faultproxy"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/postgres"
)

// proxiedStore opens a second store on schema through a fault proxy, as a
// worker on another machine would reach the same database. Statements
// carry their text every time, so a proxy's marker sees each execution.
func proxiedStore(t *testing.T, schema string) (*postgres.Store, *faultproxy.Proxy) {
	t.Helper()
	cfg, err := pgx.ParseConfig(testdb.RequirePostgres(t))
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.Start(fmt.Sprintf("%s:%d", cfg.Host, cfg.Port))
	if err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable&default_query_exec_mode=exec&pool_max_conns=4", cfg.User, p.Addr(), cfg.Database)
	s, err := postgres.Open(context.Background(), url, postgres.Config{Schema: schema})
	if err != nil {
		p.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Close()
		s.Close()
	})
	return s, p
}

// interval is when one attempt's effect ran, by this process's clock.
type interval struct {
	attempt    int
	start, end time.Time
}

type runs struct {
	mu  sync.Mutex
	all []interval
}

func (r *runs) add(i interval) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, i)
}

func (r *runs) get() []interval {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]interval(nil), r.all...)
}

// A worker cut off from the database by a half-open partition (the
// proxy stops forwarding and resets nothing) must stop its effect before
// recovery lets a second attempt run: two attempts never overlap. The
// heartbeat's calls hang rather than fail here, so only a deadline on
// each call and a timer of its own can stop the effect in time.
//
// Refused connections fail fast instead; the effect must still stop
// before recovery, not a heartbeat period after the lease ended.
func TestCutOffWorkerStopsTheEffect(t *testing.T) {
	type cut struct {
		name  string
		apply func(*faultproxy.Proxy)
	}
	cuts := []cut{
		{"black_hole", func(p *faultproxy.Proxy) { p.Blackout(true) }},
		{"refused", func(p *faultproxy.Proxy) { p.Refuse(true); p.Reset() }},
	}
	for _, rec := range []once.Recovery{once.RetryWithProviderKey, once.VerifyThenDecide} {
		for _, c := range cuts {
			t.Run(rec.String()+"/"+c.name, func(t *testing.T) { testCutOffWorker(t, rec, c.apply) })
		}
	}
}

func testCutOffWorker(t *testing.T, rec once.Recovery, apply func(*faultproxy.Proxy)) {
	t.Parallel()
	direct, schema := newStore(t)
	ctx := context.Background()
	if err := direct.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	cut, proxy := proxiedStore(t, schema)
	pol := once.KindPolicy{Recovery: rec, Lease: 600 * time.Millisecond, MaxExecution: 30 * time.Second}
	if rec == once.VerifyThenDecide {
		pol.Verifier = func(context.Context, once.Action) (bool, json.RawMessage, error) { return false, nil, nil }
	}
	cfg := func(s once.Store) once.Config {
		return once.Config{Store: s, Default: pol, RecordTimeout: time.Second}
	}
	worker1, err := once.New(cfg(cut))
	if err != nil {
		t.Fatal(err)
	}
	worker2, err := once.New(cfg(direct))
	if err != nil {
		t.Fatal(err)
	}
	in := once.Intent{Run: "partition", Kind: "post_message", Target: "#general"}
	var log runs
	cutOff := make(chan struct{})
	// Runs until its context is cancelled, as a long call that
	// honours its context does.
	effect := func(ctx context.Context, a once.Attempt) (string, error) {
		i := interval{attempt: a.Number, start: time.Now()}
		if a.Number == 1 {
			apply(proxy)
			close(cutOff)
			<-ctx.Done()
		}
		i.end = time.Now()
		log.add(i)
		return "posted", ctx.Err()
	}
	done := make(chan error, 1)
	go func() {
		_, err := once.Do(ctx, worker1, in, effect)
		done <- err
	}()
	<-cutOff
	// The redelivered job, on a worker that still reaches the
	// database, comes back until it runs or is answered.
	deadline := time.Now().Add(20 * time.Second)
	for {
		res, err := once.Do(ctx, worker2, in, effect)
		if err == nil && res.Attempt >= 2 {
			break
		}
		if !errors.Is(err, once.ErrInFlight) && err != nil && !errors.Is(err, once.ErrOutcomeUnknown) {
			t.Fatalf("second worker: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no second attempt within 20s: last %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the cut-off worker's effect was still running after a second attempt ran")
	}
	got := log.get()
	if len(got) != 2 {
		t.Fatalf("effect intervals = %+v, want two attempts", got)
	}
	first, second := got[0], got[1]
	if first.attempt != 1 {
		first, second = second, first
	}
	if !first.end.Before(second.start) {
		t.Fatalf("attempt 1 ran until %s, attempt 2 started at %s: two attempts ran at once",
			first.end.Format("15:04:05.000"), second.start.Format("15:04:05.000"))
	}
}

// faultClients returns a client over the proxied store and one over a
// direct store on the same schema.
func faultClients(t *testing.T, cfg once.Config) (cut, direct *once.Client, proxy *faultproxy.Proxy, s once.Store) {
	t.Helper()
	d, schema := newStore(t)
	if err := d.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	ps, proxy := proxiedStore(t, schema)
	cfg.Store = ps
	cut, err := once.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Store = d
	direct, err = once.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cut, direct, proxy, d
}

// The claim commits and its reply is lost. The worker must find out that
// the claim is its own and carry on: one execution, recorded, and no
// person paged for an effect that never started.
func TestClaimReplyLost(t *testing.T) {
	t.Parallel()
	c, _, proxy, s := faultClients(t, once.Config{Default: once.KindPolicy{Lease: 2 * time.Second}})
	ctx := context.Background()
	in := once.Intent{Run: "lost-claim", Kind: "send_email", Target: "ada@example.com"}
	cut := proxy.CutAfter([]byte("ON CONFLICT (key) DO NOTHING"), faultproxy.PostgresReady)
	ran := 0
	res, err := once.Do(ctx, c, in, func(context.Context, once.Attempt) (string, error) {
		ran++
		return "sent", nil
	})
	select {
	case <-cut:
	default:
		t.Fatal("the claim's reply was never cut")
	}
	if err != nil || res.Value != "sent" || ran != 1 {
		t.Fatalf("Do after a lost claim reply = %+v, %v (ran %d); want the effect run once and recorded", res, err, ran)
	}
	k, _, _ := once.KeyOf(in)
	if a, err := s.Get(ctx, k); err != nil || a.Status != once.StatusSucceeded || a.Attempt != 1 {
		t.Fatalf("stored %+v, %v", a, err)
	}
}

// A person's decision commits and its reply is lost: Resolve must report
// the decision applied, not refused.
func TestResolveReplyLost(t *testing.T) {
	t.Parallel()
	c, direct, proxy, s := faultClients(t, once.Config{})
	ctx := context.Background()
	in := once.Intent{Run: "lost-resolve", Kind: "send_email", Target: "ada@example.com"}
	if _, err := once.Do(ctx, direct, in, func(context.Context, once.Attempt) (int, error) { return 0, errors.New("timeout after DATA") }); !errors.Is(err, once.ErrReview) {
		t.Fatalf("Do = %v, want review", err)
	}
	k, _, _ := once.KeyOf(in)
	cut := proxy.CutAfter([]byte("WITH u AS ("), faultproxy.PostgresReady)
	a, err := c.Resolve(ctx, k, once.Resolution{Decision: once.DecisionDone, By: "ada", Note: "in the mail log"})
	select {
	case <-cut:
	default:
		t.Fatal("the resolution's reply was never cut")
	}
	if err != nil || a.Status != once.StatusSucceeded {
		t.Fatalf("Resolve after a lost reply = %s, %v; want the decision reported applied", a.Status, err)
	}
	evs, _ := s.Events(ctx, k)
	for _, e := range evs {
		if e.Type == once.EventRefused {
			t.Fatalf("the trail says the person's own decision was refused: %+v", e)
		}
	}
}

// The claim commits, its reply never comes, and the caller gives up
// waiting (its context ends). The claim is found to be this caller's,
// and since the caller is gone it is released unrun: the next delivery
// runs the effect, instead of meeting a claim nobody holds.
func TestClaimWonAfterCallerGaveUp(t *testing.T) {
	t.Parallel()
	c, direct, proxy, s := faultClients(t, once.Config{Default: once.KindPolicy{Lease: time.Minute}})
	in := once.Intent{Run: "gave-up", Kind: "send_email", Target: "ada@example.com"}
	hung := proxy.HangAfter([]byte("ON CONFLICT (key) DO NOTHING"), faultproxy.PostgresReady)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-hung
		cancel()
	}()
	ran := 0
	_, err := once.Do(ctx, c, in, func(context.Context, once.Attempt) (string, error) {
		ran++
		return "sent", nil
	})
	if !errors.Is(err, once.ErrRetryLater) || ran != 0 {
		t.Fatalf("Do whose caller gave up = %v (ran %d); want the claim released unrun (ErrRetryLater)", err, ran)
	}
	k, _, _ := once.KeyOf(in)
	if a, err := s.Get(context.Background(), k); err != nil || a.Status != once.StatusReleased {
		t.Fatalf("stored %+v, %v; want released", a.Status, err)
	}
	res, err := once.Do(context.Background(), direct, in, func(context.Context, once.Attempt) (string, error) {
		ran++
		return "sent", nil
	})
	if err != nil || ran != 1 || res.Attempt != 2 {
		t.Fatalf("next delivery = %+v, %v (ran %d); want it to run as attempt 2", res, err, ran)
	}
}

// A plain Do on a key that an open DoTx has claimed must not wait on the
// row lock for as long as the transaction lasts (holding a pool
// connection all the while): it answers in flight, and the job goes back
// to its queue.
func TestDoOnKeyHeldByOpenDoTx(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := once.New(once.Config{Store: s})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	in := once.Intent{Run: "open-tx", Kind: "write_record"}
	if _, err := once.DoTx(ctx, c, s, tx, in, func(context.Context, pgx.Tx, once.Attempt) (int, error) { return 1, nil }); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := once.Do(ctx, c, in, func(context.Context, once.Attempt) (int, error) {
			t.Error("ran the effect of an action an open transaction holds")
			return 0, nil
		})
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, once.ErrInFlight) {
			t.Fatalf("Do on a key held by an open transaction = %v; want ErrInFlight", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Do waited on the open transaction's row lock for 30s")
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}
