package storetest

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncehq/once"
)

// The Store contract, tested through the store's own methods.

func storeTests() []namedTest {
	return []namedTest{
		{name: "MigrateTwice", fn: testMigrateTwice},
		{name: "MigrateConcurrently", fn: testMigrateConcurrently},
		{name: "Migrations", fn: testMigrations},
		{name: "Claim", fn: testClaim},
		{name: "ClaimRace64Goroutines", fn: testClaimRace},
		{name: "ClaimRace4Processes", fn: testClaimRaceProcesses, needs: needProcesses},
		{name: "Fencing", fn: testFencing},
		{name: "LeaseByDatabaseClock", fn: testLeaseByDatabaseClock},
		{name: "Heartbeat", fn: testHeartbeat},
		{name: "HoldIsFenced", fn: testHoldIsFenced},
		{name: "TransitionFields", fn: testTransitionFields},
		{name: "RecoverableDue", fn: testRecoverableDue},
		{name: "RecoverableDisjoint", fn: testRecoverableDisjoint},
		{name: "RecoverableKindHolds", fn: testRecoverableKindHolds},
		{name: "RecoverableVerifiable", fn: testRecoverableVerifiable},
		{name: "TransitionWaiting", fn: testTransitionWaiting},
		{name: "Events", fn: testEvents},
		{name: "Stats", fn: testStats},
		{name: "Purge", fn: testStorePurge},
		{name: "GetNotFound", fn: testGetNotFound},
		{name: "List", fn: testList},
		{name: "ListPages", fn: testListPages},
		{name: "EventPage", fn: testEventPage},
		{name: "RejectedIsNotAnOutage", fn: testRejectedIsNotAnOutage},
		{name: "Wait", fn: testStoreWait},
	}
}

var inFlight = []once.Status{once.StatusInFlight}

// mustTransition applies tr and fails unless it matched.
func mustTransition(t *testing.T, s once.Store, tr once.Transition) {
	t.Helper()
	ok, err := s.Transition(ctx(t), tr)
	if err != nil || !ok {
		t.Fatalf("Transition(%s attempt %d %v -> %s) = %v, %v; want applied", tr.Key, tr.Attempt, tr.From, tr.To, ok, err)
	}
}

// settle moves an in-flight first attempt to status to, with an event,
// as the engine would record it.
func settle(t *testing.T, s once.Store, k once.Key, to once.Status) {
	t.Helper()
	if to == once.StatusInFlight {
		return
	}
	tr := once.Transition{Key: k, Attempt: 1, From: inFlight, To: to,
		Event: once.Event{Key: k, Type: once.EventType(to), From: once.StatusInFlight, Actor: once.ActorWorker}}
	switch to {
	case once.StatusSucceeded:
		tr.Result = jsonRaw(`"ok"`)
	case once.StatusUnknown:
		tr.Lease = time.Hour
		tr.Error = "EOF"
	default:
		tr.Error = "no"
	}
	mustTransition(t, s, tr)
}

// useSchema claims and settles two actions and reads their events back:
// the schema a migration left works.
func useSchema(t *testing.T, s once.Store) {
	t.Helper()
	first := mustClaim(t, s, claimReq(t, intent(0), time.Minute)).Action.Key
	settle(t, s, first, once.StatusSucceeded)
	second := mustClaim(t, s, claimReq(t, intent(1), time.Minute)).Action.Key
	settle(t, s, second, once.StatusReview)
	recent, err := s.RecentEvents(ctx(t), []once.EventType{once.EventReview, once.EventSucceeded}, 10)
	if err != nil || len(recent) != 2 || recent[0].Type != once.EventReview || recent[1].Type != once.EventSucceeded {
		t.Fatalf("RecentEvents = %+v, %v; want review then succeeded", recent, err)
	}
	if all, err := s.RecentEvents(ctx(t), nil, 10); err != nil || len(all) != 4 {
		t.Fatalf("RecentEvents(all) = %d events, %v; want 4", len(all), err)
	}
}

func latestVersion(t *testing.T, s once.Store) int {
	t.Helper()
	ms, err := s.Migrations()
	if err != nil || len(ms) == 0 {
		t.Fatalf("Migrations = %d, %v", len(ms), err)
	}
	return ms[len(ms)-1].Version
}

func testMigrateTwice(t *testing.T, h Harness) {
	s, _ := h.New(t)
	if v, err := s.Version(ctx(t)); err != nil || v != 0 {
		t.Fatalf("Version before Migrate = %d, %v; want 0", v, err)
	}
	for i := range 2 {
		if err := s.Migrate(ctx(t)); err != nil {
			t.Fatalf("Migrate #%d: %v", i+1, err)
		}
	}
	if v, err := s.Version(ctx(t)); err != nil || v != latestVersion(t, s) {
		t.Fatalf("Version after Migrate = %d, %v; want %d", v, err, latestVersion(t, s))
	}
	useSchema(t, s)
	if m, ok := s.(once.Migrator); ok {
		testMigrator(t, h, m)
	}
}

// testMigrator checks a once.Migrator on a fresh store: Versions is
// empty before the first migration and 1, 2, 3… after, and
// MigrateApplied runs every migration once, then none.
func testMigrator(t *testing.T, h Harness, migrated once.Migrator) {
	if vs, err := migrated.Versions(ctx(t)); err != nil || len(vs) != latestVersion(t, migrated.(once.Store)) {
		t.Fatalf("Versions of a migrated schema = %v, %v", vs, err)
	}
	if ran, err := migrated.MigrateApplied(ctx(t)); err != nil || len(ran) != 0 {
		t.Fatalf("MigrateApplied of a migrated schema = %d migrations, %v; want none", len(ran), err)
	}
	s, _ := h.New(t)
	m := s.(once.Migrator)
	if vs, err := m.Versions(ctx(t)); err != nil || len(vs) != 0 {
		t.Fatalf("Versions before Migrate = %v, %v; want none", vs, err)
	}
	ran, err := m.MigrateApplied(ctx(t))
	if err != nil || len(ran) != latestVersion(t, s) {
		t.Fatalf("MigrateApplied of a new schema = %d migrations, %v; want %d", len(ran), err, latestVersion(t, s))
	}
	vs, err := m.Versions(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range vs {
		if v != i+1 || ran[i].Version != v {
			t.Fatalf("Versions = %v after MigrateApplied ran %d migrations; want 1, 2, 3…", vs, len(ran))
		}
	}
}

func testMigrateConcurrently(t *testing.T, h Harness) {
	s, spec := h.New(t)
	const n = 4
	errs := make(chan error, n)
	for i := range n {
		go func() {
			st := s
			if i > 0 {
				// Separate connections, as separate processes would have.
				o, err := h.Open(ctx(t), spec)
				if err != nil {
					errs <- err
					return
				}
				defer closeStore(o)
				st = o
			}
			errs <- st.Migrate(ctx(t))
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Errorf("concurrent Migrate: %v", err)
		}
	}
	if v, err := s.Version(ctx(t)); err != nil || v != latestVersion(t, s) {
		t.Fatalf("Version after concurrent Migrate = %d, %v", v, err)
	}
	useSchema(t, s)
}

// Migrations renders the schema without touching the database: numbered
// from 1 without a gap, named, every template filled in.
func testMigrations(t *testing.T, h Harness) {
	s, _ := h.New(t)
	ms, err := s.Migrations()
	if err != nil || len(ms) == 0 {
		t.Fatalf("Migrations = %d, %v", len(ms), err)
	}
	for i, m := range ms {
		if m.Version != i+1 || m.Name == "" || strings.TrimSpace(m.SQL) == "" || strings.Contains(m.SQL, "{{") {
			t.Errorf("migration %d = %d %q (%d bytes of SQL, template left: %v)", i, m.Version, m.Name, len(m.SQL), strings.Contains(m.SQL, "{{"))
		}
	}
	if v, err := s.Version(ctx(t)); err != nil || v != 0 {
		t.Fatalf("Migrations touched the database: Version = %d, %v", v, err)
	}
	if err := s.Migrate(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if v, _ := s.Version(ctx(t)); v != ms[len(ms)-1].Version {
		t.Fatalf("Version after Migrate = %d, want the last migration's, %d", v, ms[len(ms)-1].Version)
	}
	again, err := s.Migrations()
	if err != nil || !slices.Equal(again, ms) {
		t.Fatal("Migrations differ from one call to the next")
	}
}

// A claim inserts an in-flight first attempt with the request's fields
// and a lease by the database's clock; a released action is claimed again
// only with its own fingerprint; a held or finished one is answered as it
// stands.
func testClaim(t *testing.T, h Harness) {
	s, _ := newStore(t, h)
	in := intent(1)
	req := claimReq(t, in, time.Minute)
	req.Payload = []byte(`{"n":1,"subject":"hello"}`)
	cr := mustClaim(t, s, req)
	a := cr.Action
	if a.Key != req.Key || a.Fingerprint != req.Fingerprint || a.Run != in.Run || a.Step != in.Step || a.Kind != in.Kind || a.Target != in.Target ||
		string(a.Payload) != string(req.Payload) || a.Status != once.StatusInFlight || a.Attempt != 1 || a.Result != nil || a.Error != "" {
		t.Fatalf("claimed %+v", a)
	}
	if cr.Now.IsZero() || a.CreatedAt.IsZero() || a.ClaimedAt.IsZero() || a.UpdatedAt.IsZero() || !a.CompletedAt.IsZero() {
		t.Fatalf("claimed %+v at %v: timestamps", a, cr.Now)
	}
	if a.LeaseUntil.Before(cr.Now.Add(req.Lease)) || a.LeaseUntil.After(cr.Now.Add(req.Lease+time.Second)) {
		t.Fatalf("lease until %v, want the database's now %v plus %v", a.LeaseUntil, cr.Now, req.Lease)
	}
	if g := mustGet(t, s, req.Key); g.Status != a.Status || !g.LeaseUntil.Equal(a.LeaseUntil) || string(g.Payload) != string(req.Payload) {
		t.Fatalf("Get = %+v, want the claimed row %+v", g, a)
	}
	evs, err := s.Events(ctx(t), req.Key)
	if err != nil || len(evs) != 1 || evs[0].Type != once.EventClaimed || evs[0].Attempt != 1 || evs[0].To != once.StatusInFlight || evs[0].From != "" || evs[0].Actor != once.ActorWorker {
		t.Fatalf("trail after a claim = %+v, %v", evs, err)
	}

	// A payload of nil stays nil; an empty one stays empty.
	for step, p := range map[int64][]byte{2: nil, 3: {}} {
		r := claimReq(t, intent(step), time.Minute)
		r.Payload = p
		mustClaim(t, s, r)
		if got := mustGet(t, s, r.Key).Payload; (got == nil) != (p == nil) || len(got) != 0 {
			t.Errorf("payload %#v stored as %#v", p, got)
		}
	}

	// Held: a duplicate gets the standing row.
	dup, err := s.Claim(ctx(t), req)
	if err != nil || dup.Claimed || dup.Action.Attempt != 1 || dup.Action.Status != once.StatusInFlight || dup.Now.IsZero() {
		t.Fatalf("duplicate claim = %+v, %v", dup, err)
	}
	// Released: another fingerprint is refused, the same one claims
	// attempt 2 with the last attempt's error cleared.
	mustTransition(t, s, once.Transition{Key: req.Key, Attempt: 1, From: inFlight, To: once.StatusReleased, Error: "429",
		Event: once.Event{Type: once.EventReleased, From: once.StatusInFlight, Actor: once.ActorWorker}})
	other := req
	other.Fingerprint = once.Fingerprint(strings.Repeat("0", 64))
	if cr, err := s.Claim(ctx(t), other); err != nil || cr.Claimed || cr.Action.Status != once.StatusReleased || cr.Action.Fingerprint != req.Fingerprint {
		t.Fatalf("claim of a released key with another fingerprint = %+v, %v; want refused", cr, err)
	}
	cr = mustClaim(t, s, req)
	if a := cr.Action; a.Attempt != 2 || a.Status != once.StatusInFlight || a.Error != "" || a.LeaseUntil.Before(cr.Now.Add(req.Lease)) {
		t.Fatalf("reclaim = %+v", a)
	}
	if got := trail(t, s, req.Key); got != "claimed,released,claimed" {
		t.Fatalf("trail %s", got)
	}
	evs, _ = s.Events(ctx(t), req.Key)
	if last := evs[len(evs)-1]; last.Attempt != 2 || last.From != once.StatusReleased || last.To != once.StatusInFlight {
		t.Fatalf("reclaim event %+v", last)
	}
	// Finished: answered as it stands, whatever the fingerprint.
	mustTransition(t, s, once.Transition{Key: req.Key, Attempt: 2, From: inFlight, To: once.StatusSucceeded, Result: jsonRaw(`"ok"`)})
	for _, r := range []once.ClaimRequest{req, other} {
		if cr, err := s.Claim(ctx(t), r); err != nil || cr.Claimed || cr.Action.Status != once.StatusSucceeded || string(cr.Action.Result) != `"ok"` {
			t.Fatalf("claim of a succeeded key = %+v, %v", cr, err)
		}
	}
}

func testClaimRace(t *testing.T, h Harness) {
	s, _ := newStore(t, h)
	req := claimReq(t, intent(1), time.Minute)
	const n = 64
	var wg sync.WaitGroup
	var won atomic.Int64
	start := make(chan struct{})
	for range n {
		wg.Go(func() {
			<-start
			cr, err := s.Claim(ctx(t), req)
			switch {
			case err != nil:
				t.Errorf("Claim: %v", err)
			case cr.Claimed:
				won.Add(1)
			case cr.Action.Attempt != 1 || cr.Action.Status != once.StatusInFlight || cr.Action.Fingerprint != req.Fingerprint:
				t.Errorf("a losing claim saw %+v, want the winner's in-flight attempt 1", cr.Action)
			}
		})
	}
	close(start)
	wg.Wait()
	if won.Load() != 1 {
		t.Fatalf("%d of %d goroutines won the claim, want 1", won.Load(), n)
	}
	if got := trail(t, s, req.Key); got != "claimed" {
		t.Fatalf("trail %s, want one claim", got)
	}
}

func testFencing(t *testing.T, h Harness) {
	s, _ := newStore(t, h)
	req := claimReq(t, intent(1), time.Hour)
	c1, err := s.Claim(ctx(t), req)
	if err != nil || !c1.Claimed || c1.Action.Attempt != 1 || c1.Action.Status != once.StatusInFlight {
		t.Fatalf("first claim = %+v, %v", c1, err)
	}
	if !c1.Action.LeaseUntil.After(c1.Now) {
		t.Fatalf("lease %v not after db now %v", c1.Action.LeaseUntil, c1.Now)
	}
	dup, err := s.Claim(ctx(t), req)
	if err != nil || dup.Claimed || dup.Action.Attempt != 1 {
		t.Fatalf("duplicate claim = %+v, %v; want refused", dup, err)
	}
	// Recovery releases attempt 1 (its worker is presumed dead) …
	ok, err := s.Transition(ctx(t), once.Transition{Key: req.Key, Attempt: 1, From: inFlight, To: once.StatusReleased, Error: "presumed dead"})
	if err != nil || !ok {
		t.Fatalf("release: %v, %v", ok, err)
	}
	// … and attempt 2 claims.
	c2, err := s.Claim(ctx(t), req)
	if err != nil || !c2.Claimed || c2.Action.Attempt != 2 || c2.Action.Error != "" {
		t.Fatalf("second claim = %+v, %v", c2, err)
	}
	// The presumed-dead attempt 1 comes back: every write it tries is refused.
	if _, held, err := s.Heartbeat(ctx(t), req.Key, 1, time.Hour); err != nil || held {
		t.Fatalf("stale heartbeat held=%v err=%v; want refused", held, err)
	}
	for _, to := range []once.Status{once.StatusSucceeded, once.StatusFailed, once.StatusUnknown, once.StatusReleased} {
		ok, err := s.Transition(ctx(t), once.Transition{Key: req.Key, Attempt: 1, From: []once.Status{once.StatusInFlight, once.StatusReview}, To: to, Result: []byte(`"stale"`)})
		if err != nil || ok {
			t.Fatalf("stale transition to %s = %v, %v; want refused", to, ok, err)
		}
	}
	if _, held, err := s.Heartbeat(ctx(t), req.Key, 2, time.Hour); err != nil || !held {
		t.Fatalf("current heartbeat held=%v err=%v", held, err)
	}
	ok, err = s.Transition(ctx(t), once.Transition{Key: req.Key, Attempt: 2, From: inFlight, To: once.StatusSucceeded, Result: []byte(`"fresh"`)})
	if err != nil || !ok {
		t.Fatalf("current transition = %v, %v", ok, err)
	}
	a := mustGet(t, s, req.Key)
	if a.Status != once.StatusSucceeded || a.Attempt != 2 || string(a.Result) != `"fresh"` {
		t.Fatalf("stored = %+v", a)
	}
	// A transition from a status the row is not in is refused too.
	if ok, _ := s.Transition(ctx(t), once.Transition{Key: req.Key, Attempt: 2, From: inFlight, To: once.StatusFailed}); ok {
		t.Fatal("transition from in_flight applied to a succeeded row")
	}
	// And one on a key that does not exist matches nothing.
	if ok, err := s.Transition(ctx(t), once.Transition{Key: keyOf(t, intent(9)), Attempt: 1, From: inFlight, To: once.StatusFailed}); err != nil || ok {
		t.Fatalf("transition of a missing key = %v, %v", ok, err)
	}
}

func testLeaseByDatabaseClock(t *testing.T, h Harness) {
	s, _ := newStore(t, h)
	long := claimReq(t, intent(1), time.Hour)
	mustClaim(t, s, long)
	if got, _, err := s.Recoverable(ctx(t), once.RecoverRequest{Key: long.Key, Limit: 10, Hold: time.Minute, Token: "t1"}); err != nil || len(got) != 0 {
		t.Fatalf("Recoverable on a held lease = %d, %v; want none", len(got), err)
	}

	// A lapsed lease, extended again by a heartbeat, is not due.
	short := claimReq(t, intent(2), time.Millisecond)
	mustClaim(t, s, short)
	time.Sleep(50 * time.Millisecond)
	until, held, err := s.Heartbeat(ctx(t), short.Key, 1, time.Hour)
	if err != nil || !held {
		t.Fatalf("heartbeat: %v %v", held, err)
	}
	if a := mustGet(t, s, short.Key); !a.LeaseUntil.Equal(until) {
		t.Fatalf("stored lease %v, heartbeat said %v", a.LeaseUntil, until)
	}
	if got, _, err := s.Recoverable(ctx(t), once.RecoverRequest{Key: short.Key, Limit: 10, Hold: time.Minute, Token: "t2"}); err != nil || len(got) != 0 {
		t.Fatalf("Recoverable after a heartbeat = %d, %v; want none", len(got), err)
	}

	// A lapsed lease is due, by the database's clock, and once taken it
	// is held for the taker alone.
	lapsed := claimReq(t, intent(3), time.Millisecond)
	mustClaim(t, s, lapsed)
	time.Sleep(50 * time.Millisecond)
	got, now, err := s.Recoverable(ctx(t), once.RecoverRequest{Key: lapsed.Key, Limit: 10, Hold: time.Hour, Token: "t3"})
	if err != nil || len(got) != 1 || got[0].Key != lapsed.Key || !got[0].LeaseUntil.After(now.Add(59*time.Minute)) {
		t.Fatalf("Recoverable on a lapsed lease = %+v, %v; want it, held for an hour", got, err)
	}
	if again, _, err := s.Recoverable(ctx(t), once.RecoverRequest{Limit: 10, Hold: time.Hour, Token: "t4"}); err != nil || len(again) != 0 {
		t.Fatalf("second Recoverable = %d, %v; a held action was handed out twice", len(again), err)
	}
}

// A heartbeat sets the lease of the attempt that holds the claim to the
// database's now plus the lease, and of no other.
func testHeartbeat(t *testing.T, h Harness) {
	s, _ := newStore(t, h)
	req := claimReq(t, intent(1), time.Minute)
	cr := mustClaim(t, s, req)
	until, held, err := s.Heartbeat(ctx(t), req.Key, 1, time.Hour)
	if err != nil || !held || until.Before(cr.Action.LeaseUntil.Add(58*time.Minute)) {
		t.Fatalf("Heartbeat = %v, %v, %v; want the lease an hour out (it was %v)", until, held, err, cr.Action.LeaseUntil)
	}
	if a := mustGet(t, s, req.Key); !a.LeaseUntil.Equal(until) {
		t.Fatalf("stored lease %v, heartbeat said %v", a.LeaseUntil, until)
	}
	shorter, held, err := s.Heartbeat(ctx(t), req.Key, 1, time.Minute)
	if err != nil || !held || !shorter.Before(until) {
		t.Fatalf("Heartbeat with a shorter lease = %v, %v, %v; want it set to now plus the lease, before %v", shorter, held, err, until)
	}
	for _, c := range []struct {
		name    string
		key     once.Key
		attempt int
	}{{"another attempt", req.Key, 2}, {"a missing key", keyOf(t, intent(9)), 1}} {
		if _, held, err := s.Heartbeat(ctx(t), c.key, c.attempt, time.Hour); err != nil || held {
			t.Errorf("Heartbeat of %s = %v, %v; want not held", c.name, held, err)
		}
	}
	settle(t, s, req.Key, once.StatusSucceeded)
	if _, held, err := s.Heartbeat(ctx(t), req.Key, 1, time.Hour); err != nil || held {
		t.Fatalf("Heartbeat of a succeeded action = %v, %v; want not held", held, err)
	}
	if a := mustGet(t, s, req.Key); !a.LeaseUntil.IsZero() {
		t.Fatalf("a refused heartbeat set the lease of a finished action: %v", a.LeaseUntil)
	}
}

// A recoverer's decision applies only while its hold is its own: a
// worker whose heartbeat came back takes the claim back, a second
// recoverer after the hold ran out replaces it, and an applied
// transition ends it.
func testHoldIsFenced(t *testing.T, h Harness) {
	s, _ := newStore(t, h)
	lapse := func(step int64) once.Key {
		req := claimReq(t, intent(step), time.Millisecond)
		mustClaim(t, s, req)
		time.Sleep(30 * time.Millisecond)
		return req.Key
	}
	take := func(k once.Key, hold time.Duration, token string) {
		t.Helper()
		got, _, err := s.Recoverable(ctx(t), once.RecoverRequest{Key: k, Limit: 1, Hold: hold, Token: token})
		if err != nil || len(got) != 1 {
			t.Fatalf("Recoverable(%s) = %d, %v", token, len(got), err)
		}
	}
	decide := func(k once.Key, from once.Status, to once.Status, hold string) bool {
		t.Helper()
		ok, err := s.Transition(ctx(t), once.Transition{Key: k, Attempt: 1, From: []once.Status{from}, To: to, Result: jsonRaw(`1`), Hold: hold})
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}

	k := lapse(1)
	take(k, time.Hour, "hold-1")
	// The worker was only cut off; its heartbeat gets through again.
	if _, held, err := s.Heartbeat(ctx(t), k, 1, time.Hour); err != nil || !held {
		t.Fatalf("heartbeat: %v %v", held, err)
	}
	if decide(k, once.StatusInFlight, once.StatusReview, "hold-1") {
		t.Fatal("a decision on a hold that is no longer ours applied")
	}
	if !decide(k, once.StatusInFlight, once.StatusSucceeded, "") {
		t.Fatal("the worker's own completion was refused")
	}

	// Only the token that took the hold decides.
	k = lapse(2)
	take(k, time.Hour, "hold-2")
	if decide(k, once.StatusInFlight, once.StatusReview, "someone-else") {
		t.Fatal("a decision with another token applied")
	}
	if !decide(k, once.StatusInFlight, once.StatusReview, "hold-2") {
		t.Fatal("the holder's decision was refused")
	}

	// A hold that ran out is taken by the next recoverer, whose token
	// replaces the first one's; an applied decision ends the hold.
	k = lapse(3)
	take(k, time.Millisecond, "hold-3a")
	time.Sleep(30 * time.Millisecond)
	take(k, time.Hour, "hold-3b")
	if decide(k, once.StatusInFlight, once.StatusReview, "hold-3a") {
		t.Fatal("the first recoverer decided after its hold ran out and another took it")
	}
	if !decide(k, once.StatusInFlight, once.StatusReview, "hold-3b") {
		t.Fatal("the second recoverer's decision was refused")
	}
	if decide(k, once.StatusReview, once.StatusFailed, "hold-3b") {
		t.Fatal("a hold decided twice: an applied transition must clear its token")
	}
}

// Every field a Transition carries lands in the row, and its event lands
// in the trail at the row's attempt and status after it.
func testTransitionFields(t *testing.T, h Harness) {
	s, _ := newStore(t, h)
	req := claimReq(t, intent(1), time.Minute)
	cr := mustClaim(t, s, req)
	k := req.Key
	apply := func(tr once.Transition) once.Action {
		t.Helper()
		tr.Key = k
		mustTransition(t, s, tr)
		return mustGet(t, s, k)
	}

	a := apply(once.Transition{Attempt: 1, From: inFlight, To: once.StatusUnknown, Error: "EOF", Lease: time.Hour, VerifyFailures: 2,
		Event: once.Event{Type: once.EventUnknown, From: once.StatusInFlight, Actor: once.ActorWorker, Note: "outcome unknown: EOF"}})
	if a.Status != once.StatusUnknown || a.Attempt != 1 || a.Error != "EOF" || a.VerifyFailures != 2 || a.LeaseUntil.Before(cr.Now.Add(59*time.Minute)) || !a.CompletedAt.IsZero() {
		t.Fatalf("after unknown with a lease: %+v", a)
	}

	a = apply(once.Transition{Attempt: 1, From: []once.Status{once.StatusUnknown}, To: once.StatusInFlight, NewAttempt: true, Lease: time.Minute,
		Event: once.Event{Type: once.EventTakenOver, From: once.StatusUnknown, Actor: once.ActorReaper}})
	if a.Attempt != 2 || a.Status != once.StatusInFlight || a.Error != "" || a.VerifyFailures != 0 || a.LeaseUntil.IsZero() || a.ClaimedAt.Before(cr.Action.ClaimedAt) {
		t.Fatalf("after a takeover: %+v", a)
	}
	if ok, err := s.Transition(ctx(t), once.Transition{Key: k, Attempt: 1, From: inFlight, To: once.StatusFailed}); err != nil || ok {
		t.Fatalf("the attempt that was taken over still matches: %v, %v", ok, err)
	}

	a = apply(once.Transition{Attempt: 2, From: inFlight, To: once.StatusReview, Error: "lease expired",
		Event: once.Event{Type: once.EventReview, From: once.StatusInFlight, Actor: once.ActorReaper, Note: "lease expired"}})
	if a.Status != once.StatusReview || !a.LeaseUntil.IsZero() || a.Error != "lease expired" || !a.ResolvedAt.IsZero() {
		t.Fatalf("after review without a lease: %+v", a)
	}

	a = apply(once.Transition{Attempt: 2, From: []once.Status{once.StatusReview}, To: once.StatusSucceeded, Result: jsonRaw(`{"id": "m-1"}`),
		ResolvedBy: "ada", ResolveNote: "found it in the log",
		Event: once.Event{Type: once.EventResolved, From: once.StatusReview, Actor: "ada", Note: "done: found it in the log"}})
	if a.Status != once.StatusSucceeded || !jsonEqual(a.Result, []byte(`{"id":"m-1"}`)) || a.Error != "" || a.CompletedAt.IsZero() ||
		a.ResolvedBy != "ada" || a.ResolveNote != "found it in the log" || a.ResolvedAt.IsZero() {
		t.Fatalf("after a resolution: %+v", a)
	}

	// Without an event type nothing joins the trail; without ResolvedBy
	// the resolution stays as it was.
	a = apply(once.Transition{Attempt: 2, From: []once.Status{once.StatusSucceeded}, To: once.StatusFailed, Error: "abandoned"})
	if a.Status != once.StatusFailed || a.Result != nil || a.Error != "abandoned" || a.CompletedAt.IsZero() || a.ResolvedBy != "ada" {
		t.Fatalf("after a transition without an event: %+v", a)
	}

	evs, err := s.Events(ctx(t), k)
	if err != nil {
		t.Fatal(err)
	}
	want := []once.Event{
		{Type: once.EventClaimed, Attempt: 1, To: once.StatusInFlight, Actor: once.ActorWorker},
		{Type: once.EventUnknown, Attempt: 1, From: once.StatusInFlight, To: once.StatusUnknown, Actor: once.ActorWorker, Note: "outcome unknown: EOF"},
		{Type: once.EventTakenOver, Attempt: 2, From: once.StatusUnknown, To: once.StatusInFlight, Actor: once.ActorReaper},
		{Type: once.EventReview, Attempt: 2, From: once.StatusInFlight, To: once.StatusReview, Actor: once.ActorReaper, Note: "lease expired"},
		{Type: once.EventResolved, Attempt: 2, From: once.StatusReview, To: once.StatusSucceeded, Actor: "ada", Note: "done: found it in the log"},
	}
	if len(evs) != len(want) {
		t.Fatalf("trail %s, want %d events", trail(t, s, k), len(want))
	}
	for i, e := range evs {
		w := want[i]
		if e.Type != w.Type || e.Attempt != w.Attempt || e.From != w.From || e.To != w.To || e.Actor != w.Actor || e.Note != w.Note || e.Key != k {
			t.Errorf("event %d = %+v, want %+v", i, e, w)
		}
		if i > 0 && (e.ID <= evs[i-1].ID || e.At.Before(evs[i-1].At)) {
			t.Errorf("event %d (id %d at %v) out of order after id %d at %v", i, e.ID, e.At, evs[i-1].ID, evs[i-1].At)
		}
	}
}

// Recoverable hands out what is due, by the database's clock, the
// longest overdue first: lapsed claims and unknown outcomes whose next
// try has come. Nothing else.
func testRecoverableDue(t *testing.T, h Harness) {
	s, _ := newStore(t, h)
	mk := func(step int64, lease time.Duration) once.Key {
		return mustClaim(t, s, claimReq(t, intent(step), lease)).Action.Key
	}
	if _, _, err := s.Recoverable(ctx(t), once.RecoverRequest{Limit: 10, Hold: time.Hour}); err == nil {
		t.Fatal("Recoverable without a hold token accepted")
	}
	held := mk(0, time.Hour)
	oldest := mk(1, time.Millisecond)
	time.Sleep(20 * time.Millisecond)
	lapsed := mk(2, time.Millisecond)
	time.Sleep(20 * time.Millisecond)
	unknownDue := mk(3, time.Hour)
	mustTransition(t, s, once.Transition{Key: unknownDue, Attempt: 1, From: inFlight, To: once.StatusUnknown, Error: "EOF", Lease: time.Millisecond})
	unknownLater := mk(4, time.Hour)
	settle(t, s, unknownLater, once.StatusUnknown) // due in an hour
	var finished []once.Key
	for i, st := range []once.Status{once.StatusReview, once.StatusSucceeded, once.StatusFailed, once.StatusReleased} {
		k := mk(int64(5+i), time.Millisecond)
		settle(t, s, k, st)
		finished = append(finished, k)
	}
	time.Sleep(50 * time.Millisecond)

	take := func(req once.RecoverRequest) []once.Action {
		t.Helper()
		got, now, err := s.Recoverable(ctx(t), req)
		if err != nil || now.IsZero() {
			t.Fatalf("Recoverable(%+v) = %d, %v, %v", req, len(got), now, err)
		}
		for _, a := range got {
			if !a.LeaseUntil.After(now.Add(req.Hold - time.Second)) {
				t.Errorf("%s handed out with lease %v, not held for %v past %v", a.Key, a.LeaseUntil, req.Hold, now)
			}
		}
		return got
	}
	keys := func(as []once.Action) []once.Key {
		var ks []once.Key
		for _, a := range as {
			ks = append(ks, a.Key)
		}
		slices.Sort(ks)
		return ks
	}
	if got := take(once.RecoverRequest{Key: lapsed, Limit: 10, Hold: time.Hour, Token: "a"}); !slices.Equal(keys(got), []once.Key{lapsed}) {
		t.Fatalf("Recoverable by key = %v, want only %s", keys(got), lapsed)
	}
	if got := take(once.RecoverRequest{Limit: 1, Hold: time.Hour, Token: "b"}); !slices.Equal(keys(got), []once.Key{oldest}) || got[0].Status != once.StatusInFlight {
		t.Fatalf("Recoverable with limit 1 = %v, want the longest overdue, %s", keys(got), oldest)
	}
	if got := take(once.RecoverRequest{Limit: 10, Hold: time.Hour, Token: "c"}); !slices.Equal(keys(got), []once.Key{unknownDue}) || got[0].Status != once.StatusUnknown || got[0].Error != "EOF" {
		t.Fatalf("Recoverable = %+v, want the unknown outcome that is due", got)
	}
	if got := take(once.RecoverRequest{Limit: 10, Hold: time.Hour, Token: "d"}); len(got) != 0 {
		t.Fatalf("Recoverable handed out %v: held, not yet due or finished", keys(got))
	}
	for _, k := range append([]once.Key{held, unknownLater}, finished...) {
		if a := mustGet(t, s, k); a.Attempt != 1 || (a.Status == once.StatusInFlight) != (k == held) {
			t.Errorf("%s changed: %+v", k, a)
		}
	}
}

// Callers racing for due actions share them out: each is handed out to
// exactly one.
func testRecoverableDisjoint(t *testing.T, h Harness) {
	s, _ := newStore(t, h)
	const n = 40
	for i := range n {
		mustClaim(t, s, claimReq(t, intent(int64(i)), time.Millisecond))
	}
	time.Sleep(30 * time.Millisecond)
	var mu sync.Mutex
	seen := map[once.Key]int{}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				got, _, err := s.Recoverable(ctx(t), once.RecoverRequest{Limit: 3, Hold: time.Hour, Token: fmt.Sprintf("g%d-%d", g, i)})
				if err != nil {
					t.Error(err)
					return
				}
				if len(got) == 0 {
					return
				}
				mu.Lock()
				for _, a := range got {
					seen[a.Key]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(seen) != n {
		t.Fatalf("%d actions handed out, want %d", len(seen), n)
	}
	for k, c := range seen {
		if c != 1 {
			t.Errorf("%s handed out %d times", k, c)
		}
	}
}

// The trail: claims and applied transitions write their events, refused
// ones do not, AppendEvent adds one as given; Events reads one action's
// oldest first, RecentEvents everyone's newest first.
func testEvents(t *testing.T, h Harness) {
	s, _ := newStore(t, h)
	a := mustClaim(t, s, claimReq(t, intent(1), time.Minute)).Action.Key
	b := mustClaim(t, s, claimReq(t, intent(2), time.Minute)).Action.Key
	late := once.Event{Key: a, Type: once.EventRefused, Attempt: 1, From: once.StatusInFlight, To: once.StatusSucceeded, Actor: once.ActorWorker, Note: "late outcome of attempt 1 refused"}
	if err := s.AppendEvent(ctx(t), late); err != nil {
		t.Fatal(err)
	}
	if ok, _ := s.Transition(ctx(t), once.Transition{Key: a, Attempt: 7, From: inFlight, To: once.StatusFailed, Event: once.Event{Type: once.EventFailed}}); ok {
		t.Fatal("a transition of another attempt applied")
	}
	settle(t, s, a, once.StatusSucceeded)

	evs, err := s.Events(ctx(t), a)
	if err != nil || len(evs) != 3 {
		t.Fatalf("Events = %+v, %v; want claimed, refused, succeeded", evs, err)
	}
	if got := trail(t, s, a); got != "claimed,refused,succeeded" {
		t.Fatalf("trail %s", got)
	}
	if e := evs[1]; e.Attempt != late.Attempt || e.From != late.From || e.To != late.To || e.Actor != late.Actor || e.Note != late.Note || e.ID == 0 {
		t.Fatalf("appended event read back as %+v, want %+v", e, late)
	}
	if got := trail(t, s, b); got != "claimed" {
		t.Fatalf("trail of another action %s", got)
	}
	if evs, err := s.Events(ctx(t), keyOf(t, intent(9))); err != nil || len(evs) != 0 {
		t.Fatalf("Events of a missing key = %d, %v", len(evs), err)
	}

	recent := func(types []once.EventType, limit int) string {
		t.Helper()
		evs, err := s.RecentEvents(ctx(t), types, limit)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range evs {
			who := "a"
			if e.Key == b {
				who = "b"
			}
			out = append(out, string(e.Type)+":"+who)
		}
		return strings.Join(out, ",")
	}
	for _, c := range []struct {
		types []once.EventType
		limit int
		want  string
	}{
		{nil, 10, "succeeded:a,refused:a,claimed:b,claimed:a"},
		{nil, 2, "succeeded:a,refused:a"},
		{[]once.EventType{once.EventClaimed}, 10, "claimed:b,claimed:a"},
		{[]once.EventType{once.EventRefused, once.EventSucceeded}, 10, "succeeded:a,refused:a"},
		{[]once.EventType{once.EventReview}, 10, ""},
	} {
		if got := recent(c.types, c.limit); got != c.want {
			t.Errorf("RecentEvents(%v, %d) = %s, want %s", c.types, c.limit, got, c.want)
		}
	}
}

func testStats(t *testing.T, h Harness) {
	s, _ := newStore(t, h)
	if stats, err := s.Stats(ctx(t)); err != nil || len(stats) != 0 {
		t.Fatalf("Stats of an empty store = %v, %v", stats, err)
	}
	for i, c := range []struct {
		kind string
		to   once.Status
	}{{"a", once.StatusInFlight}, {"a", once.StatusInFlight}, {"a", once.StatusSucceeded}, {"b", once.StatusReview}} {
		req := claimReq(t, once.Intent{Run: "s", Step: int64(i), Kind: c.kind}, time.Minute)
		mustClaim(t, s, req)
		settle(t, s, req.Key, c.to)
	}
	stats, err := s.Stats(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, st := range stats {
		got[st.Kind+"/"+string(st.Status)] += st.Count
	}
	if len(stats) != 3 || got["a/in_flight"] != 2 || got["a/succeeded"] != 1 || got["b/review"] != 1 {
		t.Fatalf("Stats = %+v", stats)
	}
}

// Purge deletes finished actions past their own deadline (set from the
// retention recorded at the claim), or past an age when asked, a batch
// at a time, with their events; it never touches open or released ones.
func testStorePurge(t *testing.T, h Harness) {
	s, _ := newStore(t, h)
	all := []once.Status{once.StatusSucceeded, once.StatusFailed, once.StatusReleased, once.StatusInFlight, once.StatusUnknown, once.StatusReview}
	retention := map[string]time.Duration{"a": time.Millisecond, "b": time.Hour}
	byKind := map[string]map[once.Status]once.Key{}
	for _, kind := range []string{"a", "b"} {
		byKind[kind] = map[once.Status]once.Key{}
		for i, st := range all {
			req := claimReq(t, once.Intent{Run: "p", Step: int64(i), Kind: kind}, time.Hour)
			req.Retention = retention[kind]
			mustClaim(t, s, req)
			settle(t, s, req.Key, st)
			byKind[kind][st] = req.Key
		}
	}
	for kind, keys := range byKind {
		a := mustGet(t, s, keys[once.StatusSucceeded])
		if a.Retention != retention[kind] || a.RetainUntil.Sub(a.CompletedAt) != retention[kind] {
			t.Errorf("%s: retention %v, deadline %v after completion; want %v", kind, a.Retention, a.RetainUntil.Sub(a.CompletedAt), retention[kind])
		}
		if open := mustGet(t, s, keys[once.StatusReview]); !open.RetainUntil.IsZero() {
			t.Errorf("%s: an open action has a purge deadline %v", kind, open.RetainUntil)
		}
	}
	time.Sleep(20 * time.Millisecond)
	purge := func(req once.PurgeRequest) int {
		t.Helper()
		n, err := s.Purge(ctx(t), req)
		if err != nil {
			t.Fatalf("Purge(%+v): %v", req, err)
		}
		return n
	}
	ms := time.Millisecond
	for _, c := range []struct {
		req  once.PurgeRequest
		want int
	}{
		{once.PurgeRequest{Limit: 100, DryRun: true}, 2},
		{once.PurgeRequest{OlderThan: time.Hour, Limit: 100, DryRun: true}, 0},
		{once.PurgeRequest{OlderThan: ms, Limit: 100, DryRun: true}, 4},
	} {
		if got := purge(c.req); got != c.want {
			t.Errorf("Purge(%+v) = %d, want %d", c.req, got, c.want)
		}
	}
	if n, err := s.Stats(ctx(t)); err != nil || len(n) != 12 {
		t.Fatalf("a dry run deleted something: %d cells, %v", len(n), err)
	}
	// By deadline, a batch at a time: kind a's two.
	for i, want := range []int{1, 1, 0} {
		if got := purge(once.PurgeRequest{Limit: 1}); got != want {
			t.Fatalf("batch %d purged %d, want %d", i, got, want)
		}
	}
	if got := purge(once.PurgeRequest{OlderThan: ms, Limit: 10}); got != 2 {
		t.Fatalf("purge older than 1ms = %d, want kind b's two", got)
	}
	for kind, keys := range byKind {
		for st, k := range keys {
			_, err := s.Get(ctx(t), k)
			evs, eerr := s.Events(ctx(t), k)
			if eerr != nil {
				t.Fatal(eerr)
			}
			switch st {
			case once.StatusSucceeded, once.StatusFailed:
				if !isNotFound(err) || len(evs) != 0 {
					t.Errorf("%s/%s survived the purge (Get %v, %d events)", kind, st, err, len(evs))
				}
			default:
				want := 2 // claimed, and the transition to st
				if st == once.StatusInFlight {
					want = 1
				}
				if err != nil || len(evs) != want {
					t.Errorf("purge touched an open %s/%s: Get %v, %d events", kind, st, err, len(evs))
				}
			}
		}
	}
}

func testGetNotFound(t *testing.T, h Harness) {
	s, _ := newStore(t, h)
	_, err := s.Get(ctx(t), keyOf(t, intent(9)))
	if !isNotFound(err) {
		t.Fatalf("Get of a missing key = %v, want ErrNotFound", err)
	}
}

func testList(t *testing.T, h Harness) {
	s, _ := newStore(t, h)
	for i := range 5 {
		in := intent(int64(i))
		if i%2 == 1 {
			in.Kind = "post_message"
			in.Run = "run-2"
		}
		req := claimReq(t, in, time.Minute)
		mustClaim(t, s, req)
		if i == 4 {
			settle(t, s, req.Key, once.StatusFailed)
		} else {
			settle(t, s, req.Key, once.StatusSucceeded)
		}
	}
	check := func(f once.Filter, want int) {
		t.Helper()
		rows, err := s.List(ctx(t), f)
		if err != nil || len(rows) != want {
			t.Errorf("List(%+v) = %d rows, %v; want %d", f, len(rows), err, want)
		}
	}
	check(once.Filter{}, 5)
	check(once.Filter{Status: once.StatusSucceeded}, 4)
	check(once.Filter{Status: once.StatusFailed}, 1)
	check(once.Filter{Status: once.StatusInFlight}, 0)
	check(once.Filter{Kind: "post_message"}, 2)
	check(once.Filter{Run: "run-2"}, 2)
	check(once.Filter{Run: "run-1", Kind: "send_email", Status: once.StatusSucceeded}, 2)
	check(once.Filter{Limit: 2}, 2)
	check(once.Filter{Since: time.Now().Add(time.Hour)}, 0)
	check(once.Filter{Since: time.Now().Add(-time.Hour)}, 5)
	check(once.Filter{KeyPrefix: string(keyOf(t, intent(2)))[:10]}, 1)
	check(once.Filter{KeyPrefix: string(keyOf(t, intent(2)))}, 1)
	check(once.Filter{KeyPrefix: "g"}, 0)
	rows, _ := s.List(ctx(t), once.Filter{})
	for i := 1; i < len(rows); i++ {
		if rows[i].UpdatedAt.After(rows[i-1].UpdatedAt) {
			t.Fatalf("List not newest first: %v after %v", rows[i].UpdatedAt, rows[i-1].UpdatedAt)
		}
	}
}
