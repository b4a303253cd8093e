package cli

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/view"
	"github.com/oncehq/once/webhook"
)

// hookConfig is what serve's flags say of the approval webhook; a zero
// url turns it off.
type hookConfig struct {
	url     string
	secret  []byte
	console string
}

// hookTiming bounds the webhook: how often the approval queue is read,
// how long one request may take, how retries back off and when they
// stop, how many notices are held in memory and how many requests are
// in flight at once.
type hookTiming struct {
	poll, timeout, backoff, maxBackoff time.Duration
	attempts, pending, posting         int
}

// webhookTiming is the webhook's. Ten seconds is long for a receiver
// that only records a notice; eight tries backing off from 2 s to at
// most 5 min span about 9 minutes. A thousand notices waiting for a
// dead receiver hold a thousand small bodies; four requests at once keep
// a slow one from being opened a connection per notice.
var webhookTiming = hookTiming{
	poll: 5 * time.Second, timeout: 10 * time.Second, backoff: 2 * time.Second, maxBackoff: 5 * time.Minute,
	attempts: 8, pending: 1000, posting: 4,
}

// Bounds of what the webhook reads and sends.
const (
	// hookPage is how many waiting actions one read of the queue lists,
	// and hookPages how many reads one poll makes at most: a queue of
	// people's decisions longer than 10,000 is read in part, oldest
	// first, and the rest at later polls as the oldest are decided.
	hookPage  = 500
	hookPages = 20
	// hookPreview is how much of a payload a notice carries; the
	// console shows it whole.
	hookPreview = 1024
	// maxSecret bounds the secret file read.
	maxSecret = 4096
	// maxHookURL bounds the receiver's and the console's URLs.
	maxHookURL = 2048
)

// parseHookURL checks a URL the webhook uses: what, the flag's name;
// base, that it is the console's address, without a query.
func parseHookURL(flag, raw string, base bool) (*url.URL, error) {
	if len(raw) > maxHookURL {
		return nil, usagef("--%s is %d bytes, over the limit of %d", flag, len(raw), maxHookURL)
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return nil, usagef("--%s is not a URL (%v)", flag, err)
	case u.Scheme != "http" && u.Scheme != "https" || u.Host == "":
		return nil, usagef("--%s %q is not an http:// or https:// URL with a host", flag, raw)
	case u.User != nil:
		return nil, usagef("--%s carries a user name or password, which anyone who lists processes sees; the receiver checks the signature instead", flag)
	case u.Fragment != "" || base && u.RawQuery != "":
		return nil, usagef("--%s %q has a query or fragment; give the address only", flag, raw)
	}
	return u, nil
}

// readSecret reads the webhook's secret from file, or, with no file,
// from $ONCE_WEBHOOK_SECRET: never from a flag's value, which every user
// of the machine sees in the process list. A file others may read is
// used, with a warning: a mounted secret often is.
func readSecret(file string, log func(string)) ([]byte, error) {
	var b []byte
	from := "$ONCE_WEBHOOK_SECRET"
	if file != "" {
		from = "--approval-webhook-secret-file " + file
		f, err := os.Open(file)
		if err != nil {
			return nil, usagef("--approval-webhook-secret-file: %v", err)
		}
		defer f.Close()
		if fi, err := f.Stat(); err == nil && fi.Mode().Perm()&0o077 != 0 {
			log(fmt.Sprintf("%s may be read by other users (mode %v); chmod 600 it", file, fi.Mode().Perm()))
		}
		if b, err = io.ReadAll(io.LimitReader(f, maxSecret+1)); err != nil {
			return nil, usagef("--approval-webhook-secret-file: %v", err)
		}
	} else {
		b = []byte(os.Getenv("ONCE_WEBHOOK_SECRET"))
	}
	// A file written by echo ends in a newline that is no part of it.
	b = bytes.TrimSpace(b)
	switch {
	case len(b) == 0:
		return nil, usagef("--approval-webhook needs a signing secret: put it in $ONCE_WEBHOOK_SECRET or in a file named by --approval-webhook-secret-file (openssl rand -hex 32 makes one)")
	case len(b) > maxSecret:
		return nil, usagef("%s is over %d bytes; a secret is 32 to 64 characters", from, maxSecret)
	case len(b) < minToken:
		return nil, usagef("%s is %d bytes; a webhook secret must be at least %d (openssl rand -hex 32 makes one)", from, len(b), minToken)
	}
	return b, nil
}

// approvalHook is serve's approval webhook. It reads the approval queue
// every poll and POSTs each action that newly waits, once per process,
// signed (package webhook); a failed POST is retried with backoff.
//
// It runs beside the console and the reaper, never in their way: it
// reads the queue with a bounded query of its own, each request has a
// timeout, each notice waits for its retries in a goroutine of its own,
// and the notices held are capped. A notice that finds no room is not
// taken, and is taken at a later poll.
type approvalHook struct {
	client  *once.Client
	url     string
	secret  []byte
	console string
	log     *slog.Logger
	http    *http.Client
	timing  hookTiming
	// pending holds a token per notice in memory; posting one per
	// request in flight.
	pending, posting chan struct{}
	wg               sync.WaitGroup

	mu sync.Mutex
	// sent holds the IDs of the notices this process took on: sent,
	// being sent, or given up on. A poll that read the whole queue
	// forgets those no longer in it, so it stays the queue's size.
	sent map[string]bool
	// full says the last poll left notices for lack of room, so that
	// it is logged once, not each poll.
	full bool
}

func newApprovalHook(c *once.Client, cfg hookConfig, log *slog.Logger) *approvalHook {
	t := webhookTiming
	return &approvalHook{
		client: c, url: cfg.url, secret: cfg.secret, console: strings.TrimSuffix(cfg.console, "/"), log: log, timing: t,
		http: &http.Client{
			Timeout: t.timeout,
			// A receiver that redirects is answered as one that refused:
			// a signed body is not sent on to wherever it points.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		pending: make(chan struct{}, t.pending),
		posting: make(chan struct{}, t.posting),
		sent:    map[string]bool{},
	}
}

// receiver names the receiver for the log: scheme and host, for its
// path may hold a token of its own.
func (h *approvalHook) receiver() string {
	u, err := url.Parse(h.url)
	if err != nil {
		return "the receiver"
	}
	return u.Scheme + "://" + u.Host + "/…"
}

// run polls until ctx ends, then waits for the notices in flight, which
// end with ctx.
func (h *approvalHook) run(ctx context.Context) {
	defer h.wg.Wait()
	tick := time.NewTicker(h.timing.poll)
	defer tick.Stop()
	for {
		if err := h.poll(ctx); err != nil && ctx.Err() == nil {
			h.log.Warn("once serve: approval webhook: cannot read the approval queue; trying again at the next poll", "err", oneLine(err))
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func oneLine(err error) string { return safe(strings.Join(strings.Fields(err.Error()), " ")) }

// deliveryID names the notice of a's wait: its key and attempt, and when
// the wait began, so that a key purged and claimed again, which waits
// at attempt 1 again, is a new notice.
func deliveryID(a once.Action) string {
	return fmt.Sprintf("%s-%d-%d", a.Key, a.Attempt, a.CreatedAt.UnixMicro())
}

// poll reads the approval queue, oldest first, and takes on a notice
// for each action whose wait this process has not announced.
func (h *approvalHook) poll(ctx context.Context) error {
	seen := map[string]bool{}
	var since time.Time
	whole, full := false, false
	for range hookPages {
		lctx, cancel := context.WithTimeout(ctx, h.timing.timeout)
		// Brief: a payload may be a mebibyte; the notice reads its own.
		acts, err := h.client.List(lctx, once.Filter{Status: once.StatusAwaitingApproval, OldestFirst: true, Brief: true, Since: since, Limit: hookPage})
		cancel()
		if err != nil {
			return err
		}
		now := time.Now()
		for _, a := range acts {
			id := deliveryID(a)
			seen[id] = true
			// An expired wait takes no answer: nobody is asked.
			if !a.LeaseUntil.After(now) || h.taken(id) {
				continue
			}
			if !h.take(ctx, a.Key, id) {
				full = true
			}
		}
		if len(acts) < hookPage {
			whole = true
			break
		}
		// The next page starts at the last one's time; the actions of
		// that instant come again and are skipped as seen.
		last := acts[len(acts)-1].UpdatedAt
		if !last.After(since) {
			h.log.Warn("once serve: approval webhook: more actions than a page were updated at one instant; the rest are read as the queue shrinks", "at", last)
			break
		}
		since = last
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if whole {
		for id := range h.sent {
			if !seen[id] {
				delete(h.sent, id)
			}
		}
	}
	if full && !h.full {
		h.log.Warn("once serve: approval webhook: notices are waiting for the receiver; the rest are sent as they leave room", "held", h.timing.pending, "receiver", h.receiver())
	}
	h.full = full
	return nil
}

func (h *approvalHook) taken(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sent[id]
}

// take starts the notice id of key's wait, unless the notices held fill
// the cap.
func (h *approvalHook) take(ctx context.Context, key once.Key, id string) bool {
	select {
	case h.pending <- struct{}{}:
	default:
		return false
	}
	h.mu.Lock()
	h.sent[id] = true
	h.mu.Unlock()
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		defer func() { <-h.pending }()
		if !h.deliver(ctx, key, id) {
			// Not begun (the row could not be read): a later poll
			// takes it again.
			h.mu.Lock()
			delete(h.sent, id)
			h.mu.Unlock()
		}
	}()
	return true
}

// body reads key's row and makes its notice; ok is false when the row
// no longer waits for approval (decided, expired or gone) or is not the
// wait id names.
func (h *approvalHook) body(ctx context.Context, key once.Key, id string) (body []byte, ok bool, err error) {
	gctx, cancel := context.WithTimeout(ctx, h.timing.timeout)
	a, err := h.client.Get(gctx, key)
	cancel()
	if errors.Is(err, once.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	if a.Status != once.StatusAwaitingApproval || deliveryID(a) != id || !a.LeaseUntil.After(time.Now()) {
		return nil, false, nil
	}
	v := view.CutPayload(view.FromAction(a, nil), a, hookPreview)
	d := webhook.Delivery{
		ID: id, Type: webhook.TypeAwaitingApproval, Key: string(a.Key), Kind: a.Kind, Target: a.Target, Run: a.Run, Step: a.Step,
		Attempt: a.Attempt, Fingerprint: string(a.Fingerprint), Since: a.CreatedAt.UTC(), Expires: a.LeaseUntil.UTC(), OnExpiry: string(cmp.Or(a.OnExpiry, once.StatusFailed)),
		Payload: v.Payload, PayloadText: v.PayloadText, PayloadBase64: v.PayloadBase64, PayloadCut: v.PayloadCut,
	}
	if h.console != "" {
		d.URL = h.console + "/actions/" + string(a.Key)
	}
	body, err = json.Marshal(d)
	return body, err == nil, err
}

// deliver sends the notice id of key's wait until the receiver takes
// it, refuses it, the tries run out, the action stops waiting, or ctx
// ends. It reports false when the row could not be read to begin.
func (h *approvalHook) deliver(ctx context.Context, key once.Key, id string) bool {
	backoff := h.timing.backoff
	var body []byte
	for try := 1; ; try++ {
		// A slot for the read and the request: a thousand notices taken
		// at once use a few of the database's connections, not all.
		select {
		case h.posting <- struct{}{}:
		case <-ctx.Done():
			return true
		}
		// Read again at each try: a decision taken meanwhile makes the
		// notice moot. A read that fails sends the body read before.
		b, ok, err := h.body(ctx, key, id)
		switch {
		case err == nil && !ok:
			<-h.posting
			return true
		case err == nil:
			body = b
		case body == nil:
			<-h.posting
			if ctx.Err() == nil {
				h.log.Warn("once serve: approval webhook: cannot read the action; trying at the next poll", "key", key, "err", oneLine(err))
			}
			return false
		}
		code, after, err := h.post(ctx, body, id)
		<-h.posting
		switch {
		case ctx.Err() != nil:
			return true
		case err == nil && code/100 == 2:
			h.log.Info("once serve: approval webhook delivered", "key", key, "delivery", id, "tries", try)
			return true
		case err == nil && !retryable(code):
			h.log.Warn("once serve: approval webhook refused; not sent again", "key", key, "delivery", id, "answer", failure(code, nil), "hint", refusalHint(code), "receiver", h.receiver())
			return true
		case try >= h.timing.attempts:
			h.log.Warn("once serve: approval webhook: gave up; the action still waits in the console", "key", key, "delivery", id, "tries", try, "last", failure(code, err), "receiver", h.receiver())
			return true
		}
		wait := min(max(backoff, after), h.timing.maxBackoff)
		h.log.Info("once serve: approval webhook failed; trying again", "key", key, "delivery", id, "try", try, "in", wait, "last", failure(code, err))
		select {
		case <-ctx.Done():
			return true
		case <-time.After(wait):
		}
		backoff = min(2*backoff, h.timing.maxBackoff)
	}
}

// retryable says whether a receiver's answer code may change if asked
// again: a server error, a timeout or a rate limit. Any other answer
// (a redirect, a bad request, a signature refused) would come again.
func retryable(code int) bool {
	return code >= 500 || code == http.StatusRequestTimeout || code == http.StatusTooManyRequests
}

// refusalHint says what to check when the receiver refused.
func refusalHint(code int) string {
	switch {
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		return "check that the receiver verifies with the secret serve signs with"
	case code/100 == 3:
		return "the receiver redirects; give --approval-webhook the URL it redirects to"
	}
	return "the receiver's log says why"
}

func failure(code int, err error) string {
	if err != nil {
		return oneLine(err)
	}
	return strconv.Itoa(code) + " " + http.StatusText(code)
}

// post sends body once, signed now, and returns the receiver's answer
// code and how long its Retry-After asks to wait.
func (h *approvalHook) post(ctx context.Context, body []byte, id string) (int, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(body))
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "once-serve")
	req.Header.Set(webhook.DeliveryHeader, id)
	req.Header.Set(webhook.Header, webhook.Sign(h.secret, time.Now(), body))
	resp, err := h.http.Do(req)
	if err != nil {
		// The error quotes the URL, whose path may hold a token: say
		// only what went wrong.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			err = fmt.Errorf("no answer within %v", h.timing.timeout)
		}
		return 0, 0, err
	}
	defer resp.Body.Close()
	// Read a little, so the connection can be used again; no more, for
	// a receiver may answer without end.
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	// Capped before it is a duration: a receiver's number may be huge.
	after, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	return resp.StatusCode, time.Duration(min(max(after, 0), 3600)) * time.Second, nil
}
