package protocol_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/faultproxy"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/postgres"
)

// Partial failures of /v1, each against a real HTTP server over each
// store: the client that leaves, the write that fails once, the reply
// that is lost.

// TestWaitingClaimWhoseClientLeftClaimsNothing: a claim that waits for
// another attempt stops waiting when its client goes away. Were it to
// wait on, it would claim the action once the other attempt released
// it, for nobody: the claim would sit in flight until its lease lapsed,
// and recovery would then take an effect that never ran for one that
// may have.
func TestWaitingClaimWhoseClientLeftClaimsNothing(t *testing.T) {
	for name, open := range stores(t) {
		t.Run(name, func(t *testing.T) {
			s := newServer(t, open(t), once.Config{Default: once.KindPolicy{Lease: 5 * time.Second}})
			in := once.Intent{Run: "run-1", Step: 1, Kind: "send_email", Target: "ada@example.com", Payload: json.RawMessage(`{"subject":"hello"}`)}
			held, err := s.c.Claim(context.Background(), in)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := json.Marshal(map[string]any{"intent": wireIntent(1, map[string]any{"subject": "hello"}), "write": write(), "wait_ms": 20000})
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "POST", s.url+"/v1/claim", bytes.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+workerToken)
			req.Header.Set("Content-Type", "application/json")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
				t.Fatalf("the waiting claim answered %d before the other attempt moved; want it still waiting when its client left", resp.StatusCode)
			} else if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatal(err)
			}
			// The client has gone; the other attempt gives the action
			// back.
			if err := held.Release(context.Background(), errors.New("busy")); err != nil {
				t.Fatal(err)
			}
			time.Sleep(1500 * time.Millisecond) // well past a waiter's wake-up
			got, err := s.c.Get(context.Background(), held.Key)
			if err != nil {
				t.Fatal(err)
			}
			if got.Status != once.StatusReleased || got.Attempt != held.Number {
				t.Fatalf("the action is %s at attempt %d after the waiting claim's client left; want it released at %d, claimed by nobody", got.Status, got.Attempt, held.Number)
			}
		})
	}
}

// cutServer is /v1 over a PostgreSQL store reached through a fault
// proxy, which the test cuts.
func cutServer(t *testing.T, cfg once.Config) (*server, *faultproxy.Proxy) {
	t.Helper()
	s, p := cutStore(t)
	return newServer(t, s, cfg), p
}

// cutStore is a PostgreSQL store of a new schema reached through a
// fault proxy, and the proxy.
func cutStore(t *testing.T) (*postgres.Store, *faultproxy.Proxy) {
	t.Helper()
	cc, err := pgx.ParseConfig(testdb.RequirePostgres(t))
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.Start(fmt.Sprintf("%s:%d", cc.Host, cc.Port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	var b [6]byte
	rand.Read(b[:])
	schema := "once_protocol_" + hex.EncodeToString(b[:])
	// Every statement sends its text, so that a marker is seen on every
	// execution.
	url := fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable&pool_max_conns=4&default_query_exec_mode=exec", cc.User, p.Addr(), cc.Database)
	ctx := context.Background()
	s, err := testdb.RetryTooManyClients(ctx, func() (*postgres.Store, error) {
		return postgres.Open(ctx, url, postgres.Config{Schema: schema})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		if c, err := pgx.Connect(ctx, testdb.PostgresURL()); err == nil {
			c.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
			c.Close(ctx)
		}
	})
	return s, p
}

// lost waits for nothing: it reports whether the proxy's armed cut (or
// hang) has happened. When the request came back with anything but 200
// and the cut had not happened, the proxy met the marked request but
// not the end of its reply within one read (a reply split across reads
// is dropped until its end is seen): the link hangs, and is reset here
// as a pool would close it in time. A 200 with no cut means the marker
// no longer matches its statement, and fails the test.
func lost(t *testing.T, p *faultproxy.Proxy, done <-chan struct{}, what string, code int, v map[string]any) {
	t.Helper()
	select {
	case <-done:
		return
	default:
	}
	if code == 200 {
		t.Fatalf("%s went through (%d %v): the marker no longer matches its statement", what, code, v)
	}
	p.Reset()
}

// cut makes the database unreachable through p until the returned func
// is called: open connections are reset, new ones refused.
func cut(p *faultproxy.Proxy) (mend func()) {
	p.Refuse(true)
	p.Reset()
	return func() { p.Refuse(false) }
}

// TestStoreOutOfReachIsSentAgain: a heartbeat or an outcome that the
// database did not answer is 503, to be sent again, not "fenced" (the
// client would stop an effect whose claim still holds) nor a 500 (which
// clients do not send again); its detail does not name the database's
// address. At the server that holds the attempt the outcome's write was
// tried, for the client's RecordTimeout: not_recorded. At another,
// whose read to rebuild the attempt was not answered: store_unavailable.
// Sent again once the database is back, each applies.
func TestStoreOutOfReachIsSentAgain(t *testing.T) {
	store, p := cutStore(t)
	cfg := once.Config{Default: once.KindPolicy{Lease: 30 * time.Second}, RecordTimeout: 2 * time.Second}
	s, other := newServer(t, store, cfg), newServer(t, store, cfg)
	in := wireIntent(1, map[string]any{"subject": "hello"})
	code, a := s.post("/v1/claim", claimBody(in))
	want(t, "claim", code, a, 200, "answer", "claimed")
	code, b := s.post("/v1/claim", claimBody(wireIntent(2, nil)))
	want(t, "claim", code, b, 200, "answer", "claimed")

	unavailable := func(what string, code int, v map[string]any, problem string) {
		t.Helper()
		want(t, what+" with the database out of reach", code, v, 503, "code", problem)
		if v["retry_after_ms"] == nil || v["retry_after_ms"].(float64) <= 0 {
			t.Fatalf("%s: no retry_after_ms in %v", what, v)
		}
		if d, _ := v["detail"].(string); strings.Contains(d, "127.0.0.1") || strings.Contains(d, p.Addr()) {
			t.Fatalf("%s: the detail names the database's address: %q", what, d)
		}
	}
	mend := cut(p)
	code, v := s.post("/v1/heartbeat", ref(a))
	unavailable("heartbeat", code, v, "store_unavailable")
	settle := outcome(a, "succeeded", map[string]any{"result": map[string]any{"id": "msg-1"}})
	code, v = s.post("/v1/outcome", settle)
	unavailable("outcome", code, v, "not_recorded")
	elsewhere := outcome(b, "succeeded", map[string]any{"result": map[string]any{"id": "msg-2"}})
	code, v = other.post("/v1/outcome", elsewhere)
	unavailable("outcome at another server", code, v, "store_unavailable")
	mend()

	code, v = s.post("/v1/heartbeat", ref(a))
	want(t, "heartbeat sent again", code, v, 200, "", "")
	code, v = s.post("/v1/outcome", settle)
	want(t, "outcome sent again", code, v, 200, "status", "succeeded")
	code, v = other.post("/v1/outcome", elsewhere)
	want(t, "outcome sent again at another server", code, v, 200, "status", "succeeded")
}

// TestHeartbeatWhoseReplyIsLostIsNotFenced: a heartbeat the database
// applied, whose reply was lost, is not answered fenced: the claim
// holds, and the client would stop its effect for nothing. It is
// answered 503, and sent again, renews.
func TestHeartbeatWhoseReplyIsLostIsNotFenced(t *testing.T) {
	s, p := cutServer(t, once.Config{Default: once.KindPolicy{Lease: 30 * time.Second}})
	code, a := s.post("/v1/claim", claimBody(wireIntent(1, map[string]any{"subject": "hello"})))
	want(t, "claim", code, a, 200, "answer", "claimed")
	cutDone := p.CutAfter([]byte("SET lease_until = now() + $3::float8"), faultproxy.PostgresReady)
	code, v := s.post("/v1/heartbeat", ref(a))
	lost(t, p, cutDone, "the heartbeat", code, v)
	if code == 409 || v["code"] == "fenced" {
		t.Fatalf("a heartbeat whose reply was lost = %d %v; want it not fenced: the claim holds", code, v)
	}
	if code != 200 {
		want(t, "a heartbeat whose reply was lost", code, v, 503, "code", "store_unavailable")
	}
	code, v = s.post("/v1/heartbeat", ref(a))
	want(t, "the heartbeat sent again", code, v, 200, "", "")
	code, v = s.post("/v1/outcome", outcome(a, "succeeded", nil))
	want(t, "outcome", code, v, 200, "status", "succeeded")
}

// Markers of the PostgreSQL store's statements, as its queries.sql has
// them: the claim of a new key, and a transition (an outcome).
const (
	claimMarker      = "ON CONFLICT (key) DO NOTHING"
	transitionMarker = "WITH u AS ("
)

// TestClaimWhoseStoreReplyIsLost: the database commits a claim and its
// reply is lost (cut), or never comes (hung): the server reads the row
// back, and the client is answered claimed, or told to send the claim
// again; sent again, it gets the same attempt. Nothing is claimed twice.
func TestClaimWhoseStoreReplyIsLost(t *testing.T) {
	for _, hang := range []bool{false, true} {
		t.Run(map[bool]string{false: "cut", true: "hung"}[hang], func(t *testing.T) {
			s, p := cutServer(t, once.Config{ClaimTimeout: time.Second, Default: once.KindPolicy{Lease: 30 * time.Second}})
			arm := p.CutAfter
			if hang {
				arm = p.HangAfter
			}
			done := arm([]byte(claimMarker), faultproxy.PostgresReady)
			body := claimBody(wireIntent(1, map[string]any{"subject": "hello"}))
			code, first := s.post("/v1/claim", body)
			lost(t, p, done, "the claim", code, first)
			if code != 200 {
				want(t, "a claim whose reply the database lost", code, first, 503, "code", "store_unavailable")
			}
			if hang {
				p.Reset() // the hung connection is closed, as a pool's would be in time
			}
			code, again := s.post("/v1/claim", body)
			want(t, "the claim sent again", code, again, 200, "answer", "claimed")
			if first["token"] != nil && (again["token"] != first["token"] || again["attempt"] != first["attempt"]) {
				t.Fatalf("the claim sent again = %v; want the attempt first answered, %v", again, first)
			}
			if again["attempt"] != 1.0 {
				t.Fatalf("the claim sent again is attempt %v; want 1: nothing was claimed twice", again["attempt"])
			}
			code, v := s.post("/v1/outcome", outcome(again, "succeeded", nil))
			want(t, "outcome", code, v, 200, "status", "succeeded")
			evs, err := s.c.Events(t.Context(), once.Key(again["key"].(string)))
			if err != nil {
				t.Fatal(err)
			}
			claims := 0
			for _, e := range evs {
				if e.Type == once.EventClaimed {
					claims++
				}
			}
			if claims != 1 {
				t.Fatalf("%d claims in the trail; want 1", claims)
			}
		})
	}
}

// TestOutcomeWhoseStoreReplyIsLost: the database commits an outcome
// and its reply is lost (cut) or never comes (hung): the server reads it
// back or tries again, and answers succeeded, or not_recorded to be
// sent again; sent again, it is succeeded, and recorded once.
func TestOutcomeWhoseStoreReplyIsLost(t *testing.T) {
	for _, hang := range []bool{false, true} {
		t.Run(map[bool]string{false: "cut", true: "hung"}[hang], func(t *testing.T) {
			s, p := cutServer(t, once.Config{RecordTimeout: 2 * time.Second, Default: once.KindPolicy{Lease: 30 * time.Second}})
			code, a := s.post("/v1/claim", claimBody(wireIntent(1, map[string]any{"subject": "hello"})))
			want(t, "claim", code, a, 200, "answer", "claimed")
			arm := p.CutAfter
			if hang {
				arm = p.HangAfter
			}
			done := arm([]byte(transitionMarker), faultproxy.PostgresReady)
			settle := outcome(a, "succeeded", map[string]any{"result": map[string]any{"id": "msg-1"}})
			code, v := s.post("/v1/outcome", settle)
			lost(t, p, done, "the outcome", code, v)
			if code != 200 {
				if code != 503 {
					t.Fatalf("an outcome whose reply the database lost = %d %v; want 200 or 503", code, v)
				}
				if hang {
					p.Reset()
				}
				code, v = s.post("/v1/outcome", settle)
			}
			want(t, "the outcome", code, v, 200, "status", "succeeded")
			evs, err := s.c.Events(t.Context(), once.Key(a["key"].(string)))
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, e := range evs {
				if e.Type == once.EventSucceeded {
					n++
				}
			}
			if n != 1 {
				t.Fatalf("%d successes in the trail; want 1", n)
			}
		})
	}
}

// TestWrongTokensAreSlowed: an address that keeps sending wrong tokens
// is answered 429 after twenty, slowly; a right token is served, from
// there too (TestRightTokenIsServedAfterWrongOnesFromItsAddress), and
// from another address.
func TestWrongTokensAreSlowed(t *testing.T) {
	s := newServer(t, stores(t)["sqlite"](t), once.Config{})
	from := func(ip string) *http.Client {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		return &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
	}
	keys := func(c *http.Client, token string) int {
		req, _ := http.NewRequest("POST", s.url+"/v1/keys", strings.NewReader(`{"intent":{"run":"r","step":1,"kind":"k"}}`))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	guesser, worker := from("127.0.0.1"), from("127.0.0.2")
	for i := range 20 {
		if code := keys(guesser, fmt.Sprintf("guess-%020d", i)); code != 401 {
			t.Fatalf("guess %d = %d; want 401", i+1, code)
		}
	}
	if code := keys(guesser, "guess-21-000000000000"); code != 429 {
		t.Fatalf("the 21st guess = %d; want 429", code)
	}
	start := time.Now()
	if code := keys(guesser, "guess-22-000000000000"); code != 429 || time.Since(start) < 900*time.Millisecond {
		t.Fatalf("the 22nd guess = %d after %v; want 429 after a second", code, time.Since(start))
	}
	if code := keys(guesser, workerToken); code != 200 {
		t.Fatalf("a right token from the guessing address = %d; want 200", code)
	}
	if code := keys(worker, workerToken); code != 200 {
		t.Fatalf("a worker's right token from another address = %d; want 200", code)
	}
}
