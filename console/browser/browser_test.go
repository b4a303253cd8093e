package browser_test

import (
	"context"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/chromedp"

	"github.com/oncehq/once"
	"github.com/oncehq/once/console"
	"github.com/oncehq/once/console/internal/consoletest"
)

const chromiumPath = "/usr/bin/chromium"

// screenshotPath is where the test leaves a picture of the review queue,
// for a person to look at after a change to the pages or the stylesheet.
const screenshotPath = "/tmp/console-review.png"

// stepTimeout bounds each browser step, so a hung page fails the test
// with the step's name instead of running into the package timeout.
const stepTimeout = 60 * time.Second

// TestBrowserResolve drives the console in real headless Chromium the way
// an operator would: from the overview to the review queue, into an
// action and back to the queue, then a note and a click on Retry; and checks both the
// page and the store. It proves what the httptest tests cannot: that the
// forms, the cookies, the CSRF token, the redirect and the
// Content-Security-Policy work together in a browser. It does so at the
// root of a server, as `once serve` runs it, and under a prefix on an
// application's mux, where every link, cookie and redirect must keep the
// prefix for the walk to get through.
func TestBrowserResolve(t *testing.T) {
	if _, err := os.Stat(chromiumPath); err != nil {
		msg := "headless Chromium is not installed at " + chromiumPath + "; install it with `apt-get install -y chromium` to run the browser test"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	// One browser at a time: each is heavy for a small machine.
	for _, m := range mounts {
		t.Run(m.Name, func(t *testing.T) { browserResolve(t, m) })
	}
}

func browserResolve(t *testing.T, m consoletest.Mount) {
	b := setup(t, console.Config{Prefix: m.Prefix})
	srv := httptest.NewServer(b.h)
	defer srv.Close()

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath),
		chromedp.Headless,
		chromedp.NoSandbox, // the tests run as root
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-quic", true),
		chromedp.WindowSize(1280, 900),
	)
	// The whole browser's life is bounded too: the first Run starts it
	// under this context, and cancelling a step's context must not.
	ctx, cancel := context.WithTimeout(context.Background(), 4*stepTimeout)
	defer cancel()
	ctx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	ctx, cancelBrowser := chromedp.NewContext(ctx)
	defer cancelBrowser()

	// Collect what the browser logs as errors: a Content-Security-Policy
	// violation or a failed load shows up here. Listen also starts the
	// browser, under the test's overall timeout.
	var mu sync.Mutex
	var browserErrors []string
	err := chromedp.Listen(ctx, func(ev any) {
		if e, ok := ev.(*log.EventEntryAdded); ok && e.Entry.Level == log.EntryLevelError {
			mu.Lock()
			browserErrors = append(browserErrors, e.Entry.Text+" "+e.Entry.URL)
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatalf("starting Chromium: %v", err)
	}
	step := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, cancel := context.WithTimeout(ctx, stepTimeout)
		defer cancel()
		if err := chromedp.Do(sctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	text := func(sel string) string {
		t.Helper()
		return read(t, ctx, "read "+sel, chromedp.Text(chromedp.CSS(sel)))
	}
	location := func() string {
		t.Helper()
		return read(t, ctx, "read the location", chromedp.Location())
	}

	key := string(b.review)
	item := "#item-" + key
	// The action page has a resolve form too; this one is the queue's.
	form := item + " #resolve-" + key

	step("load the overview",
		chromedp.Navigate(srv.URL+b.url("/")),
		chromedp.WaitVisible(chromedp.CSS(`a.backlog`)),
	)
	if got := text(`a.backlog strong`); got != "1" {
		t.Errorf("overview backlog shows %q, want 1", got)
	}

	step("open the review queue",
		chromedp.Click(chromedp.CSS(`a.backlog`)),
		chromedp.WaitVisible(chromedp.CSS(item)),
	)
	if loc := location(); loc != srv.URL+b.url("/review") {
		t.Errorf("the backlog link led to %s", loc)
	}
	shot := read(t, ctx, "take a screenshot", chromedp.FullScreenshot(100))
	if err := os.WriteFile(screenshotPath, shot, 0o644); err != nil {
		t.Errorf("saving the screenshot: %v", err)
	}

	step("open the action",
		chromedp.Click(chromedp.CSS(item+` a.key`)),
		chromedp.WaitVisible(chromedp.CSS(`dl.fields`)),
	)
	if loc, reason := location(), text(`dd.reason`); loc != srv.URL+b.url("/actions/"+key) || !strings.Contains(reason, "connection reset after DATA") {
		t.Errorf("action page %s shows reason %q", loc, reason)
	}

	step("return to the queue",
		chromedp.Click(chromedp.CSS(`header nav a[href="`+b.url("/review")+`"]`)),
		chromedp.WaitVisible(chromedp.CSS(form+` textarea[name=note]`)),
	)
	step("retry from the queue",
		chromedp.SendKeys(chromedp.CSS(form+` textarea[name=note]`), "checked the mail log: nothing left the relay"),
		chromedp.SendKeys(chromedp.CSS(form+` input[name=by]`), "ada"),
		chromedp.Click(chromedp.CSS(form+` button[value=retry]`)),
		chromedp.WaitVisible(chromedp.CSS(`p.flash`)),
	)
	if flash, loc := text(`p.flash`), location(); !strings.Contains(flash, "released for retry") || loc != srv.URL+b.url("/review") {
		t.Errorf("after Retry the browser is at %s with notice %q", loc, flash)
	}

	step("see the new status",
		chromedp.Navigate(srv.URL+b.url("/actions/"+key)),
		chromedp.WaitVisible(chromedp.CSS(`h1 .badge`)),
	)
	if badge := text(`h1 .badge`); badge != string(once.StatusReleased) {
		t.Errorf("the action page shows status %q, want released", badge)
	}

	a, err := b.client.Get(context.Background(), b.review)
	if err != nil {
		t.Fatal(err)
	}
	if a.Status != once.StatusReleased || a.ResolvedBy != "ada" || a.ResolveNote != "checked the mail log: nothing left the relay" {
		t.Errorf("in the store: status %s, by %q, note %q", a.Status, a.ResolvedBy, a.ResolveNote)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, e := range browserErrors {
		t.Errorf("the browser logged an error: %s", e)
	}
}

// read runs one browser action that returns a value, under stepTimeout.
func read[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	v, err := chromedp.Run(sctx, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// TestBrowserKindsPageFits loads the kinds page in headless Chromium in a
// window 1280 pixels wide and checks that nothing is wider than it: no
// sideways scrolling to read a kind's counts.
func TestBrowserKindsPageFits(t *testing.T) {
	if _, err := os.Stat(chromiumPath); err != nil {
		msg := "headless Chromium is not installed at " + chromiumPath + "; install it with `apt-get install -y chromium` to run the browser test"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	srv := httptest.NewServer(kindsLog(t))
	defer srv.Close()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 900))
	ctx, cancel := context.WithTimeout(context.Background(), 2*stepTimeout)
	defer cancel()
	ctx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	ctx, cancelBrowser := chromedp.NewContext(ctx)
	defer cancelBrowser()
	sctx, cancelStep := context.WithTimeout(ctx, stepTimeout)
	defer cancelStep()
	if err := chromedp.Do(sctx, chromedp.Navigate(srv.URL+"/kinds"), chromedp.WaitVisible(chromedp.CSS(`table`))); err != nil {
		t.Fatalf("load the kinds page: %v", err)
	}
	width := read(t, ctx, "read the page's width", chromedp.Evaluate[int]("document.documentElement.scrollWidth"))
	window := read(t, ctx, "read the window's width", chromedp.Evaluate[int]("window.innerWidth"))
	t.Logf("the kinds page is %d pixels wide in a window of %d", width, window)
	if window > 1280 || width > window {
		t.Errorf("the kinds page is %d pixels wide in a window of %d", width, window)
	}
}
