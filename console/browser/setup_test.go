package browser_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/chromedp"
	"go.uber.org/goleak"

	"github.com/oncehq/once"
	"github.com/oncehq/once/console"
	"github.com/oncehq/once/console/internal/consoletest"
)

// The fixtures are consoletest's, which the console package's own tests
// share.

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

var mounts = consoletest.Mounts

// bundle is a console over consoletest's log of three actions.
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
	l := consoletest.NewLog(t)
	cfg.Client = l.Client
	b := &bundle{client: l.Client, review: l.Review}
	_, b.h, b.prefix = consoletest.Serve(t, cfg)
	return b
}

// url is the console's page p as the browser sees it, prefix included.
func (b *bundle) url(p string) string { return b.prefix + p }

var kindsLog = consoletest.KindsLog

// browser is a headless Chromium under one test: its context, bounded
// as a whole by budget, and what it logged as errors (a
// Content-Security-Policy violation or a failed load shows up there).
type browser struct {
	ctx    context.Context
	mu     sync.Mutex
	errors []string
}

// newBrowser starts Chromium in a window 1280 pixels wide, or skips the
// test when it is not installed (fails it on CI). It stops when the
// test ends.
func newBrowser(t *testing.T, budget time.Duration) *browser {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		msg := "headless Chromium is not installed at " + chromiumPath + "; install it with `apt-get install -y chromium` to run the browser test"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-quic", true),
		chromedp.WindowSize(1280, 900),
	)
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	ctx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	ctx, cancelBrowser := chromedp.NewContext(ctx)
	t.Cleanup(func() { cancelBrowser(); cancelAlloc(); cancel() })
	b := &browser{ctx: ctx}
	err := chromedp.Listen(ctx, func(ev any) {
		if e, ok := ev.(*log.EventEntryAdded); ok && e.Entry.Level == log.EntryLevelError {
			b.mu.Lock()
			b.errors = append(b.errors, e.Entry.Text+" "+e.Entry.URL)
			b.mu.Unlock()
		}
	})
	if err != nil {
		t.Fatalf("starting Chromium: %v", err)
	}
	return b
}

// step runs browser actions under stepTimeout, failing the test with
// what it was doing.
func (b *browser) step(t *testing.T, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	sctx, cancel := context.WithTimeout(b.ctx, stepTimeout)
	defer cancel()
	if err := chromedp.Do(sctx, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// text is the text of the first element sel finds.
func (b *browser) text(t *testing.T, sel string) string {
	t.Helper()
	return read(t, b.ctx, "read "+sel, chromedp.Text(chromedp.CSS(sel)))
}

// location is the page's URL.
func (b *browser) location(t *testing.T) string {
	t.Helper()
	return read(t, b.ctx, "read the location", chromedp.Location())
}

// checkErrors fails the test for every error the browser logged.
func (b *browser) checkErrors(t *testing.T) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, e := range b.errors {
		t.Errorf("the browser logged an error: %s", e)
	}
}
