package protocol

import (
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/oncehq/once"
)

// Bounds of a carried policy: a lease a dead worker's claim holds for
// no longer than an hour, an effect of a day at most.
const (
	minCarried      = time.Second
	maxCarriedLease = time.Hour
	maxCarriedExec  = 24 * time.Hour
	maxCarriedKeep  = 366 * 24 * time.Hour
	// maxCarriers bounds the clients kept for carried policies: a
	// client of the protocol making up policies at random costs a
	// rebuilt map now and then, not memory.
	maxCarriers = 1024
)

// carriers are the once.Clients of carried policies, by kind and
// policy.
type carriers struct {
	mu sync.Mutex
	by map[string]*once.Client
}

// clientFor is the client that applies p (nil: none carried) to kind,
// or the problem with p.
func (s *Server) clientFor(kind string, p *Policy) (*once.Client, *Problem, int) {
	if p == nil || *p == (Policy{}) {
		return s.c, nil, 0
	}
	if s.c.Configured(kind) {
		// Checked before the bounds and the recovery: a kind pinned
		// verify_then_decide (or beyond the bounds) takes its own
		// policy carried.
		pinned := s.c.Policy(kind)
		if p.pins(pinned) {
			return s.c, nil, 0
		}
		if _, prob := p.policy(); prob != nil && p.Recovery != once.VerifyThenDecide.String() {
			return nil, prob, http.StatusBadRequest
		}
		return nil, &Problem{Code: "policy_pinned", Detail: fmt.Sprintf("kind %q is pinned by the server (lease %v, max execution %v, retention %v, recovery %v); the claim's policy differs: drop it, or make it the server's",
			kind, pinned.Lease, pinned.MaxExecution, pinned.Retention, pinned.Recovery)}, http.StatusConflict
	}
	pol, prob := p.policy()
	if prob != nil {
		return nil, prob, http.StatusBadRequest
	}
	id := fmt.Sprintf("%s\x00%d\x00%d\x00%d\x00%s", kind, p.LeaseMS, p.MaxExecutionMS, p.RetentionMS, p.Recovery)
	s.carriers.mu.Lock()
	defer s.carriers.mu.Unlock()
	if c, ok := s.carriers.by[id]; ok {
		return c, nil, 0
	}
	c, err := s.c.Carrying(kind, pol)
	if err != nil {
		return nil, &Problem{Code: "bad_request", Detail: "policy: " + err.Error()}, http.StatusBadRequest
	}
	if s.carriers.by == nil || len(s.carriers.by) >= maxCarriers {
		s.carriers.by = map[string]*once.Client{}
	}
	s.carriers.by[id] = c
	return c, nil, 0
}

// pins reports whether every field p gives is pinned's.
func (p Policy) pins(pinned once.KindPolicy) bool {
	same := func(ms int64, d time.Duration) bool { return ms == 0 || time.Duration(ms)*time.Millisecond == d }
	return same(p.LeaseMS, pinned.Lease) && same(p.MaxExecutionMS, pinned.MaxExecution) && same(p.RetentionMS, pinned.Retention) &&
		(p.Recovery == "" || p.Recovery == pinned.Recovery.String())
}

// policy is p as a once.KindPolicy, within the bounds.
func (p Policy) policy() (once.KindPolicy, *Problem) {
	var out once.KindPolicy
	for _, d := range []struct {
		name string
		ms   int64
		most time.Duration
		to   *time.Duration
	}{
		{"lease_ms", p.LeaseMS, maxCarriedLease, &out.Lease},
		{"max_execution_ms", p.MaxExecutionMS, maxCarriedExec, &out.MaxExecution},
		{"retention_ms", p.RetentionMS, maxCarriedKeep, &out.Retention},
	} {
		if d.ms == 0 {
			continue
		}
		v := time.Duration(d.ms) * time.Millisecond
		if d.ms < 0 || v < minCarried || v > d.most {
			return out, &Problem{Code: "bad_request", Detail: fmt.Sprintf("policy.%s is %d; it must be %d to %d, or left out for the server's", d.name, d.ms, minCarried.Milliseconds(), d.most.Milliseconds())}
		}
		*d.to = v
	}
	switch p.Recovery {
	case "":
	case once.AskPerson.String(), once.RetryWithProviderKey.String():
		out.Recovery = once.ParseRecovery(p.Recovery)
	case once.VerifyThenDecide.String():
		return out, &Problem{Code: "bad_request", Detail: `policy.recovery verify_then_decide needs a verifier the server knows: pin the kind in the server's kinds file with "verifier": "client", and run one`}
	default:
		return out, &Problem{Code: "bad_request", Detail: fmt.Sprintf("policy.recovery is %.40q; it is ask_person or retry_with_provider_key", p.Recovery)}
	}
	return out, nil
}
