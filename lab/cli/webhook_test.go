package cli_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/lab/cli"
	"github.com/oncehq/once/webhook"
)

const hookSecret = "whsec-test-0123456789abcdef"

// receiver is a real HTTP server on loopback that takes the approval
// webhook as a receiver should: it verifies each request's signature
// with webhook.Verify, and counts deliveries by ID. answer says what to
// reply to the n-th verified try of a delivery (n from 1); nil is 204.
type receiver struct {
	url    string
	answer func(d webhook.Delivery, n int) int
	// hang, if not nil, holds each request until it is closed or the
	// request ends.
	hang chan struct{}

	mu     sync.Mutex
	tries  map[string]int
	last   map[string]webhook.Delivery
	forged []string
}

func newReceiver(t *testing.T, answer func(webhook.Delivery, int) int, hang bool) *receiver {
	r := &receiver{answer: answer, tries: map[string]int{}, last: map[string]webhook.Delivery{}}
	if hang {
		r.hang = make(chan struct{})
	}
	srv := httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(srv.Close)
	if hang {
		// Before srv.Close, which waits for the requests it holds.
		t.Cleanup(func() { close(r.hang) })
	}
	r.url = srv.URL + "/hooks/once"
	return r
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, 1<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if err := webhook.Verify([]byte(hookSecret), req.Header.Get(webhook.Header), body, time.Now(), 0); err != nil {
		r.mu.Lock()
		r.forged = append(r.forged, err.Error())
		r.mu.Unlock()
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	var d webhook.Delivery
	if err := json.Unmarshal(body, &d); err != nil || d.ID == "" || req.Header.Get(webhook.DeliveryHeader) != d.ID || req.Method != http.MethodPost {
		r.mu.Lock()
		r.forged = append(r.forged, "not a delivery: "+string(body))
		r.mu.Unlock()
		http.Error(w, "not a delivery", http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	r.tries[d.ID]++
	n := r.tries[d.ID]
	r.last[d.ID] = d
	r.mu.Unlock()
	if r.hang != nil {
		select {
		case <-r.hang:
		case <-req.Context().Done():
		}
		return
	}
	code := http.StatusNoContent
	if r.answer != nil {
		code = r.answer(d, n)
	}
	w.WriteHeader(code)
}

// of returns how many verified tries of the delivery for key came, and
// the last one's body.
func (r *receiver) of(key once.Key) (int, webhook.Delivery) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, n := range r.tries {
		if strings.HasPrefix(id, string(key)+"-") {
			return n, r.last[id]
		}
	}
	return 0, webhook.Delivery{}
}

func (r *receiver) refused() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.forged...)
}

// secretFile writes the webhook's secret to a file only its owner reads.
func secretFile(t *testing.T) string {
	f := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(f, []byte(hookSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// fastWebhook makes the webhook poll every 100 ms, give a request
// timeout, and back off from 50 ms, for attempts tries.
func fastWebhook(t *testing.T, timeout time.Duration, attempts int) {
	t.Cleanup(cli.SetWebhookTiming(100*time.Millisecond, timeout, 50*time.Millisecond, attempts))
}

// TestWebhookDelivers: `once serve --approval-webhook` POSTs each action
// that waits for approval once, signed so that webhook.Verify takes it,
// with the action, a payload cut to a preview and the console's link;
// an action decided is not sent again; and after a restart, what still
// waits is sent again under the same delivery ID.
func TestWebhookDelivers(t *testing.T) {
	fastWebhook(t, 5*time.Second, 3)
	for name, newDB := range databases(t) {
		t.Run(name, func(t *testing.T) {
			db := newDB(t)
			mustRun(t, "migrate", "--db", db)
			rcv := newReceiver(t, nil, false)
			early := awaitApproval(t, db, time.Hour, charge("run-early", 0, map[string]int{"cents": 250_000}))
			args := []string{"--addr", "127.0.0.1:0", "--reap-every", "0", "--approval-webhook", rcv.url, "--approval-webhook-secret-file", secretFile(t), "--db", db}
			base, _, errOut, stop := startServe(t, args...)

			var d webhook.Delivery
			eventually(t, "the webhook of the action waiting before serve started", func() bool { n, _ := rcv.of(early.Key); return n > 0 })
			_, d = rcv.of(early.Key)
			if d.Type != webhook.TypeAwaitingApproval || d.Key != string(early.Key) || d.Kind != "charge_card" || d.Target != "acct-run-early" || d.Run != "run-early" ||
				d.Attempt != 1 || d.Fingerprint != string(early.Fingerprint) || !d.Expires.Equal(early.LeaseUntil) || !d.Since.Equal(early.CreatedAt) || d.OnExpiry != "failed" ||
				string(d.Payload) != `{"cents":250000}` || d.URL != base+"actions/"+string(early.Key) || !strings.HasPrefix(d.ID, string(early.Key)+"-1-") {
				t.Errorf("the delivery of %s: %+v", early.Key, d)
			}
			if code, page := get(t, d.URL); code != 200 || !strings.Contains(page, string(early.Key)) {
				t.Errorf("the delivery's link %s: %d", d.URL, code)
			}

			// Waiting while serve runs, with a payload past the preview.
			big := awaitApproval(t, db, time.Hour, charge("run-big", 0, map[string]string{"memo": strings.Repeat("x", 5000)}))
			eventually(t, "the webhook of an action waiting since serve started", func() bool { n, _ := rcv.of(big.Key); return n > 0 })
			if _, d := rcv.of(big.Key); d.Payload != nil || len(d.PayloadText) > 1024 || d.PayloadCut != 5011-len(d.PayloadText) || !strings.HasPrefix(d.PayloadText, `{"memo":"xxx`) {
				t.Errorf("a 5 KB payload is sent as %d bytes of JSON, %d of text, %d cut; want a preview of at most 1 KiB", len(d.Payload), len(d.PayloadText), d.PayloadCut)
			}
			// The polls that found big listed early again: it was sent
			// once all the same.
			if n, _ := rcv.of(early.Key); n != 1 {
				t.Errorf("%s was delivered %d times by one process; want once", early.Key, n)
			}
			mustRun(t, "approve", string(early.Key), "--by", "ada", "--db", db)
			if code := stop(); code != 0 {
				t.Fatalf("serve exited %d: %s", code, errOut)
			}

			// A restart knows nothing of what it sent: what still waits is
			// sent again, as the same delivery; the approved one is not.
			_, _, errOut, stop = startServe(t, args...)
			barrier := awaitApproval(t, db, time.Hour, charge("run-after", 0, nil))
			eventually(t, "the webhook after the restart", func() bool { n, _ := rcv.of(barrier.Key); return n > 0 })
			if n, _ := rcv.of(big.Key); n != 2 {
				t.Errorf("after a restart %s was delivered %d times in all; want twice, under one ID", big.Key, n)
			}
			if n, _ := rcv.of(early.Key); n != 1 {
				t.Errorf("after a restart the approved %s was delivered %d times in all; want once", early.Key, n)
			}
			if f := rcv.refused(); len(f) != 0 {
				t.Errorf("the receiver refused requests: %q", f)
			}
			if code := stop(); code != 0 {
				t.Fatalf("serve exited %d: %s", code, errOut)
			}
		})
	}
}

// TestWebhookRetries: a receiver that fails (503) is asked again with
// backoff until it takes the delivery, and then no more; one that fails
// every time is asked as often as the cap allows, and then no more; one
// that refuses (400) is not asked again.
func TestWebhookRetries(t *testing.T) {
	const attempts = 4
	fastWebhook(t, 5*time.Second, attempts)
	db := filepath.Join(t.TempDir(), "once.db")
	mustRun(t, "migrate", "--db", db)
	rcv := newReceiver(t, func(d webhook.Delivery, n int) int {
		switch {
		case d.Target == "acct-run-flaky" && n <= 2:
			return http.StatusServiceUnavailable
		case d.Target == "acct-run-dead":
			return http.StatusInternalServerError
		case d.Target == "acct-run-refuses":
			return http.StatusBadRequest
		}
		return http.StatusNoContent
	}, false)
	flaky := awaitApproval(t, db, time.Hour, charge("run-flaky", 0, nil))
	dead := awaitApproval(t, db, time.Hour, charge("run-dead", 0, nil))
	refuses := awaitApproval(t, db, time.Hour, charge("run-refuses", 0, nil))
	_, _, errOut, stop := startServe(t, "--addr", "127.0.0.1:0", "--reap-every", "0", "--approval-webhook", rcv.url, "--approval-webhook-secret-file", secretFile(t), "--db", db)

	eventually(t, "the flaky receiver to take it", func() bool {
		return strings.Contains(errOut.String(), `delivered" key=`+string(flaky.Key))
	})
	eventually(t, "giving up on the dead receiver", func() bool { return strings.Contains(errOut.String(), "gave up") })
	eventually(t, "the refusal", func() bool { return strings.Contains(errOut.String(), "refused") })
	barrier := awaitApproval(t, db, time.Hour, charge("run-after", 0, nil))
	eventually(t, "a later delivery", func() bool { n, _ := rcv.of(barrier.Key); return n > 0 })
	if code := stop(); code != 0 {
		t.Fatalf("serve exited %d: %s", code, errOut)
	}
	for _, c := range []struct {
		a    once.Action
		want int
	}{{flaky, 3}, {dead, attempts}, {refuses, 1}, {barrier, 1}} {
		if n, _ := rcv.of(c.a.Key); n != c.want {
			t.Errorf("%s: %d tries reached the receiver; want %d", c.a.Target, n, c.want)
		}
	}
	if !strings.Contains(errOut.String(), `last="503 Service Unavailable"`) || !strings.Contains(errOut.String(), `last="500 Internal Server Error"`) || !strings.Contains(errOut.String(), `answer="400 Bad Request"`) {
		t.Errorf("the log does not say what the receiver answered:\n%s", errOut)
	}
	if strings.Contains(errOut.String(), "/hooks/once") {
		t.Errorf("the log shows the receiver's path, which may hold a token:\n%s", errOut)
	}
}

// TestWebhookHungReceiver: a receiver that never answers holds up none
// of serve: /healthz and the console answer, a decision goes through,
// each request is cut at the timeout and tried again, and serve stops
// when asked.
func TestWebhookHungReceiver(t *testing.T) {
	fastWebhook(t, 300*time.Millisecond, 1000)
	db := filepath.Join(t.TempDir(), "once.db")
	mustRun(t, "migrate", "--db", db)
	rcv := newReceiver(t, nil, true)
	// More than the requests the webhook keeps in flight at once.
	var waiting []once.Action
	for i := range 10 {
		waiting = append(waiting, awaitApproval(t, db, time.Hour, charge("run-hung", int64(i), nil)))
	}
	base, _, errOut, stop := startServe(t, "--addr", "127.0.0.1:0", "--reap-every", "1s", "--approval-webhook", rcv.url, "--approval-webhook-secret-file", secretFile(t), "--db", db)
	eventually(t, "a request cut at the timeout and tried again", func() bool {
		n, _ := rcv.of(waiting[0].Key)
		return n >= 2
	})
	if code, body := get(t, base+"healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz while the receiver hangs: %d %q", code, body)
	}
	if code, page := get(t, base+"actions/"+string(waiting[1].Key)); code != 200 || !strings.Contains(page, string(waiting[1].Key)) {
		t.Errorf("the console while the receiver hangs: %d", code)
	}
	if out := mustRun(t, "approve", string(waiting[1].Key), "--by", "ada", "--db", db); !strings.Contains(out, "is now approved") {
		t.Errorf("approve while the receiver hangs: %q", out)
	}
	if !strings.Contains(errOut.String(), "no answer within 300ms") {
		t.Errorf("the log does not say the receiver did not answer:\n%s", errOut)
	}
	if code := stop(); code != 0 {
		t.Fatalf("serve exited %d: %s", code, errOut)
	}
}

// TestWebhookBadFlags: the webhook's flags are checked before anything
// is opened, each mistake one line saying what to give; the secret is
// never taken from a flag's value.
func TestWebhookBadFlags(t *testing.T) {
	t.Setenv("ONCE_WEBHOOK_SECRET", "")
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.db")
	short := filepath.Join(dir, "short")
	os.WriteFile(short, []byte("hunter2\n"), 0o600)
	huge := filepath.Join(dir, "huge")
	os.WriteFile(huge, []byte(strings.Repeat("s", 5000)), 0o600)
	good := secretFile(t)
	hook := "https://hooks.example.com/once"
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--approval-webhook", hook}, "needs a signing secret: put it in $ONCE_WEBHOOK_SECRET or in a file named by --approval-webhook-secret-file"},
		{[]string{"--approval-webhook", hook, "--approval-webhook-secret-file", short}, "is 7 bytes; a webhook secret must be at least 16"},
		{[]string{"--approval-webhook", hook, "--approval-webhook-secret-file", huge}, "is over 4096 bytes"},
		{[]string{"--approval-webhook", hook, "--approval-webhook-secret-file", filepath.Join(dir, "nope")}, "no such file"},
		{[]string{"--approval-webhook", "ftp://hooks.example.com/", "--approval-webhook-secret-file", good}, "is not an http:// or https:// URL with a host"},
		{[]string{"--approval-webhook", "hooks.example.com/once", "--approval-webhook-secret-file", good}, "is not an http:// or https:// URL"},
		{[]string{"--approval-webhook", "https://me:pw@hooks.example.com/", "--approval-webhook-secret-file", good}, "carries a user name or password"},
		{[]string{"--approval-webhook", hook + "#x", "--approval-webhook-secret-file", good}, "has a query or fragment"},
		{[]string{"--approval-webhook", hook + strings.Repeat("a", 3000), "--approval-webhook-secret-file", good}, "over the limit of 2048"},
		{[]string{"--approval-webhook", hook, "--approval-webhook-secret-file", good, "--public-url", "https://ops.example.com/?token=x"}, "--public-url \"https://ops.example.com/?token=x\" has a query"},
		{[]string{"--approval-webhook", hook, "--approval-webhook-secret-file", good, "--public-url", "/once"}, "--public-url \"/once\" is not an http:// or https:// URL"},
		{[]string{"--approval-webhook-secret-file", good}, "give --approval-webhook URL too"},
		{[]string{"--public-url", "https://ops.example.com"}, "--public-url is for the links the webhook sends; give --approval-webhook URL too"},
		{[]string{"--approval-webhook-secret", hookSecret}, "flag provided but not defined"},
	}
	for _, tc := range cases {
		code, out, errOut := run(t, append(append([]string{"serve"}, tc.args...), "--db", missing)...)
		if code == 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("once serve %q: exit %d, stderr %q, stdout %q; want an error containing %q", tc.args, code, errOut, out, tc.want)
		}
		if strings.Contains(errOut, hookSecret) {
			t.Errorf("once serve %q prints the secret: %q", tc.args, errOut)
		}
	}
	if _, err := os.Stat(missing); err == nil {
		t.Fatalf("a refused serve created %s", missing)
	}
	// The environment's secret is taken, and -h never prints it.
	t.Setenv("ONCE_WEBHOOK_SECRET", hookSecret)
	if code, _, errOut := run(t, "serve", "--approval-webhook", hook, "--db", missing); code == 0 || !strings.Contains(errOut, "no database at") {
		t.Errorf("serve with $ONCE_WEBHOOK_SECRET: exit %d, %q; want it past the flags, to the database", code, errOut)
	}
	if _, help, _ := run(t, "serve", "-h"); strings.Contains(help, hookSecret) {
		t.Errorf("once serve -h prints $ONCE_WEBHOOK_SECRET")
	}
	// A secret file others may read is used, with a warning.
	open := filepath.Join(dir, "open")
	os.WriteFile(open, []byte(hookSecret), 0o644)
	os.Chmod(open, 0o644)
	if _, _, errOut := run(t, "serve", "--approval-webhook", hook, "--approval-webhook-secret-file", open, "--db", missing); !strings.Contains(errOut, "may be read by other users") || !strings.Contains(errOut, "no database at") {
		t.Errorf("a secret file readable by all: %q", errOut)
	}
}
