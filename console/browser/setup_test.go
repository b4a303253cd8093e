package browser_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/oncehq/once"
	"github.com/oncehq/once/console"
	"github.com/oncehq/once/internal/testdb"
)

// The fixtures here mirror the console package's own tests: that package
// is in the core module, and its test files cannot be imported from here.

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines leaked:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// mount is where a test puts the console: at the root of its own server,
// as `once serve` does, or under a prefix on an application's own mux.
type mount struct{ name, prefix string }

var mounts = []mount{{"root", ""}, {"prefixed", "/ops/once"}}

// bundle is a console over a real SQLite store holding three actions of
// one run: one succeeded, one in review, one failed permanently.
type bundle struct {
	client *once.Client
	// h is what requests go through: the console itself, or the
	// application's mux it is mounted on.
	h      http.Handler
	prefix string
	review once.Key
}

func setup(t *testing.T, cfg console.Config) *bundle {
	t.Helper()
	ctx := context.Background()
	client, _ := testdb.SQLiteClient(t, once.Config{})
	b := &bundle{client: client}
	do := func(step int64, target string, effect func() (string, error)) once.Key {
		in := once.Intent{Run: "run-1", Step: step, Kind: "send_email", Target: target,
			Payload: map[string]string{"subject": "Invoice", "body": "Your invoice is attached"}}
		once.Do(ctx, client, in, func(context.Context, once.Attempt) (string, error) { return effect() })
		key, _, err := once.KeyOf(in)
		if err != nil {
			t.Fatal(err)
		}
		return key
	}
	ok := do(0, "ada@example.com", func() (string, error) { return "msg-1", nil })
	b.review = do(1, "bob@example.com", func() (string, error) { return "", errors.New("smtp: connection reset after DATA") })
	failed := do(2, "nobody@example.com", func() (string, error) { return "", once.Permanent(errors.New("550 no such user")) })
	for key, want := range map[once.Key]once.Status{ok: once.StatusSucceeded, b.review: once.StatusReview, failed: once.StatusFailed} {
		a, err := client.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if a.Status != want {
			t.Fatalf("setup: action %s is %s, want %s", key, a.Status, want)
		}
	}
	cfg.Client = client
	h, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b.h, b.prefix = h, strings.TrimSuffix(cfg.Prefix, "/")
	if b.prefix != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "the application's own page")
		})
		mux.Handle(b.prefix+"/", h)
		b.h = mux
	}
	return b
}

// url is the console's page p as the browser sees it, prefix included.
func (b *bundle) url(p string) string { return b.prefix + p }

// kindsLog is a store whose send_email actions were claimed with a 10 s
// lease, a re-drive hook and a 3-day retention, and a console over a
// client that knows no kind, as `once serve` is.
func kindsLog(t *testing.T) http.Handler {
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
