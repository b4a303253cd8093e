package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/faultproxy"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/postgres"
)

// The store's side of once.WaitFor: notifications, the listening
// connection, and the poll that stands in for a lost notification. The
// behaviour common to both stores is in storetest.

// patience bounds every wait for something that must happen; the waits
// under test are an hour long, so a call that returns was woken.
const patience = 30 * time.Second

func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(patience):
		t.Fatalf("%s did not happen within %v", what, patience)
		panic("unreachable")
	}
}

// eventually waits for cond, checking every 10ms, for up to patience.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not happen within %v", what, patience)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// migrated is newStore, migrated, with a waiter's polls an hour apart:
// a waiter it wakes was notified (or its listener reconnected).
func migrated(t *testing.T) (*postgres.Store, string) {
	t.Helper()
	s, schema := newStore(t)
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	postgres.SetPollInterval(s, time.Hour)
	return s, schema
}

// listening starts the store's listener with a short wait on a key
// nobody uses, and waits until its self-check passed. Waiters that start
// after it are woken only by notifications, or a reconnect.
func listening(t *testing.T, s *postgres.Store) {
	t.Helper()
	if err := s.Wait(context.Background(), once.WaitRequest{Key: "warm-up", Until: time.Now().Add(10 * time.Millisecond)}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the listener getting ready", func() bool { return postgres.ListenerReady(s) })
}

// client is a client over s whose EventWaiting observations arrive on
// the returned channel.
func client(t *testing.T, s once.Store) (*once.Client, <-chan once.Observation) {
	t.Helper()
	waits := make(chan once.Observation, 16)
	c, err := once.New(once.Config{Store: s, Hooks: once.Hooks{OnEvent: func(_ context.Context, o once.Observation) {
		if o.Type == once.EventWaiting {
			waits <- o
		}
	}}})
	if err != nil {
		t.Fatal(err)
	}
	return c, waits
}

type doResult struct {
	res once.Result[string]
	err error
}

func goDo(ctx context.Context, c *once.Client, in once.Intent, fn func(context.Context, once.Attempt) (string, error), opts ...once.DoOption) <-chan doResult {
	out := make(chan doResult, 1)
	go func() {
		res, err := once.Do(ctx, c, in, fn, opts...)
		out <- doResult{res, err}
	}()
	return out
}

// first is a Do whose effect runs until finish.
type first struct {
	t    *testing.T
	end  chan string
	done <-chan doResult
}

func startFirst(t *testing.T, c *once.Client, in once.Intent) *first {
	t.Helper()
	started := make(chan struct{})
	f := &first{t: t, end: make(chan string, 1)}
	f.done = goDo(context.Background(), c, in, func(context.Context, once.Attempt) (string, error) {
		close(started)
		return <-f.end, nil
	})
	recv(t, started, "the first attempt's effect starting")
	return f
}

func (f *first) finish(v string) {
	f.t.Helper()
	f.end <- v
	if o := recv(f.t, f.done, "the first Do returning"); o.err != nil {
		f.t.Fatalf("first Do = %v", o.err)
	}
}

func mustNotRun(t *testing.T) func(context.Context, once.Attempt) (string, error) {
	return func(context.Context, once.Attempt) (string, error) {
		t.Error("the waiting duplicate ran the effect")
		return "", nil
	}
}

// marked reads whether a waiter has marked the action's row.
func marked(t *testing.T, schema string, k once.Key) bool {
	t.Helper()
	var m bool
	err := sharedPool(t).QueryRow(context.Background(), `SELECT waiters FROM `+pgx.Identifier{schema, "once_action"}.Sanitize()+` WHERE key = $1`, string(k)).Scan(&m)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func keyOf(t *testing.T, in once.Intent) once.Key {
	t.Helper()
	k, _, err := once.KeyOf(in)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

var waitIntent = once.Intent{Run: "r", Kind: "send_email", Target: "ada@example.com", Payload: "hello"}

// wantReplay checks that a waiting duplicate got v replayed.
func wantReplay(t *testing.T, o doResult, v string) {
	t.Helper()
	if o.err != nil || !o.res.Replayed || o.res.Value != v {
		t.Fatalf("waiting duplicate = %+v, %v; want %q replayed", o.res, o.err, v)
	}
}

// With polls an hour apart and a lease minutes long, only the
// notification the first attempt's outcome sends can wake the duplicate.
func TestWaitWokenByNotification(t *testing.T) {
	t.Parallel()
	s, schema := migrated(t)
	listening(t, s)
	c, waits := client(t, s)
	f := startFirst(t, c, waitIntent)
	second := goDo(context.Background(), c, waitIntent, mustNotRun(t), once.WaitFor(time.Hour))
	recv(t, waits, "the duplicate waiting")
	eventually(t, "the duplicate marking the row", func() bool { return marked(t, schema, keyOf(t, waitIntent)) })
	f.finish("notified")
	wantReplay(t, recv(t, second, "the duplicate woken"), "notified")
}

// The listening connection terminated by the server: the listener opens
// another, and the duplicate is woken whether the outcome lands after
// the new connection listens (a notification) or while there is none
// (the reconnect wakes every waiter to read its row again).
func TestWaitListenerTerminated(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		whileOff bool
	}{{"OutcomeAfterReconnect", false}, {"OutcomeWhileDisconnected", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, schema := migrated(t)
			reconnect := 100 * time.Millisecond
			if tc.whileOff {
				reconnect = 2 * time.Second // room to land the outcome while it is off
			}
			postgres.SetListenTimings(s, reconnect, time.Second)
			listening(t, s)
			c, waits := client(t, s)
			f := startFirst(t, c, waitIntent)
			second := goDo(context.Background(), c, waitIntent, mustNotRun(t), once.WaitFor(time.Hour))
			recv(t, waits, "the duplicate waiting")
			eventually(t, "the duplicate marking the row", func() bool { return marked(t, schema, keyOf(t, waitIntent)) })
			pid := postgres.ListenerPID(s)
			var killed bool
			if err := sharedPool(t).QueryRow(context.Background(), `SELECT pg_terminate_backend($1)`, pid).Scan(&killed); err != nil || !killed {
				t.Fatalf("pg_terminate_backend(%d) = %v, %v", pid, killed, err)
			}
			if tc.whileOff {
				eventually(t, "the listener noticing", func() bool { return postgres.ListenerPID(s) == 0 })
			} else {
				eventually(t, "the listener listening again", func() bool {
					p := postgres.ListenerPID(s)
					return p != 0 && p != pid && postgres.ListenerReady(s)
				})
			}
			f.finish("after the drop")
			wantReplay(t, recv(t, second, "the duplicate woken"), "after the drop")
			if tc.whileOff {
				eventually(t, "the listener listening again", func() bool { return postgres.ListenerReady(s) })
			}
		})
	}
}

// A waiter holds no connection of the pool: with one connection in
// all, the store serves other calls while a duplicate waits, and the
// listening connection is not the pool's.
func TestWaitHoldsNoPoolConnection(t *testing.T) {
	t.Parallel()
	_, schema := migrated(t)
	cfg, err := pgxpool.ParseConfig(testdb.RequirePostgres(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	p, err := openPool(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	s, err := postgres.New(p, postgres.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	postgres.SetPollInterval(s, time.Hour)
	listening(t, s)
	c, waits := client(t, s)
	f := startFirst(t, c, waitIntent)
	second := goDo(context.Background(), c, waitIntent, mustNotRun(t), once.WaitFor(time.Hour))
	recv(t, waits, "the duplicate waiting")
	eventually(t, "the duplicate marking the row", func() bool { return marked(t, schema, keyOf(t, waitIntent)) })

	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	other := waitIntent
	other.Step = 1
	if res, err := once.Do(ctx, c, other, func(context.Context, once.Attempt) (string, error) { return "beside", nil }); err != nil || res.Value != "beside" {
		t.Fatalf("another Do while a duplicate waits = %+v, %v", res, err)
	}
	if a, err := c.Get(ctx, keyOf(t, waitIntent)); err != nil || a.Status != once.StatusInFlight {
		t.Fatalf("Get while a duplicate waits = %+v, %v", a, err)
	}
	if n := p.Stat().TotalConns(); n > 1 {
		t.Fatalf("the pool has %d connections, more than its MaxConns of 1", n)
	}
	conn, err := p.Acquire(ctx)
	if err != nil {
		t.Fatalf("acquiring the pool's one connection while a duplicate waits: %v", err)
	}
	if conn.Conn().PgConn().PID() == postgres.ListenerPID(s) {
		t.Fatal("the store listens on the pool's connection")
	}
	conn.Release()
	f.finish("one connection")
	wantReplay(t, recv(t, second, "the duplicate woken"), "one connection")
}

// A transition that rolls back notifies nobody: PostgreSQL delivers a
// notification only when its transaction commits. Notifications reach
// the listener in commit order, so when a waiter on a second row that
// committed after it has been woken, the first waiter would have been
// woken before it.
func TestWaitRollbackNotifiesNobody(t *testing.T) {
	t.Parallel()
	s, schema := migrated(t)
	listening(t, s)
	ctx := context.Background()
	var keys []once.Key
	var waits []<-chan error
	for step := range int64(2) {
		in := waitIntent
		in.Step = step
		k, fp, _ := once.KeyOf(in)
		if cr, err := s.Claim(ctx, once.ClaimRequest{Key: k, Fingerprint: fp, Run: in.Run, Step: step, Kind: in.Kind, Target: in.Target, Lease: time.Hour}); err != nil || !cr.Claimed {
			t.Fatalf("claim: %+v %v", cr, err)
		}
		out := make(chan error, 1)
		go func() {
			out <- s.Wait(ctx, once.WaitRequest{Key: k, Status: once.StatusInFlight, Attempt: 1, Until: time.Now().Add(time.Hour)})
		}()
		keys, waits = append(keys, k), append(waits, out)
	}
	succeed := func(st once.Store, k once.Key, result string) {
		t.Helper()
		ok, err := st.Transition(ctx, once.Transition{Key: k, Attempt: 1, From: []once.Status{once.StatusInFlight}, To: once.StatusSucceeded,
			Result: []byte(`"` + result + `"`), Event: once.Event{Key: k, Type: once.EventSucceeded, From: once.StatusInFlight, Actor: once.ActorWorker}})
		if err != nil || !ok {
			t.Fatalf("transition of %s: %v %v", k, ok, err)
		}
	}
	tx, err := sharedPool(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Both rows must be marked before the transitions, or they would not
	// notify at all.
	eventually(t, "both waiters marking their rows", func() bool {
		return marked(t, schema, keys[0]) && marked(t, schema, keys[1])
	})
	succeed(s.BindTx(tx), keys[0], "rolled back")
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	succeed(s, keys[1], "committed")
	if err := recv(t, waits[1], "the waiter on the committed row"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waits[0]:
		t.Fatalf("a rolled-back transition woke its waiter (%v)", err)
	default:
	}
	if a, err := s.Get(ctx, keys[0]); err != nil || a.Status != once.StatusInFlight {
		t.Fatalf("after the rollback: %+v %v", a, err)
	}
	succeed(s, keys[0], "real")
	if err := recv(t, waits[0], "the waiter on the row that succeeded for real"); err != nil {
		t.Fatal(err)
	}
}

// rounds counts a store's waits: the engine waits again each time it is
// woken and finds the action still in flight.
type rounds struct {
	*postgres.Store
	n atomic.Int64
}

func (r *rounds) Wait(ctx context.Context, req once.WaitRequest) error {
	r.n.Add(1)
	return r.Store.Wait(ctx, req)
}

// A notification that says nothing true (sent by hand here; a peer's
// after a reconnect) wakes the duplicate, which reads the row, finds
// the first attempt still running and waits again; it answers only with
// what the first attempt recorded.
func TestWaitSpuriousWakeChecksAgain(t *testing.T) {
	t.Parallel()
	s, schema := migrated(t)
	listening(t, s)
	r := &rounds{Store: s}
	c, waits := client(t, r)
	f := startFirst(t, c, waitIntent)
	second := goDo(context.Background(), c, waitIntent, mustNotRun(t), once.WaitFor(time.Hour))
	recv(t, waits, "the duplicate waiting")
	k := keyOf(t, waitIntent)
	eventually(t, "the duplicate marking the row", func() bool { return marked(t, schema, k) })
	before := r.n.Load()
	if _, err := sharedPool(t).Exec(context.Background(), `SELECT pg_notify('once_actions', $1)`, schema+".once_action:"+string(k)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the duplicate waiting again", func() bool { return r.n.Load() > before })
	select {
	case o := <-second:
		t.Fatalf("a notification with nothing behind it ended the wait: %+v, %v", o.res, o.err)
	default:
	}
	f.finish("real")
	wantReplay(t, recv(t, second, "the duplicate woken"), "real")
}

// A listener that does not get its own notification back (here it
// listens in another database, as behind a pooler that loses them) marks
// the store's notifications lost: waiters stop marking rows and poll.
func TestWaitLostNotificationsPoll(t *testing.T) {
	t.Parallel()
	s, schema := newStore(t)
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(testdb.RequirePostgres(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/postgres"
	elsewhere, err := postgres.New(sharedPool(t), postgres.Config{Schema: schema, ListenURL: u.String()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { elsewhere.Close() })
	postgres.SetListenTimings(elsewhere, time.Minute, 200*time.Millisecond)
	if err := elsewhere.Wait(context.Background(), once.WaitRequest{Key: "warm-up", Until: time.Now().Add(10 * time.Millisecond)}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the self-check failing", func() bool { return postgres.ListenerUnavailable(elsewhere) })
	c, waits := client(t, elsewhere)
	f := startFirst(t, c, waitIntent)
	second := goDo(context.Background(), c, waitIntent, mustNotRun(t), once.WaitFor(time.Hour))
	recv(t, waits, "the duplicate waiting")
	f.finish("polled")
	wantReplay(t, recv(t, second, "the duplicate polling"), "polled")
	if marked(t, schema, keyOf(t, waitIntent)) {
		t.Fatal("a waiter marked its row though notifications are lost")
	}
}

// PollOnly opens no listening connection and marks no row; waiters poll.
func TestWaitPollOnly(t *testing.T) {
	t.Parallel()
	_, schema := migrated(t)
	s, err := postgres.New(sharedPool(t), postgres.Config{Schema: schema, PollOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	c, waits := client(t, s)
	f := startFirst(t, c, waitIntent)
	second := goDo(context.Background(), c, waitIntent, mustNotRun(t), once.WaitFor(time.Hour))
	recv(t, waits, "the duplicate waiting")
	f.finish("polled")
	wantReplay(t, recv(t, second, "the duplicate polling"), "polled")
	if postgres.ListenerPID(s) != 0 || marked(t, schema, keyOf(t, waitIntent)) {
		t.Fatal("a PollOnly store listened or marked a row")
	}

	for _, cfg := range []postgres.Config{
		{PollOnly: true, ListenURL: testdb.PostgresURL()},
		{ListenURL: "mysql://nope"},
	} {
		if _, err := postgres.New(sharedPool(t), cfg); err == nil || !strings.Contains(err.Error(), "ListenURL") {
			t.Errorf("New(%+v) = %v; want an error naming ListenURL", cfg, err)
		}
	}
}

// A context that ends stops a store's wait at once, and a store closed
// while waiters wait stops listening; they go on polling.
func TestWaitAfterClose(t *testing.T) {
	t.Parallel()
	s, schema := migrated(t)
	listening(t, s)
	postgres.SetPollInterval(s, 20*time.Millisecond)
	ctx := context.Background()
	in := waitIntent
	k, fp, _ := once.KeyOf(in)
	if _, err := s.Claim(ctx, once.ClaimRequest{Key: k, Fingerprint: fp, Run: in.Run, Kind: in.Kind, Target: in.Target, Lease: time.Hour}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- s.Wait(ctx, once.WaitRequest{Key: k, Status: once.StatusInFlight, Attempt: 1, Until: time.Now().Add(time.Hour)})
	}()
	eventually(t, "the waiter marking the row", func() bool { return marked(t, schema, k) })
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if postgres.ListenerPID(s) != 0 {
		t.Fatal("Close left the listening connection open")
	}
	if ok, err := s.Transition(ctx, once.Transition{Key: k, Attempt: 1, From: []once.Status{once.StatusInFlight}, To: once.StatusFailed, Error: "no"}); err != nil || !ok {
		t.Fatalf("transition: %v %v", ok, err)
	}
	if err := recv(t, done, "the waiter polling after Close"); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.Wait(cctx, once.WaitRequest{Key: k, Status: once.StatusFailed, Attempt: 1, Until: time.Now().Add(time.Hour)}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait with an ended context = %v", err)
	}
}

// A DoTx's transaction that held the key rolls back while a duplicate
// waits for it, with the listener already listening (so its first
// connect wakes nobody): no row appears and nothing notifies, yet the
// key is free. The duplicate claims it and runs the effect, instead of
// waiting out its hour.
func TestWaitRolledBackTxClaims(t *testing.T) {
	t.Parallel()
	s, _ := migrated(t)
	listening(t, s)
	waits := make(chan once.Observation, 16)
	c, err := once.New(once.Config{Store: s, ClaimTimeout: 200 * time.Millisecond, Hooks: once.Hooks{OnEvent: func(_ context.Context, o once.Observation) {
		if o.Type == once.EventWaiting {
			waits <- o
		}
	}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tx, err := sharedPool(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := once.DoTx(ctx, c, s, tx, waitIntent, func(context.Context, pgx.Tx, once.Attempt) (string, error) { return "rolled back", nil }); err != nil {
		t.Fatal(err)
	}
	second := goDo(ctx, c, waitIntent, func(context.Context, once.Attempt) (string, error) { return "run by the duplicate", nil }, once.WaitFor(time.Hour))
	recv(t, waits, "the duplicate waiting for the transaction")
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	o := recv(t, second, "the duplicate returning after the rollback")
	if o.err != nil || o.res.Replayed || o.res.Value != "run by the duplicate" || o.res.Attempt != 1 {
		t.Fatalf("duplicate = %+v, %v; want it to claim the free key and run the effect", o.res, o.err)
	}
}

// The listening connection hangs on its LISTEN (the reply is lost and
// the connection stays open and silent, as in a half-open partition):
// the listener gives up on it and opens another, and waiters are woken
// by notifications again.
func TestWaitListenHangsReconnects(t *testing.T) {
	t.Parallel()
	_, schema := migrated(t)
	cfg, err := pgx.ParseConfig(testdb.RequirePostgres(t))
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.Start(fmt.Sprintf("%s:%d", cfg.Host, cfg.Port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	s, err := postgres.New(sharedPool(t), postgres.Config{Schema: schema,
		ListenURL: fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", cfg.User, p.Addr(), cfg.Database)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	postgres.SetPollInterval(s, time.Hour)
	postgres.SetListenTimings(s, 100*time.Millisecond, time.Second)
	postgres.SetListenCallWait(s, time.Second)
	hung := p.HangAfter([]byte("LISTEN"), faultproxy.PostgresReady)
	if err := s.Wait(context.Background(), once.WaitRequest{Key: "warm-up", Until: time.Now().Add(10 * time.Millisecond)}); err != nil {
		t.Fatal(err)
	}
	recv(t, hung, "the LISTEN's reply being lost")
	eventually(t, "the listener listening on another connection", func() bool { return postgres.ListenerReady(s) })
	c, waits := client(t, s)
	f := startFirst(t, c, waitIntent)
	second := goDo(context.Background(), c, waitIntent, mustNotRun(t), once.WaitFor(time.Hour))
	recv(t, waits, "the duplicate waiting")
	eventually(t, "the duplicate marking the row", func() bool { return marked(t, schema, keyOf(t, waitIntent)) })
	f.finish("after the hang")
	wantReplay(t, recv(t, second, "the duplicate woken"), "after the hang")
}

// A store that owns its pool (Open) closed while a duplicate waits: the
// pool is gone and no read can ever tell the waiter anything, so the
// wait ends, with an error that says the store was closed, instead of
// reading a closed pool until the wait runs out.
func TestWaitStoreClosedEndsWait(t *testing.T) {
	t.Parallel()
	d, schema := migrated(t)
	cfg, err := pgx.ParseConfig(testdb.RequirePostgres(t))
	if err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable&pool_max_conns=2", cfg.User, cfg.Host, cfg.Port, cfg.Database)
	s, err := postgres.Open(context.Background(), url, postgres.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	// Listening before the duplicate waits, so the listener's first
	// connect does not wake it into a claim that Close then cuts.
	listening(t, s)
	k, fp, _ := once.KeyOf(waitIntent)
	if _, err := d.Claim(context.Background(), once.ClaimRequest{Key: k, Fingerprint: fp, Run: waitIntent.Run, Kind: waitIntent.Kind, Target: waitIntent.Target, Lease: time.Hour}); err != nil {
		t.Fatal(err)
	}
	c, waits := client(t, s)
	second := goDo(context.Background(), c, waitIntent, mustNotRun(t), once.WaitFor(time.Hour))
	recv(t, waits, "the duplicate waiting")
	eventually(t, "the duplicate marking the row", func() bool { return marked(t, schema, k) })
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	o := recv(t, second, "the duplicate returning after its store was closed")
	if !errors.Is(o.err, once.ErrInFlight) || !strings.Contains(o.err.Error(), "closed") {
		t.Fatalf("duplicate = %+v, %v; want the *InFlightError, saying the store was closed", o.res, o.err)
	}
}

// A DoTx in a transaction that began before the claim it meets ran out
// (its worker died): PostgreSQL's now() is the transaction's start, so
// read by it the lease would look live for as long as the transaction
// lasts, and the DoTx would wait out its whole wait for a dead claim.
// It answers at once that the claim expired, as without waiting.
func TestDoTxWaitSeesLapsedLease(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	c, _ := client(t, s)
	tx, err := sharedPool(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	k, fp, _ := once.KeyOf(waitIntent)
	cr, err := s.Claim(ctx, once.ClaimRequest{Key: k, Fingerprint: fp, Run: waitIntent.Run, Kind: waitIntent.Kind, Target: waitIntent.Target, Lease: 300 * time.Millisecond})
	if err != nil || !cr.Claimed {
		t.Fatalf("claim: %+v %v", cr, err)
	}
	eventually(t, "the claim's lease running out", func() bool {
		var out bool
		if err := sharedPool(t).QueryRow(ctx, `SELECT clock_timestamp() > $1`, cr.Action.LeaseUntil).Scan(&out); err != nil {
			t.Fatal(err)
		}
		return out
	})
	done := make(chan error, 1)
	go func() {
		_, err := once.DoTx(ctx, c, s, tx, waitIntent, func(context.Context, pgx.Tx, once.Attempt) (string, error) {
			t.Error("DoTx ran the effect of a claim it cannot recover")
			return "", nil
		}, once.WaitFor(time.Hour))
		done <- err
	}()
	err = recv(t, done, "DoTx answering")
	var ife *once.InFlightError
	if !errors.As(err, &ife) || !ife.Expired {
		t.Fatalf("DoTx = %v; want an *InFlightError saying the lease expired", err)
	}
}

// A duplicate's claim waits on a DoTx's transaction, and its client
// gives up on it (ClaimTimeout) while the server goes on waiting: the
// cancel request pgx sends on giving up cannot get through (new
// connections are refused), so the claim is still pending when the
// read-back finds no row. The transaction rolls back and the pending
// claim commits, carrying the duplicate's token. The duplicate, still
// waiting, meets that claim: it is its own, and nobody else will run
// it, so it runs the effect, instead of waiting for its own claim's
// lease to run out (and recovery to put an effect that never ran up for
// review).
func TestWaitMeetsItsOwnLostClaim(t *testing.T) {
	t.Parallel()
	d, schema := migrated(t)
	ps, proxy := proxiedStore(t, schema)
	ctx := context.Background()
	if err := testdb.Warm(ctx, ps.Pool()); err != nil {
		t.Fatal(err)
	}
	direct, err := once.New(once.Config{Store: d})
	if err != nil {
		t.Fatal(err)
	}
	waits := make(chan once.Observation, 16)
	c, err := once.New(once.Config{Store: ps, ClaimTimeout: 2 * time.Second, Hooks: once.Hooks{OnEvent: func(_ context.Context, o once.Observation) {
		if o.Type == once.EventWaiting {
			waits <- o
		}
	}}})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := sharedPool(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := once.DoTx(ctx, direct, d, tx, waitIntent, func(context.Context, pgx.Tx, once.Attempt) (string, error) { return "rolled back", nil }); err != nil {
		t.Fatal(err)
	}
	proxy.Refuse(true)
	second := goDo(ctx, c, waitIntent, func(context.Context, once.Attempt) (string, error) { return "run by the duplicate", nil }, once.WaitFor(time.Hour))
	recv(t, waits, "the duplicate waiting for the transaction")
	proxy.Refuse(false)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the pending claim committing", func() bool {
		_, err := d.Get(ctx, keyOf(t, waitIntent))
		return err == nil
	})
	o := recv(t, second, "the duplicate returning")
	if o.err != nil || o.res.Replayed || o.res.Value != "run by the duplicate" || o.res.Attempt != 1 {
		t.Fatalf("duplicate = %+v, %v; want it to run the effect under the claim it made", o.res, o.err)
	}
}

// A DoTx made with WaitFor in a REPEATABLE READ (or SERIALIZABLE)
// transaction: its snapshot can never see the outcome it would wait
// for. It does not wait out its whole wait for nothing: it answers at
// once, saying why.
func TestDoTxWaitRepeatableRead(t *testing.T) {
	t.Parallel()
	s, _ := migrated(t)
	c, _ := client(t, s)
	f := startFirst(t, c, waitIntent)
	defer f.finish("done")
	ctx := context.Background()
	tx, err := sharedPool(t).BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := once.DoTx(ctx, c, s, tx, waitIntent, func(context.Context, pgx.Tx, once.Attempt) (string, error) {
			t.Error("DoTx ran the effect of a claim held by another attempt")
			return "", nil
		}, once.WaitFor(time.Hour))
		done <- err
	}()
	err = recv(t, done, "DoTx answering")
	var ife *once.InFlightError
	if !errors.As(err, &ife) || !strings.Contains(err.Error(), "READ COMMITTED") {
		t.Fatalf("DoTx = %v; want the *InFlightError, saying it can wait only in a READ COMMITTED transaction", err)
	}
}
