// Package consoletest holds the fixtures the console's tests share: the
// console package's own, and the browser tests', which are a module of
// their own (console/browser) and cannot import another package's test
// files.
package consoletest

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/console"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/sqlite"
)

// Mount is where a test puts the console: at the root of its own server,
// as `once serve` does, or under a prefix on an application's own mux.
type Mount struct{ Name, Prefix string }

// Mounts are both places.
var Mounts = []Mount{{"root", ""}, {"prefixed", "/ops/once"}}

// AppHome is what the application's own mux serves beside the console.
const AppHome = "the application's own page"

// Log is a real SQLite store holding three actions of one run: one
// succeeded (OK), one in review (Review), one failed permanently
// (Failed).
type Log struct {
	Store              *sqlite.Store
	Client             *once.Client
	OK, Review, Failed once.Key
	RunID, Payload     string
}

// NewLog makes the log.
func NewLog(t *testing.T) *Log {
	t.Helper()
	ctx := context.Background()
	client, store := testdb.SQLiteClient(t, once.Config{})
	l := &Log{Store: store, Client: client, RunID: "run-1", Payload: "Your invoice is attached"}
	do := func(step int64, target string, effect func() (string, error)) once.Key {
		in := once.Intent{Run: l.RunID, Step: step, Kind: "send_email", Target: target,
			Payload: map[string]string{"subject": "Invoice", "body": l.Payload}}
		res, err := once.Do(ctx, client, in, func(context.Context, once.Attempt) (string, error) { return effect() })
		key, _, kerr := once.KeyOf(in)
		if kerr != nil {
			t.Fatal(kerr)
		}
		if err == nil && res.Key != key {
			t.Fatalf("Do returned key %s, KeyOf %s", res.Key, key)
		}
		return key
	}
	l.OK = do(0, "ada@example.com", func() (string, error) { return "msg-1", nil })
	l.Review = do(1, "bob@example.com", func() (string, error) { return "", errors.New("smtp: connection reset after DATA") })
	l.Failed = do(2, "nobody@example.com", func() (string, error) { return "", once.Permanent(errors.New("550 no such user")) })
	for key, want := range map[once.Key]once.Status{l.OK: once.StatusSucceeded, l.Review: once.StatusReview, l.Failed: once.StatusFailed} {
		a, err := client.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if a.Status != want {
			t.Fatalf("setup: action %s is %s, want %s", key, a.Status, want)
		}
	}
	return l
}

// Serve makes the console from cfg and puts it where cfg.Prefix says:
// with a prefix, on an application's mux that serves pages of its own.
// It returns the console, what requests go through, and the prefix.
func Serve(t *testing.T, cfg console.Config) (c, h http.Handler, prefix string) {
	t.Helper()
	c, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	prefix = strings.TrimSuffix(cfg.Prefix, "/")
	if prefix == "" {
		return c, c, ""
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, AppHome) })
	mux.Handle(prefix+"/", c)
	return c, mux, prefix
}

// KindsLog is a store whose send_email actions were claimed by an
// application with a 10 s lease, a re-drive hook after 10 s and a 3-day
// retention, and a console over a client that knows no kind, as `once
// serve` is.
func KindsLog(t *testing.T) http.Handler {
	t.Helper()
	ctx := context.Background()
	app, store := testdb.SQLiteClient(t, once.Config{Kinds: map[string]once.KindPolicy{"send_email": {
		Lease: 10 * time.Second, RedriveAfter: 10 * time.Second, Retention: 72 * time.Hour,
		Redrive: func(context.Context, once.Action) error { return nil },
	}}})
	for i, kind := range []string{"send_email", "send_email", "charge_card_with_a_rather_long_kind_name", "post_message"} {
		once.Do(ctx, app, once.Intent{Run: "r", Step: int64(i), Kind: kind}, func(context.Context, once.Attempt) (int, error) { return i, nil })
	}
	serve, err := once.New(once.Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	h, err := console.New(console.Config{Client: serve})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// GatedKind is the kind whose actions Gated asks a person about before
// they run.
const GatedKind = "wire_transfer"

// Gated is the config of a client whose GatedKind always asks a person
// first, with the given expiry (zero: the default).
func Gated(expiry time.Duration) once.Config {
	return once.Config{Kinds: map[string]once.KindPolicy{GatedKind: {Approval: once.ApprovalPolicy{Always: true, Expiry: expiry}}}}
}

// Transfer is an intent of GatedKind: a wire transfer of cents to iban,
// step step of the run "payouts".
func Transfer(step int64, iban string, cents int) once.Intent {
	return once.Intent{Run: "payouts", Step: step, Kind: GatedKind, Target: iban,
		Payload: map[string]any{"iban": iban, "cents": cents, "memo": "payout"}}
}

// Runs counts the runs of an effect, as the tests of an approval count
// that it ran exactly once, and only after the approval.
type Runs struct{ n atomic.Int64 }

// Effect is an effect that counts its run and returns "sent".
func (r *Runs) Effect(context.Context, once.Attempt) (string, error) {
	r.n.Add(1)
	return "sent", nil
}

// N is how many times the effect ran.
func (r *Runs) N() int64 { return r.n.Load() }

// Await delivers in through c and fails the test unless the action now
// awaits approval, with nothing run; it returns the action's key.
func Await(t *testing.T, c *once.Client, in once.Intent, runs *Runs) once.Key {
	t.Helper()
	before := runs.N()
	_, err := once.Do(context.Background(), c, in, runs.Effect)
	if !errors.Is(err, once.ErrAwaitingApproval) {
		t.Fatalf("Do of a gated kind = %v; want it to await approval", err)
	}
	if runs.N() != before {
		t.Fatalf("the effect ran before anyone approved it")
	}
	key, _, err := once.KeyOf(in)
	if err != nil {
		t.Fatal(err)
	}
	return key
}
