package main

import (
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/oncehq/once/internal/faultproxy"
)

// proxiedDB returns a PostgreSQL URL for the example, as postgresDB's,
// that reaches the server through a fault proxy. Statements carry their
// text on every execution, so a marker in one sees each of its runs.
func proxiedDB(t *testing.T) (*faultproxy.Proxy, string) {
	t.Helper()
	db := postgresDB(t)
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	u.Host = p.Addr()
	q := u.Query()
	q.Set("default_query_exec_mode", "exec")
	u.RawQuery = q.Encode()
	return p, u.String()
}

// TestChargeReplyLost: the database commits a charge and its reply is
// lost on the way back. The client must not be told the charge was not
// written while it was: the answer is the charge (201), and the key is
// not released with a 5xx for a charge that exists.
func TestChargeReplyLost(t *testing.T) {
	t.Parallel()
	proxy, db := proxiedDB(t)
	p := start(t, db)
	key := newKey()
	cut := proxy.CutAfter([]byte("ON CONFLICT (tenant, idempotency_key) DO NOTHING"), faultproxy.PostgresReady)
	first := p.post(t, key, "", adaBody)
	select {
	case <-cut:
	case <-time.After(time.Minute):
		t.Fatal("the charge's insert never went through the proxy")
	}
	list := p.charges(t, "")
	if len(list) != 1 {
		t.Fatalf("charges after the lost reply: %+v; want the one the database committed", list)
	}
	if first.status != http.StatusCreated || first.charge(t) != list[0] {
		t.Fatalf("the charge %s was committed, and the client was answered %d %s; want 201 with it", list[0].ID, first.status, first.body)
	}
	if a := p.post(t, key, "", adaBody); a.status != http.StatusCreated || !a.replayed() || a.body != first.body {
		t.Fatalf("repeat: %d replayed=%v %s; want the first answer replayed", a.status, a.replayed(), a.body)
	}
}
