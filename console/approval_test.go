package console_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/console"
	"github.com/oncehq/once/console/internal/consoletest"
	"github.com/oncehq/once/internal/testdb"
)

// The console's side of approval gates: the approvals queue, the Approve
// and Reject form on an action's page, and the API's endpoints, over
// real SQLite and PostgreSQL stores.

// gatedStores runs test for a client made with cfg over each store, in
// parallel: SQLite, and PostgreSQL in a schema of its own.
func gatedStores(t *testing.T, cfg once.Config, test func(t *testing.T, c *once.Client)) {
	t.Helper()
	for _, name := range []string{"sqlite", "postgres"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := cfg
			if name == "sqlite" {
				c, _ := testdb.SQLiteClient(t, cfg)
				test(t, c)
				return
			}
			_, store, _, _ := postgresClient(t, "once_approvals")
			cfg.Store = store
			c, err := once.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			test(t, c)
		})
	}
}

// gatedBundle is a console over c, mounted as m says.
func gatedBundle(t *testing.T, c *once.Client, m mount) *bundle {
	t.Helper()
	b := &bundle{client: c}
	b.mount(t, console.Config{Client: c, Prefix: m.Prefix})
	return b
}

var (
	approvalItem    = regexp.MustCompile(`<tr id="approval-([0-9a-f]+)"`)
	attemptField    = regexp.MustCompile(`name="attempt" value="(\d+)"`)
	fingerprintFied = regexp.MustCompile(`name="fingerprint" value="([^"]+)"`)
)

// approvalForm loads the action page of key as a browser would and
// returns its CSRF cookie, the form's token, and the attempt and
// fingerprint the form carries.
func (b *bundle) approvalForm(t *testing.T, key once.Key) (cookie *http.Cookie, token, attempt, fingerprint string) {
	t.Helper()
	cookie, token = b.form(t, "/actions/"+string(key))
	body := b.get("/actions/" + string(key)).Body.String()
	a, f := attemptField.FindStringSubmatch(body), fingerprintFied.FindStringSubmatch(body)
	if a == nil || f == nil {
		t.Fatalf("the action page of %s has no attempt or fingerprint field:\n%s", key, body)
	}
	return cookie, token, a[1], f[1]
}

// awaitExpiry waits until the wait of key has expired by the database's
// clock, as the client's fence reads it.
func awaitExpiry(t *testing.T, c *once.Client, key once.Key) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		n, err := c.Count(context.Background(), once.Filter{Status: once.StatusAwaitingApproval, Expired: true, KeyPrefix: string(key)})
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the wait of %s has not expired after 30 s", key)
		}
	}
}

// TestApprovalsQueue: the approvals page lists what waits for approval,
// oldest first, with what will happen (kind, target, a bounded preview
// of the payload), who asked (the claiming process and the run), since
// when and until when; the overview counts it and links there, and
// every link stays under the console's mount.
func TestApprovalsQueue(t *testing.T) {
	t.Parallel()
	gatedStores(t, consoletest.Gated(0), func(t *testing.T, c *once.Client) {
		var runs consoletest.Runs
		ctx := context.Background()
		var keys []once.Key
		for i, iban := range []string{"DE89370400440532013000", "FR1420041010050500013M02606", "NL91ABNA0417164300"} {
			keys = append(keys, consoletest.Await(t, c, consoletest.Transfer(int64(i), iban, 120_000+i), &runs))
		}
		big := consoletest.Transfer(3, "GB29NWBK60161331926819", 1)
		big.Payload = map[string]string{"memo": strings.Repeat("x", 100<<10) + "TAIL"}
		keys = append(keys, consoletest.Await(t, c, big, &runs))
		// An action of a kind that asks nobody is not in the queue.
		once.Do(ctx, c, once.Intent{Run: "other", Kind: "send_email"}, runs.Effect)
		want, err := c.List(ctx, once.Filter{Status: once.StatusAwaitingApproval, OldestFirst: true})
		if err != nil || len(want) != 4 {
			t.Fatalf("setup: %d awaiting approval, %v", len(want), err)
		}
		for _, m := range mounts {
			b := gatedBundle(t, c, m)
			w := b.get("/approvals")
			body := w.Body.String()
			if w.Code != http.StatusOK {
				t.Fatalf("GET /approvals: %d\n%s", w.Code, body)
			}
			var got []string
			for _, it := range approvalItem.FindAllStringSubmatch(body, -1) {
				got = append(got, it[1])
			}
			var wantKeys []string
			for _, a := range want {
				wantKeys = append(wantKeys, string(a.Key))
			}
			if !slices.Equal(got, wantKeys) {
				t.Errorf("%s: the queue lists\n%q\nwant, oldest first,\n%q", m.Name, got, wantKeys)
			}
			for _, s := range []string{"4 awaiting approval", consoletest.GatedKind, "DE89370400440532013000", "120000", c.Origin(),
				`href="` + b.url("/runs/payouts") + `"`, "step 2", `href="` + b.url("/actions/"+string(keys[0])) + `"`,
				"the last ", "open the action for the rest", `aria-current="page">Approvals`} {
				if !strings.Contains(body, s) {
					t.Errorf("%s: the approvals page lacks %q", m.Name, s)
				}
			}
			if strings.Contains(body, "TAIL") || len(body) > 64<<10 {
				t.Errorf("%s: the approvals page shows %d bytes, the end of a 100 KiB payload included; a preview is bounded", m.Name, len(body))
			}
			if strings.Contains(body, "expired") {
				t.Errorf("%s: a wait of 24 hours is marked expired", m.Name)
			}
			if overview := b.get("/").Body.String(); !strings.Contains(overview, `<a class="approvals-count waiting" href="`+b.url("/approvals")+`">`+"\n<strong>4</strong>") {
				t.Errorf("%s: the overview does not count 4 awaiting approval, linked to the queue:\n%s", m.Name, overview)
			}
			// Every link of the queue and of an action awaiting approval
			// stays under the mount, and loads.
			for _, p := range []string{"/approvals", "/actions/" + string(keys[0])} {
				for _, l := range linkAttr.FindAllStringSubmatch(b.get(p).Body.String(), -1) {
					link := html.UnescapeString(l[2])
					if strings.HasPrefix(link, "data:") {
						continue
					}
					if !strings.HasPrefix(link, b.url("/")) {
						t.Errorf("%s: GET %s: %s=%q is not under the mount", m.Name, p, l[1], link)
						continue
					}
					if strings.HasSuffix(link, "/approve") || strings.HasSuffix(link, "/reject") {
						continue // a POST form
					}
					if lw := b.serve(httptest.NewRequest(http.MethodGet, link, nil)); lw.Code != http.StatusOK {
						t.Errorf("%s: GET %s, linked from %s: %d", m.Name, link, p, lw.Code)
					}
				}
			}
		}

		// Pages of two: every action once, in order, then no next page.
		b := gatedBundle(t, c, mounts[0])
		// The API's preview is bounded as the page's is, and says how
		// much it left out.
		srv := httptest.NewServer(b.h)
		defer srv.Close()
		code, raw := fetch(t, srv.URL+"/api/approvals")
		var list struct {
			Approvals []struct {
				Key         string `json:"key"`
				PayloadText string `json:"payload_text"`
				PayloadCut  int    `json:"payload_cut"`
			} `json:"approvals"`
		}
		if err := json.Unmarshal(raw, &list); err != nil || code != http.StatusOK || len(list.Approvals) != 4 || len(raw) > 64<<10 {
			t.Fatalf("GET /api/approvals: %d, %d bytes, %v", code, len(raw), err)
		}
		for _, a := range list.Approvals {
			if a.Key == string(keys[3]) && (a.PayloadCut < 100<<10-4<<10 || len(a.PayloadText) > 2<<10 || strings.Contains(a.PayloadText, "TAIL")) {
				t.Errorf("GET /api/approvals shows %d bytes of a 100 KiB payload and says %d were cut", len(a.PayloadText), a.PayloadCut)
			}
		}
		var paged []string
		for link, pages := "/approvals?limit=2", 0; link != ""; pages++ {
			if pages == 3 {
				t.Fatalf("more than 2 pages of 2 for 4 actions")
			}
			body := b.serve(httptest.NewRequest(http.MethodGet, link, nil)).Body.String()
			for _, it := range approvalItem.FindAllStringSubmatch(body, -1) {
				paged = append(paged, it[1])
			}
			link = ""
			if n := nextPage.FindStringSubmatch(body); n != nil {
				link = html.UnescapeString(n[1])
			}
		}
		if len(paged) != 4 || paged[0] != string(want[0].Key) || paged[3] != string(want[3].Key) {
			t.Errorf("the pages of two listed %q", paged)
		}
		for _, bad := range []string{"/approvals?limit=0", "/approvals?limit=201", "/approvals?after=x", "/approvals?after=1-zz"} {
			if w := b.get(bad); w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), `class="error"`) {
				t.Errorf("GET %s: %d, want 400 saying what is wrong", bad, w.Code)
			}
		}
		if runs.N() != 1 {
			t.Errorf("the effect ran %d times; only the ungated action's should have", runs.N())
		}
	})
}

// TestApprovalFormApproves: the action page of an action awaiting
// approval carries the Approve and Reject form with the attempt and the
// fingerprint it shows; Approve (a note, a name) records the approval
// via the console, and the next delivery runs the effect exactly once.
func TestApprovalFormApproves(t *testing.T) {
	t.Parallel()
	gatedStores(t, consoletest.Gated(0), func(t *testing.T, c *once.Client) {
		ctx := context.Background()
		forMountsOf(t, func(t *testing.T, m mount, step int64) {
			var runs consoletest.Runs
			in := consoletest.Transfer(step, "DE89370400440532013000", 120_000)
			key := consoletest.Await(t, c, in, &runs)
			b := gatedBundle(t, c, m)
			page := b.get("/actions/" + string(key)).Body.String()
			for _, s := range []string{"Approve or reject", `action="` + b.url("/actions/"+string(key)+"/approve") + `"`,
				`formaction="` + b.url("/actions/"+string(key)+"/reject") + `"`, "Wait expires", "DE89370400440532013000", `name="since"`} {
				if !strings.Contains(page, s) {
					t.Errorf("the action page lacks %q", s)
				}
			}
			cookie, token, attempt, fp := b.approvalForm(t, key)
			a, _ := c.Get(ctx, key)
			if attempt != "1" || fp != string(a.Fingerprint) {
				t.Fatalf("the form carries attempt %s and fingerprint %s; want 1 and %s", attempt, fp, a.Fingerprint)
			}
			w := b.serve(b.postForm("/actions/"+string(key)+"/approve", url.Values{"csrf": {token}, "attempt": {attempt}, "fingerprint": {fp},
				"note": {"checked the IBAN\r\nwith the customer"}, "by": {"ada"}}, cookie))
			if w.Code != http.StatusSeeOther || w.Header().Get("Location") != b.url("/actions/"+string(key)) {
				t.Fatalf("approve: %d to %q\n%s", w.Code, w.Header().Get("Location"), w.Body)
			}
			a, err := c.Get(ctx, key)
			if err != nil || a.Status != once.StatusApproved || a.ResolvedBy != "ada" || a.ResolveNote != "checked the IBAN\nwith the customer" {
				t.Fatalf("after Approve: %s by %q, note %q, %v", a.Status, a.ResolvedBy, a.ResolveNote, err)
			}
			events, err := c.Events(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if last := events[len(events)-1]; last.Type != once.EventApproved || last.Actor != "ada" || !strings.Contains(last.Note, "approved via console: checked the IBAN") {
				t.Errorf("the trail's last event: %+v; want approved by ada via console", last)
			}
			r := httptest.NewRequest(http.MethodGet, b.url("/actions/"+string(key)), nil)
			for _, ck := range w.Result().Cookies() {
				r.AddCookie(ck)
			}
			if body := b.serve(r).Body.String(); !strings.Contains(body, "approved by ada") || !strings.Contains(body, "badge s-approved") || strings.Contains(body, "/approve\"") {
				t.Errorf("the page after Approve lacks the notice or the status, or still offers the form:\n%s", body)
			}
			for range 3 {
				res, err := once.Do(ctx, c, in, runs.Effect)
				if err != nil || res.Value != "sent" {
					t.Fatalf("Do after the approval = %+v, %v", res, err)
				}
			}
			if runs.N() != 1 {
				t.Errorf("the approved effect ran %d times over 3 deliveries; want once", runs.N())
			}
			if got := b.status(t, key); got != once.StatusSucceeded {
				t.Errorf("after the run the action is %s", got)
			}
		})
	})
}

// forMountsOf runs test once for each mount, one after the other, with
// a step of its own, so that the mounts decide actions of their own
// over one store.
func forMountsOf(t *testing.T, test func(t *testing.T, m mount, step int64)) {
	t.Helper()
	for i, m := range mounts {
		t.Run(m.Name, func(t *testing.T) { test(t, m, int64(i)) })
	}
}

// TestApprovalFormRejects: Reject needs a note (a 400 naming it, nothing
// written); with one, the action fails without running, and every
// delivery is told who rejected it and why.
func TestApprovalFormRejects(t *testing.T) {
	t.Parallel()
	gatedStores(t, consoletest.Gated(0), func(t *testing.T, c *once.Client) {
		ctx := context.Background()
		var runs consoletest.Runs
		in := consoletest.Transfer(0, "DE89370400440532013000", 9_900_000)
		key := consoletest.Await(t, c, in, &runs)
		b := gatedBundle(t, c, mounts[0])
		cookie, token, attempt, fp := b.approvalForm(t, key)
		form := url.Values{"csrf": {token}, "attempt": {attempt}, "fingerprint": {fp}, "by": {"grace"}, "note": {"  "}}
		w := b.serve(b.postForm("/actions/"+string(key)+"/reject", form, cookie))
		if body := w.Body.String(); w.Code != http.StatusBadRequest || !strings.Contains(body, "Note is empty") || !strings.Contains(body, `class="error"`) ||
			!strings.Contains(body, `value="grace"`) {
			t.Errorf("reject without a note: %d, want 400 naming the note, keeping the name\n%s", w.Code, body)
		}
		if got := b.status(t, key); got != once.StatusAwaitingApproval {
			t.Fatalf("a refused rejection left the action %s", got)
		}
		form.Set("note", "the amount is 100 times the invoice")
		if w := b.serve(b.postForm("/actions/"+string(key)+"/reject", form, cookie)); w.Code != http.StatusSeeOther {
			t.Fatalf("reject: %d\n%s", w.Code, w.Body)
		}
		a, err := c.Get(ctx, key)
		if err != nil || a.Status != once.StatusFailed || a.ResolvedBy != "grace" || !strings.Contains(a.Error, "rejected by grace: the amount is 100 times") {
			t.Fatalf("after Reject: %s by %q (%q), %v", a.Status, a.ResolvedBy, a.Error, err)
		}
		_, err = once.Do(ctx, c, in, runs.Effect)
		if !errors.Is(err, once.ErrFailed) || !strings.Contains(err.Error(), "rejected by grace") || runs.N() != 0 {
			t.Errorf("Do after the rejection = %v (ran %d); want the rejection, nothing run", err, runs.N())
		}
	})
}

// TestApprovalFormRefusedAfterAnotherDecided: a form loaded before
// someone else decided is refused with a 409 that names who decided
// first, shown on the page, and changes nothing; so is one whose attempt
// or payload is not the action's.
func TestApprovalFormRefusedAfterAnotherDecided(t *testing.T) {
	t.Parallel()
	gatedStores(t, consoletest.Gated(0), func(t *testing.T, c *once.Client) {
		ctx := context.Background()
		var runs consoletest.Runs
		key := consoletest.Await(t, c, consoletest.Transfer(0, "DE89370400440532013000", 120_000), &runs)
		b := gatedBundle(t, c, mounts[0])
		cookie, token, attempt, fp := b.approvalForm(t, key)
		post := func(verb string, v url.Values) *httptest.ResponseRecorder {
			v.Set("csrf", token)
			return b.serve(b.postForm("/actions/"+string(key)+"/"+verb, v, cookie))
		}
		for _, tt := range []struct {
			name, attempt, fingerprint, want string
		}{
			{"another payload", attempt, strings.Repeat("0", 64), "holds another payload than the one decided on"},
			{"another attempt", "2", fp, "decided on attempt 2"},
		} {
			w := post("approve", url.Values{"attempt": {tt.attempt}, "fingerprint": {tt.fingerprint}})
			if body := w.Body.String(); w.Code != http.StatusConflict || !strings.Contains(body, tt.want) || !strings.Contains(body, `class="error"`) {
				t.Errorf("%s: %d, want 409 saying %q\n%s", tt.name, w.Code, tt.want, body)
			}
		}
		if got := b.status(t, key); got != once.StatusAwaitingApproval {
			t.Fatalf("refused approvals left the action %s", got)
		}
		if _, err := c.Approve(ctx, key, once.Approval{By: "ada", Note: "looks right", Attempt: 1, Via: "cli"}); err != nil {
			t.Fatal(err)
		}
		w := post("reject", url.Values{"attempt": {attempt}, "fingerprint": {fp}, "by": {"grace"}, "note": {"too much"}})
		body := w.Body.String()
		if w.Code != http.StatusConflict || !strings.Contains(body, "was approved by ada at") || !strings.Contains(body, `class="error"`) {
			t.Errorf("reject after ada approved: %d, want 409 naming ada\n%s", w.Code, body)
		}
		if strings.Contains(body, `formaction="`) {
			t.Errorf("the page after the refusal still offers a decision on an approved action")
		}
		if a, _ := c.Get(ctx, key); a.Status != once.StatusApproved || a.ResolvedBy != "ada" {
			t.Errorf("the refused rejection changed the action: %s by %q", a.Status, a.ResolvedBy)
		}
		events, err := c.Events(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if last := events[len(events)-1]; last.Type != once.EventRefused || last.Actor != "grace" {
			t.Errorf("the trail's last event: %+v; want grace's refused rejection", last)
		}
	})
}

// TestApprovalRefusedAfterExpiry: once the wait expired (by the
// database's clock), the queue and the action page mark it and offer no
// decision, and a form loaded before, or the API, is refused with a 409
// saying the wait expired.
func TestApprovalRefusedAfterExpiry(t *testing.T) {
	t.Parallel()
	gatedStores(t, consoletest.Gated(time.Second), func(t *testing.T, c *once.Client) {
		var runs consoletest.Runs
		key := consoletest.Await(t, c, consoletest.Transfer(0, "DE89370400440532013000", 120_000), &runs)
		b := gatedBundle(t, c, mounts[0])
		cookie, token, attempt, fp := b.approvalForm(t, key)
		awaitExpiry(t, c, key)

		w := b.serve(b.postForm("/actions/"+string(key)+"/approve", url.Values{"csrf": {token}, "attempt": {attempt}, "fingerprint": {fp}, "by": {"ada"}}, cookie))
		if body := w.Body.String(); w.Code != http.StatusConflict || !strings.Contains(body, "its wait expired") {
			t.Errorf("approve after the expiry: %d, want 409 saying the wait expired\n%s", w.Code, body)
		}
		var e apiError
		if code := b.apiCall(t, "POST", "/api/actions/"+string(key)+"/reject", `{"note":"late","by":"grace"}`, &e); code != http.StatusConflict ||
			!strings.Contains(e.Error, "expired") || e.Action == nil || e.Action.Status != "awaiting_approval" {
			t.Errorf("API reject after the expiry: %d %+v, want 409 saying it expired", code, e)
		}
		page := b.get("/actions/" + string(key)).Body.String()
		if !strings.Contains(page, "its wait expired") || strings.Contains(page, `formaction="`) {
			t.Errorf("the action page of an expired wait does not say so, or offers a decision:\n%s", page)
		}
		queue := b.get("/approvals").Body.String()
		if !strings.Contains(queue, `class="expired"`) || !strings.Contains(queue, "1 of them expired") || !strings.Contains(queue, "records it failed") {
			t.Errorf("the queue does not mark the expired wait:\n%s", queue)
		}
		if got := b.status(t, key); got != once.StatusAwaitingApproval || runs.N() != 0 {
			t.Errorf("after refused decisions the action is %s (ran %d)", got, runs.N())
		}
	})
}

// TestApprovalHostileInput: every field of the form and of the API is
// bounded and checked before anything is written, and each refusal
// names what was wrong: a huge note, a NUL, bytes that are not UTF-8, a
// bad attempt or fingerprint, a body over the bound, a cross-site post.
func TestApprovalHostileInput(t *testing.T) {
	t.Parallel()
	c, _ := testdb.SQLiteClient(t, consoletest.Gated(0))
	var runs consoletest.Runs
	key := consoletest.Await(t, c, consoletest.Transfer(0, "DE89370400440532013000", 120_000), &runs)
	b := gatedBundle(t, c, mounts[0])
	cookie, token, attempt, fp := b.approvalForm(t, key)
	for _, tt := range []struct {
		name string
		verb string
		form url.Values
		code int
		want string
	}{
		{"huge note", "approve", url.Values{"note": {strings.Repeat("n", 5000)}}, 400, "Note is 5000 bytes, over the limit of 4096"},
		{"NUL in the note", "reject", url.Values{"note": {"fine\x00"}}, 400, "Note contains a NUL byte"},
		{"note not UTF-8", "reject", url.Values{"note": {"\xff\xfe"}}, 400, "Note is not valid UTF-8"},
		{"huge name", "approve", url.Values{"by": {strings.Repeat("b", 5000)}}, 400, "By is 5000 bytes"},
		{"attempt not a number", "approve", url.Values{"attempt": {"one"}}, 400, "attempt is not a number"},
		{"attempt below one", "approve", url.Values{"attempt": {"-1"}}, 400, "attempt is not a number"},
		{"attempt too large", "approve", url.Values{"attempt": {"99999999999999999999"}}, 400, "attempt is not a number"},
		{"fingerprint with a space", "approve", url.Values{"fingerprint": {"a b"}}, 400, "Fingerprint is not a fingerprint"},
		{"fingerprint too long", "approve", url.Values{"fingerprint": {strings.Repeat("f", 200)}}, 400, "Fingerprint is not a fingerprint"},
		{"no such action", "approve", url.Values{}, 404, "No action has the key"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			v := url.Values{"csrf": {token}, "attempt": {attempt}, "fingerprint": {fp}, "note": {"n"}}
			for k, vs := range tt.form {
				v[k] = vs
			}
			k := key
			if tt.code == 404 {
				k = once.Key(strings.Repeat("f", 64))
			}
			w := b.serve(b.postForm("/actions/"+string(k)+"/"+tt.verb, v, cookie))
			if body := w.Body.String(); w.Code != tt.code || !strings.Contains(body, tt.want) {
				t.Errorf("%d, want %d saying %q\n%.2000s", w.Code, tt.code, tt.want, body)
			}
		})
	}
	// Without the CSRF token, or from another site: 403.
	valid := url.Values{"csrf": {token}, "attempt": {attempt}, "fingerprint": {fp}}
	if w := b.serve(b.postForm("/actions/"+string(key)+"/approve", url.Values{"attempt": {attempt}}, cookie)); w.Code != http.StatusForbidden {
		t.Errorf("approve without the CSRF token: %d, want 403", w.Code)
	}
	r := b.postForm("/actions/"+string(key)+"/approve", valid, cookie)
	r.Header.Set("Origin", "https://evil.example")
	if w := b.serve(r); w.Code != http.StatusForbidden {
		t.Errorf("approve from a foreign Origin: %d, want 403", w.Code)
	}
	// A body over the bound is not read, over real HTTP.
	srv := httptest.NewServer(b.h)
	defer srv.Close()
	huge := strings.Repeat("x", 4<<20)
	valid.Set("note", huge)
	resp, err := http.Post(srv.URL+"/actions/"+string(key)+"/approve", "application/x-www-form-urlencoded", strings.NewReader(valid.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(page), "could not be read") {
		t.Errorf("approve with a %d-byte form: %d, want 400 saying the form could not be read", len(huge), resp.StatusCode)
	}

	// The API, likewise.
	approve := "/api/actions/" + string(key) + "/approve"
	for _, tt := range []struct {
		body  string
		code  int
		field string
		want  string
	}{
		{`{"note":"` + strings.Repeat("n", 5000) + `"}`, 400, "note", "Note is 5000 bytes"},
		{`{"note":"a\u0000b"}`, 400, "note", "NUL"},
		{`{"attempt":-1}`, 400, "attempt", "Attempt is -1"},
		{`{"attempt":"1"}`, 400, "", "not a decision"},
		{`{"fingerprint":"a b"}`, 400, "fingerprint", "not a fingerprint"},
		{`{"decision":"approve"}`, 400, "", "unknown field"},
		{`{} {}`, 400, "", "after the decision"},
		{`[]`, 400, "", "not a decision"},
	} {
		var e struct {
			Error string `json:"error"`
			Field string `json:"field"`
		}
		if code := b.apiCall(t, "POST", approve, tt.body, &e); code != tt.code || e.Field != tt.field || !strings.Contains(e.Error, tt.want) {
			t.Errorf("API approve %.60s: %d %q (field %q), want %d %q (field %q)", tt.body, code, e.Error, e.Field, tt.code, tt.want, tt.field)
		}
	}
	r = httptest.NewRequest("POST", approve, strings.NewReader("note=n"))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if w := b.serve(r); w.Code != http.StatusUnsupportedMediaType {
		t.Errorf("form-encoded API approve: %d, want 415", w.Code)
	}
	resp, err = http.Post(srv.URL+approve, "application/json", strings.NewReader(`{"note":"`+huge+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("API approve with a 4 MiB note: %d, want 413", resp.StatusCode)
	}
	if got := b.status(t, key); got != once.StatusAwaitingApproval || runs.N() != 0 {
		t.Errorf("after the hostile input the action is %s (ran %d), want it still awaiting", got, runs.N())
	}
}

// TestApprovalAPI: /api/approvals lists the queue with what a script
// needs to decide (the payload, bounded; the fingerprint and attempt to
// fence with; who asked; the wait), a page at a time; POST approve and
// reject decide, fenced as the form is, via "api"; a second decision is
// a 409 naming who decided first, a missing note a 400 naming the field,
// an unknown key a 404.
func TestApprovalAPI(t *testing.T) {
	t.Parallel()
	gatedStores(t, consoletest.Gated(0), func(t *testing.T, c *once.Client) {
		ctx := context.Background()
		var runs consoletest.Runs
		k1 := consoletest.Await(t, c, consoletest.Transfer(0, "DE89370400440532013000", 120_000), &runs)
		k2 := consoletest.Await(t, c, consoletest.Transfer(1, "NL91ABNA0417164300", 5), &runs)
		b := gatedBundle(t, c, mounts[1])

		type approvalJSON struct {
			apiAction
			Fingerprint string    `json:"fingerprint"`
			PayloadCut  int       `json:"payload_cut"`
			Origin      string    `json:"origin"`
			Since       time.Time `json:"since"`
			ExpiresAt   time.Time `json:"expires_at"`
			Expired     bool      `json:"expired"`
			OnExpiry    string    `json:"on_expiry"`
		}
		var list struct {
			Approvals []approvalJSON `json:"approvals"`
			Total     int            `json:"total"`
			Next      string         `json:"next"`
		}
		if code := b.apiCall(t, "GET", "/api/approvals", "", &list); code != 200 || list.Total != 2 || len(list.Approvals) != 2 || list.Next != "" {
			t.Fatalf("GET /api/approvals: %d, %d of %d, next %q", code, len(list.Approvals), list.Total, list.Next)
		}
		want, err := c.List(ctx, once.Filter{Status: once.StatusAwaitingApproval, OldestFirst: true})
		if err != nil || len(want) != 2 {
			t.Fatalf("setup: %d awaiting, %v", len(want), err)
		}
		if list.Approvals[0].Key != string(want[0].Key) || list.Approvals[1].Key != string(want[1].Key) {
			t.Errorf("GET /api/approvals lists %s, %s; want the oldest first", list.Approvals[0].Key, list.Approvals[1].Key)
		}
		i := slices.IndexFunc(list.Approvals, func(a approvalJSON) bool { return a.Key == string(k1) })
		if i < 0 {
			t.Fatalf("GET /api/approvals does not list %s", k1)
		}
		first := list.Approvals[i]
		a1, _ := c.Get(ctx, k1)
		if first.Key != string(k1) || first.Status != "awaiting_approval" || first.Kind != consoletest.GatedKind || first.Target != "DE89370400440532013000" ||
			!strings.Contains(compact(t, first.Payload), `"cents":120000`) || first.Fingerprint != string(a1.Fingerprint) || first.Attempt != 1 ||
			first.Origin != c.Origin() || first.Expired || first.OnExpiry != "failed" || !first.ExpiresAt.Equal(a1.LeaseUntil) ||
			first.ExpiresAt.Sub(first.Since) < 23*time.Hour {
			t.Errorf("the first approval: %+v", first)
		}
		if code := b.apiCall(t, "GET", "/api/approvals?limit=1", "", &list); code != 200 || len(list.Approvals) != 1 || list.Next == "" {
			t.Fatalf("a page of one: %d, %d, next %q", code, len(list.Approvals), list.Next)
		}
		after := list.Next
		list.Next = ""
		if code := b.apiCall(t, "GET", "/api/approvals?limit=1&after="+url.QueryEscape(after), "", &list); code != 200 || len(list.Approvals) != 1 ||
			list.Approvals[0].Key != string(want[1].Key) || list.Next != "" {
			t.Errorf("the page after: %d, %+v, next %q", code, list.Approvals, list.Next)
		}
		var e struct {
			Error  string     `json:"error"`
			Field  string     `json:"field"`
			Action *apiAction `json:"action"`
		}
		for _, q := range []string{"limit=0", "limit=201", "after=nope"} {
			if code := b.apiCall(t, "GET", "/api/approvals?"+q, "", &e); code != 400 || e.Error == "" {
				t.Errorf("GET /api/approvals?%s: %d %q, want 400", q, code, e.Error)
			}
		}

		// A decision on another wait of the same key (one before a purge)
		// is refused; a since that is no time is refused before any I/O.
		stale := fmt.Sprintf(`{"by":"ada","attempt":1,"fingerprint":%q,"since":"2001-02-03T04:05:06Z"}`, a1.Fingerprint)
		if code := b.apiCall(t, "POST", "/api/actions/"+string(k1)+"/approve", stale, &e); code != 409 || !strings.Contains(e.Error, "began waiting at") {
			t.Errorf("API approve of another wait: %d %q, want 409 saying when this one began", code, e.Error)
		}
		e.Field = ""
		if code := b.apiCall(t, "POST", "/api/actions/"+string(k1)+"/approve", `{"by":"ada","since":"yesterday"}`, &e); code != 400 || e.Field != "since" {
			t.Errorf("API approve with a since that is no time: %d %+v, want 400 naming since", code, e)
		}
		var a apiAction
		body := fmt.Sprintf(`{"note":"checked with the customer","by":"ada","attempt":1,"fingerprint":%q,"since":%q}`, a1.Fingerprint,
			a1.CreatedAt.UTC().Format(time.RFC3339Nano))
		if code := b.apiCall(t, "POST", "/api/actions/"+string(k1)+"/approve", body, &a); code != 200 || a.Status != "approved" || a.ResolvedBy != "ada" {
			t.Fatalf("API approve: %d %+v", code, a)
		}
		events, _ := c.Events(ctx, k1)
		if last := events[len(events)-1]; last.Type != once.EventApproved || !strings.Contains(last.Note, "approved via api") {
			t.Errorf("the trail's last event: %+v; want approved via api", last)
		}
		if code := b.apiCall(t, "POST", "/api/actions/"+string(k1)+"/reject", `{"note":"no","by":"grace"}`, &e); code != 409 ||
			!strings.Contains(e.Error, "approved by ada") || e.Action == nil || e.Action.Status != "approved" {
			t.Errorf("API reject after ada approved: %d %+v, want 409 naming ada", code, e)
		}
		e.Field = ""
		if code := b.apiCall(t, "POST", "/api/actions/"+string(k2)+"/reject", `{"by":"grace"}`, &e); code != 400 || e.Field != "note" || !strings.Contains(e.Error, "Note is empty") {
			t.Errorf("API reject without a note: %d %+v, want 400 naming the note", code, e)
		}
		if code := b.apiCall(t, "POST", "/api/actions/"+string(k2)+"/reject", `{"note":"wrong account","by":"grace","attempt":1}`, &a); code != 200 ||
			a.Status != "failed" || !strings.Contains(a.Error, "rejected by grace: wrong account") {
			t.Errorf("API reject: %d %+v", code, a)
		}
		if code := b.apiCall(t, "POST", "/api/actions/"+strings.Repeat("e", 64)+"/approve", `{}`, &e); code != 404 || !strings.Contains(e.Error, "no action has the key") {
			t.Errorf("API approve of no action: %d %q, want 404", code, e.Error)
		}
		if code := b.apiCall(t, "GET", "/api/approvals", "", &list); code != 200 || list.Total != 0 || len(list.Approvals) != 0 {
			t.Errorf("the queue after both decisions: %d, %d of %d", code, len(list.Approvals), list.Total)
		}
		if _, err := once.Do(ctx, c, consoletest.Transfer(0, "DE89370400440532013000", 120_000), runs.Effect); err != nil || runs.N() != 1 {
			t.Errorf("Do after the API approval = %v (ran %d); want it run once", err, runs.N())
		}
	})
}
