package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/oncehq/once/idemhttp"
)

// The three kinds of effect, named as the workers' intents name them.
const (
	kindEmail  = "send_email"
	kindCharge = "charge_card"
	kindPost   = "post_message"
)

// kinds lists them in the order the report prints them; intent i is of
// kinds[i%3].
var kinds = []string{kindEmail, kindCharge, kindPost}

// kindOf is the kind of intent i.
func kindOf(i int) string { return kinds[i%len(kinds)] }

// pidHeader carries the worker's process id to the HTTP providers, so a
// planned fault can kill the very process whose effect was just applied.
const pidHeader = "X-Chaos-Pid"

// plan is what a provider does to the first application of an intent's
// effect, decided from the seed before the run starts.
type plan uint8

const (
	planNone plan = iota
	// planKill: SIGKILL the worker right after the effect was applied,
	// before it can record it.
	planKill
	// planTimeout: apply the effect, then hold the reply past the
	// worker's timeout: the ambiguous case.
	planTimeout
)

// tally counts what a provider really applied, per intent, and carries
// out the plans. It is shared by the three providers.
type tally struct {
	mu      sync.Mutex
	applied map[string][]int // kind → intent → times applied
	plans   []plan           // by intent
	used    []bool           // the plan of intent i was carried out
	// kill SIGKILLs a worker by pid and reports whether it was one.
	kill func(pid int) bool
	// onFault counts a fault that happened.
	onFault func(kind faultKind)
}

func newTally(intents int, plans []plan, kill func(int) bool, onFault func(faultKind)) *tally {
	t := &tally{applied: map[string][]int{}, plans: plans, used: make([]bool, intents), kill: kill, onFault: onFault}
	for _, k := range kinds {
		t.applied[k] = make([]int, intents)
	}
	return t
}

// apply counts one application of intent i's effect of kind and returns
// the plan to carry out now: a plan applies to the first application
// only.
func (t *tally) apply(kind string, i int) plan {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.applied[kind][i]++
	if t.used[i] || t.plans[i] == planNone {
		return planNone
	}
	t.used[i] = true
	return t.plans[i]
}

// count returns how many times intent i's effect was applied.
func (t *tally) count(kind string, i int) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	if i < 0 || i >= len(t.applied[kind]) {
		return 0
	}
	return t.applied[kind][i]
}

// afterApply carries out p for the worker with process id pid, once the
// effect was applied: a kill now, or a wait until the caller gave up (or
// hold passed) before the reply goes out.
func (t *tally) afterApply(ctx context.Context, p plan, pid int, hold time.Duration) {
	switch p {
	case planKill:
		if t.kill(pid) {
			t.onFault(faultKill)
		}
	case planTimeout:
		t.onFault(faultProviderTimeout)
		timer := time.NewTimer(hold)
		defer timer.Stop()
		select {
		case <-ctx.Done():
		case <-timer.C:
		}
	}
}

// payments is a payment provider's charge endpoint that honours
// Idempotency-Key as Stripe does: the first request with a key creates
// the charge and its response is stored; every later request with the
// key gets that response back, marked Idempotent-Replayed, and charges
// nothing. A request without a key charges every time. It counts the
// charges it made per intent.
type payments struct {
	t    *tally
	hold time.Duration

	mu      sync.Mutex
	byKey   map[string][]byte
	charges int
}

// chargeRequest is the body of POST /v1/charges.
type chargeRequest struct {
	Intent int   `json:"intent"`
	Amount int64 `json:"amount"`
}

func (p *payments) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/charges" {
		http.NotFound(w, r)
		return
	}
	var req chargeRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Intent < 0 || req.Intent >= len(p.t.used) || req.Amount <= 0 {
		http.Error(w, `{"error":"the body must be {\"intent\":N,\"amount\":cents} with a known intent"}`, http.StatusBadRequest)
		return
	}
	key := r.Header.Get(idemhttp.Header)
	// Applying and storing the response are one step, so a retry that
	// arrives while the first request's reply is held gets the replay.
	p.mu.Lock()
	if stored, ok := p.byKey[key]; ok && key != "" {
		p.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set(idemhttp.ReplayedHeader, "true")
		w.Write(stored)
		return
	}
	p.charges++
	body, _ := json.Marshal(map[string]any{"id": "ch_" + strconv.Itoa(p.charges), "object": "charge", "intent": req.Intent, "amount": req.Amount})
	if key != "" {
		p.byKey[key] = body
	}
	pl := p.t.apply(kindCharge, req.Intent)
	p.mu.Unlock()
	pid, _ := strconv.Atoi(r.Header.Get(pidHeader))
	p.t.afterApply(r.Context(), pl, pid, p.hold)
	w.Header().Set("Content-Type", "application/json")
	w.Write(body)
}

// posts is a provider that takes posts and can be asked whether a post
// with a given key landed: POST /v1/posts creates one every time (it
// honours no idempotency key), GET /v1/posts/{key} answers 200 with the
// post or 404. It counts the posts it made per intent.
type posts struct {
	t    *tally
	hold time.Duration

	mu    sync.Mutex
	byKey map[string]string
	n     int
}

// postRequest is the body of POST /v1/posts.
type postRequest struct {
	Key    string `json:"key"`
	Intent int    `json:"intent"`
	Text   string `json:"text"`
}

func (p *posts) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/posts/"):
		key := strings.TrimPrefix(r.URL.Path, "/v1/posts/")
		p.mu.Lock()
		id, ok := p.byKey[key]
		p.mu.Unlock()
		if !ok {
			http.Error(w, `{"error":"no post with that key"}`, http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]string{"id": id})
	case r.Method == http.MethodPost && r.URL.Path == "/v1/posts":
		var req postRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Intent < 0 || req.Intent >= len(p.t.used) || req.Key == "" {
			http.Error(w, `{"error":"the body must be {\"key\":K,\"intent\":N,\"text\":T} with a known intent"}`, http.StatusBadRequest)
			return
		}
		p.mu.Lock()
		p.n++
		id := "post_" + strconv.Itoa(p.n)
		if _, ok := p.byKey[req.Key]; !ok {
			p.byKey[req.Key] = id
		}
		pl := p.t.apply(kindPost, req.Intent)
		p.mu.Unlock()
		pid, _ := strconv.Atoi(r.Header.Get(pidHeader))
		p.t.afterApply(r.Context(), pl, pid, p.hold)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(map[string]string{"id": id})
	default:
		http.NotFound(w, r)
	}
}

// httpServer serves h on a free loopback port.
type httpServer struct {
	srv *http.Server
	ln  net.Listener
}

func serveHTTP(h http.Handler) (*httpServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("chaos: listening for a provider on loopback: %w", err)
	}
	s := &httpServer{srv: &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}, ln: ln}
	go s.srv.Serve(ln)
	return s, nil
}

// URL is the server's base URL.
func (s *httpServer) URL() string { return "http://" + s.ln.Addr().String() }

func (s *httpServer) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		err = s.srv.Close()
	}
	return err
}
