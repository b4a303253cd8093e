package browser_test

import (
	"context"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/oncehq/once"
	"github.com/oncehq/once/console"
	"github.com/oncehq/once/console/internal/consoletest"
	"github.com/oncehq/once/internal/testdb"
)

// approvalsScreenshot is where the test leaves a picture of the
// approvals queue, for a person to look at after a change to the pages.
const approvalsScreenshot = "/tmp/console-approvals.png"

// TestBrowserApprove drives an approval in real headless Chromium as a
// person would: a wire transfer of a gated kind waits; from the overview
// to the approvals queue, into the action, a note and a click on
// Approve. Then a delivery of the same intent runs the effect, exactly
// once, and the page shows it approved, then succeeded. It proves that
// the form's hidden attempt and fingerprint, the CSRF token, the
// redirect and the Content-Security-Policy work together in a browser,
// at the root and under a prefix.
func TestBrowserApprove(t *testing.T) {
	for _, m := range mounts {
		t.Run(m.Name, func(t *testing.T) { browserApprove(t, m) })
	}
}

func browserApprove(t *testing.T, m consoletest.Mount) {
	br := newBrowser(t, 4*stepTimeout)
	ctx := context.Background()
	client, _ := testdb.SQLiteClient(t, consoletest.Gated(0))
	var runs consoletest.Runs
	in := consoletest.Transfer(0, "DE89370400440532013000", 120_000)
	key := string(consoletest.Await(t, client, in, &runs))
	_, h, prefix := consoletest.Serve(t, console.Config{Client: client, Prefix: m.Prefix})
	srv := httptest.NewServer(h)
	defer srv.Close()
	u := func(p string) string { return srv.URL + prefix + p }
	form := "#approve-" + key

	br.step(t, "load the overview",
		chromedp.Navigate(u("/")),
		chromedp.WaitVisible(chromedp.CSS(`a.approvals-count`)),
	)
	if got := br.text(t, `a.approvals-count strong`); got != "1" {
		t.Errorf("the overview counts %q awaiting approval, want 1", got)
	}
	br.step(t, "open the approvals queue",
		chromedp.Click(chromedp.CSS(`a.approvals-count`)),
		chromedp.WaitVisible(chromedp.CSS(`#approval-`+key)),
	)
	if loc, row := br.location(t), br.text(t, `#approval-`+key); loc != u("/approvals") || !strings.Contains(row, "DE89370400440532013000") ||
		!strings.Contains(row, consoletest.GatedKind) || !strings.Contains(row, client.Origin()) {
		t.Errorf("the queue at %s shows %q; want the kind, the target and who asked", loc, row)
	}
	shot := read(t, br.ctx, "take a screenshot", chromedp.FullScreenshot(100))
	if err := os.WriteFile(approvalsScreenshot, shot, 0o644); err != nil {
		t.Errorf("saving the screenshot: %v", err)
	}

	br.step(t, "open the action",
		chromedp.Click(chromedp.CSS(`#approval-`+key+` a.decide`)),
		chromedp.WaitVisible(chromedp.CSS(form+` textarea[name=note]`)),
	)
	if loc := br.location(t); loc != u("/actions/"+key) {
		t.Errorf("Decide led to %s", loc)
	}
	br.step(t, "approve",
		chromedp.SendKeys(chromedp.CSS(form+` textarea[name=note]`), "checked the IBAN with the customer"),
		chromedp.SendKeys(chromedp.CSS(form+` input[name=by]`), "ada"),
		chromedp.Click(chromedp.CSS(form+` button[value=approve]`)),
		chromedp.WaitVisible(chromedp.CSS(`p.flash`)),
	)
	if flash, badge, loc := br.text(t, `p.flash`), br.text(t, `h1 .badge`), br.location(t); !strings.Contains(flash, "approved by ada") ||
		badge != string(once.StatusApproved) || loc != u("/actions/"+key) {
		t.Errorf("after Approve the browser is at %s, showing %q with notice %q", loc, badge, flash)
	}
	a, err := client.Get(ctx, once.Key(key))
	if err != nil || a.Status != once.StatusApproved || a.ResolvedBy != "ada" || a.ResolveNote != "checked the IBAN with the customer" || runs.N() != 0 {
		t.Fatalf("in the store: %s by %q, note %q, %v (ran %d)", a.Status, a.ResolvedBy, a.ResolveNote, err, runs.N())
	}

	// The job comes again, three times: the effect runs once.
	for range 3 {
		if res, err := once.Do(ctx, client, in, runs.Effect); err != nil || res.Value != "sent" {
			t.Fatalf("Do after the approval = %+v, %v", res, err)
		}
	}
	if runs.N() != 1 {
		t.Errorf("the approved effect ran %d times over 3 deliveries; want once", runs.N())
	}
	br.step(t, "see it succeeded",
		chromedp.Reload(),
		chromedp.WaitVisible(chromedp.CSS(`h1 .badge`)),
	)
	if badge := br.text(t, `h1 .badge`); badge != string(once.StatusSucceeded) {
		t.Errorf("after the run the page shows %q, want succeeded", badge)
	}
	if trail := br.text(t, `table.list`); !strings.Contains(trail, "approved via console: checked the IBAN") || !strings.Contains(trail, "succeeded") {
		t.Errorf("the trail does not show the approval and the run:\n%s", trail)
	}
	if _, err := os.Stat(approvalsScreenshot); err != nil {
		t.Error(err)
	}
	br.checkErrors(t)
}
