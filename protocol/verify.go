package protocol

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/oncehq/once"
)

// Verifiers lets a client of the protocol be the Verifier of its kinds:
// a process in Python or TypeScript that can ask the provider whether an
// effect landed. Its Verifier is what the server's once.Client is given
// for such a kind (KindPolicy.Verifier): when recovery asks it about a
// dead claim, the question waits here, under recovery's hold on the
// action, until a client takes it (POST /v1/verify/take) and answers
// (POST /v1/verify/answer). Nothing else decides the action meanwhile.
// A question nobody answers within the kind's MaxExecution is a verifier
// that could not tell: the action is asked again after VerifyBackoff,
// and goes to review after MaxVerifyFailures, as with a Go verifier.
//
// A question no client takes within TakeWithin is given up on the same
// way, sooner: the recoverer (the reaper's pass, which decides one
// action at a time) goes on to the other kinds' actions instead of
// waiting the kind's MaxExecution for a client that is not there. From
// then until a client takes questions of the kind again, its questions
// are given up on at once. Questions live in this server's memory: with
// several servers on one store, a server with no client verifier of a
// kind gives its questions up so, and a server with one asks them
// (docs/protocol.md).
type Verifiers struct {
	mu      sync.Mutex
	waiting map[string][]*question // by kind, not yet taken, oldest first
	byID    map[string]*question   // every question not yet answered
	queued  int
	// changed is closed, and replaced, when a question is queued.
	changed chan struct{}
	// answered remembers the answers given lately, by question, so an
	// answer sent again (its reply lost) is told it was received.
	answered map[string]answered
	// order is answered's ids, oldest first, so the old ones are
	// forgotten from its head, a few at each answer.
	order []string
	max   int
	// kinds are those For was asked for.
	kinds map[string]bool
	// taking counts the takes waiting now, by kind; absent marks the
	// kinds whose last question nobody took within takeWithin, until a
	// take of the kind comes.
	taking     map[string]int
	absent     map[string]bool
	takeWithin time.Duration
}

type question struct {
	id     string
	a      once.Action
	kind   string
	ends   time.Time // the recoverer's context's deadline, or zero
	taken  bool
	answer chan verdict // buffered: the first answer wins
}

type verdict struct {
	landed bool
	result json.RawMessage
	err    error
}

type answered struct {
	verdict string
	at      time.Time
}

// DefaultMaxQuestions bounds the questions waiting for a client
// verifier, of every kind together.
const DefaultMaxQuestions = 10000

// TakeWithin is how long a question waits for a client to take it
// before it is given up on, as a verifier that could not tell: longer
// than a client verifier takes between two takes.
const TakeWithin = 5 * time.Second

// NewVerifiers returns a bridge for client verifiers.
func NewVerifiers() *Verifiers {
	return &Verifiers{waiting: map[string][]*question{}, byID: map[string]*question{}, answered: map[string]answered{},
		changed: make(chan struct{}), max: DefaultMaxQuestions, kinds: map[string]bool{},
		taking: map[string]int{}, absent: map[string]bool{}, takeWithin: TakeWithin}
}

// For is the once.Verifier of kind that asks a client of the protocol:
// give it as the kind's KindPolicy.Verifier. A client takes questions
// only of the kinds For was asked for.
func (v *Verifiers) For(kind string) once.Verifier {
	v.mu.Lock()
	v.kinds[kind] = true
	v.mu.Unlock()
	return func(ctx context.Context, a once.Action) (bool, json.RawMessage, error) {
		q := &question{id: rand.Text(), a: a, kind: a.Kind, answer: make(chan verdict, 1)}
		if d, ok := ctx.Deadline(); ok {
			q.ends = d
		}
		v.mu.Lock()
		if v.absent[q.kind] && v.taking[q.kind] == 0 {
			v.mu.Unlock()
			return false, nil, fmt.Errorf("no client verifier of kind %q takes questions from this server (none took the last within %v): run one (POST /v1/verify/take) against each server that reaps the kind", a.Kind, v.takeWithin)
		}
		if v.queued >= v.max {
			v.mu.Unlock()
			return false, nil, fmt.Errorf("protocol: %d questions already wait for client verifiers; is one running for kind %q?", v.queued, a.Kind)
		}
		v.waiting[q.kind] = append(v.waiting[q.kind], q)
		v.byID[q.id] = q
		v.queued++
		close(v.changed)
		v.changed = make(chan struct{})
		v.mu.Unlock()
		defer v.forget(q)
		untaken := time.NewTimer(v.takeWithin)
		defer untaken.Stop()
		for {
			select {
			case vd := <-q.answer:
				return vd.landed, vd.result, vd.err
			case <-untaken.C:
				v.mu.Lock()
				taken := q.taken
				if !taken {
					v.absent[q.kind] = true
					v.forgetLocked(q)
				}
				v.mu.Unlock()
				if !taken {
					return false, nil, fmt.Errorf("no client verifier of kind %q took the question about attempt %d within %v: run one (POST /v1/verify/take)", a.Kind, a.Attempt, v.takeWithin)
				}
				// Taken: the client has until ctx ends to answer.
			case <-ctx.Done():
				// Given up on under the lock that answers take: an
				// answer reported received is the one used, and one
				// after it is told the question is gone
				// (TestAnswerReceivedIsTheAnswerUsed).
				v.mu.Lock()
				taken := q.taken
				v.forgetLocked(q)
				v.mu.Unlock()
				select {
				case vd := <-q.answer:
					return vd.landed, vd.result, vd.err
				default:
				}
				if taken {
					return false, nil, fmt.Errorf("a client verifier took the question about attempt %d and did not answer in time (%w)", a.Attempt, ctx.Err())
				}
				return false, nil, fmt.Errorf("no client verifier of kind %q took the question about attempt %d in time (%w): run one (POST /v1/verify/take)", a.Kind, a.Attempt, ctx.Err())
			}
		}
	}
}

// forget takes q out of the queue and the index.
func (v *Verifiers) forget(q *question) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.forgetLocked(q)
}

// forgetLocked is forget with v.mu held.
func (v *Verifiers) forgetLocked(q *question) {
	if _, ok := v.byID[q.id]; !ok {
		return
	}
	delete(v.byID, q.id)
	v.queued--
	list := v.waiting[q.kind]
	for i, w := range list {
		if w == q {
			v.waiting[q.kind] = append(list[:i:i], list[i+1:]...)
			break
		}
	}
	if len(v.waiting[q.kind]) == 0 {
		delete(v.waiting, q.kind)
	}
}

// take takes up to n questions of kinds, waiting until ctx ends for the
// first.
func (v *Verifiers) take(ctx context.Context, kinds []string, n int) []*question {
	v.mu.Lock()
	for _, k := range kinds {
		v.taking[k]++
		delete(v.absent, k)
	}
	v.mu.Unlock()
	defer func() {
		v.mu.Lock()
		for _, k := range kinds {
			if v.taking[k]--; v.taking[k] <= 0 {
				delete(v.taking, k)
			}
		}
		v.mu.Unlock()
	}()
	for {
		v.mu.Lock()
		var out []*question
		for _, k := range kinds {
			list := v.waiting[k]
			for len(list) > 0 && len(out) < n {
				q := list[0]
				list = list[1:]
				q.taken = true
				out = append(out, q)
			}
			if len(list) == 0 {
				delete(v.waiting, k)
			} else {
				v.waiting[k] = list
			}
		}
		changed := v.changed
		v.mu.Unlock()
		if len(out) > 0 {
			return out
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}

// answer hands a client's verdict to the question's recoverer. It
// reports whether the question was there to answer, and, when it was
// not, the verdict it was answered with lately, if any.
func (v *Verifiers) answer(id string, vd verdict, name string) (ok bool, before string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	q, there := v.byID[id]
	if !there || !q.taken {
		if a, seen := v.answered[id]; seen {
			return false, a.verdict
		}
		return false, ""
	}
	q.answer <- vd
	delete(v.byID, id)
	v.queued--
	now := time.Now()
	for len(v.order) > 0 && now.Sub(v.answered[v.order[0]].at) > answeredFor {
		delete(v.answered, v.order[0])
		v.order = v.order[1:]
	}
	if len(v.answered) < v.max {
		v.answered[id] = answered{verdict: name, at: now}
		v.order = append(v.order, id)
	}
	return true, ""
}

// answeredFor is how long an answer is remembered, for the same answer
// sent again.
const answeredFor = 10 * time.Minute

// Verdicts a client verifier answers with.
const (
	VerdictLanded     = "landed"
	VerdictNotLanded  = "not_landed"
	VerdictCannotTell = "cannot_tell"
)

// VerifyTakeRequest takes questions for client verifiers of Kinds,
// waiting up to WaitMS for the first.
type VerifyTakeRequest struct {
	Kinds  []string `json:"kinds"`
	WaitMS int64    `json:"wait_ms,omitempty"`
	// Max is how many questions to take at most; zero means 1.
	Max int `json:"max,omitempty"`
}

// Question asks a client verifier whether an attempt's effect landed.
type Question struct {
	Question    string          `json:"question"`
	Key         string          `json:"key"`
	Attempt     int             `json:"attempt"`
	Kind        string          `json:"kind"`
	Run         string          `json:"run"`
	Step        int64           `json:"step"`
	Target      string          `json:"target,omitempty"`
	ProviderKey string          `json:"provider_key"`
	Payload     json.RawMessage `json:"payload,omitempty"`
	// PayloadBase64 is the payload when it is not JSON.
	PayloadBase64 string `json:"payload_base64,omitempty"`
	// Note is what the effect noted it was about to do, if anything,
	// or the reason the outcome is unknown.
	Note string `json:"note,omitempty"`
	// AnswerWithinMS: the question is given up on (the verifier could
	// not tell) after this long; zero when it has no end.
	AnswerWithinMS int64 `json:"answer_within_ms,omitempty"`
}

// VerifyTakeAnswer is the questions taken: none when the wait ended
// without one.
type VerifyTakeAnswer struct {
	Questions []Question `json:"questions"`
}

// VerifyAnswerRequest answers a question. Result is the effect's result
// as the provider shows it (landed only); Error says why the verifier
// could not tell (cannot_tell only).
type VerifyAnswerRequest struct {
	Question string          `json:"question"`
	Verdict  string          `json:"verdict"`
	Result   json.RawMessage `json:"result,omitempty"`
	Error    string          `json:"error,omitempty"`
}

// VerifyAnswerAnswer says the answer reached the recoverer, which
// decides the action from it.
type VerifyAnswerAnswer struct {
	Received bool `json:"received"`
}

// Bounds of the verifier routes.
const (
	maxVerifyKinds = 64
	maxTake        = 100
)

func (s *Server) verifyTake(w http.ResponseWriter, r *http.Request) {
	received := time.Now()
	var req VerifyTakeRequest
	if !s.read(w, r, &req) {
		return
	}
	switch {
	case len(req.Kinds) == 0 || len(req.Kinds) > maxVerifyKinds:
		writeProblem(w, http.StatusBadRequest, Problem{Code: "bad_request", Detail: fmt.Sprintf("kinds lists %d kinds; name 1 to %d kinds this verifier asks its provider about", len(req.Kinds), maxVerifyKinds)})
		return
	case req.WaitMS < 0 || time.Duration(req.WaitMS)*time.Millisecond > s.maxWait:
		writeProblem(w, http.StatusBadRequest, Problem{Code: "bad_request", Detail: fmt.Sprintf("wait_ms is %d; it must be 0 to %d", req.WaitMS, s.maxWait.Milliseconds())})
		return
	case req.Max < 0 || req.Max > maxTake:
		writeProblem(w, http.StatusBadRequest, Problem{Code: "bad_request", Detail: fmt.Sprintf("max is %d; it must be 0 to %d", req.Max, maxTake)})
		return
	}
	if s.verifiers == nil {
		writeProblem(w, http.StatusNotFound, Problem{Code: "not_client_verified", Detail: "this server has no kind that clients verify: its kinds file says \"verifier\": \"client\" for those that are"})
		return
	}
	for _, k := range req.Kinds {
		if !s.verifiers.verifies(k) {
			writeProblem(w, http.StatusBadRequest, Problem{Code: "not_client_verified",
				Detail: fmt.Sprintf("kind %.128q is not verified by clients on this server: its kinds file must say \"verifier\": \"client\" for it", k)})
			return
		}
	}
	n := max(req.Max, 1)
	ctx, cancel := context.WithTimeout(r.Context(), time.Duration(req.WaitMS)*time.Millisecond)
	defer cancel()
	qs := s.verifiers.take(ctx, req.Kinds, n)
	if r.Context().Err() != nil {
		// The client left: give the questions back for another.
		s.verifiers.untake(qs)
		return
	}
	out := VerifyTakeAnswer{Questions: []Question{}}
	for _, q := range qs {
		a := q.a
		wq := Question{Question: q.id, Key: string(a.Key), Attempt: a.Attempt, Kind: a.Kind, Run: a.Run, Step: a.Step, Target: a.Target,
			ProviderKey: string(a.Key), Note: a.Error}
		switch {
		case len(a.Payload) == 0:
		case json.Valid(a.Payload):
			wq.Payload = a.Payload
		default:
			wq.PayloadBase64 = base64.StdEncoding.EncodeToString(a.Payload)
		}
		if !q.ends.IsZero() {
			// Counted from when the client sent the take, less a
			// margin for the answer's way back.
			wq.AnswerWithinMS = max(ms(q.ends.Sub(received)-time.Second), 1)
		}
		out.Questions = append(out.Questions, wq)
	}
	writeJSON(w, http.StatusOK, out)
}

// untake puts questions taken for a client that left back at the head
// of their queues.
func (v *Verifiers) untake(qs []*question) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for i := len(qs) - 1; i >= 0; i-- {
		q := qs[i]
		if _, ok := v.byID[q.id]; !ok {
			continue
		}
		q.taken = false
		v.waiting[q.kind] = append([]*question{q}, v.waiting[q.kind]...)
	}
	if len(qs) > 0 {
		close(v.changed)
		v.changed = make(chan struct{})
	}
}

// verifies reports whether clients verify kind.
func (v *Verifiers) verifies(kind string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.kinds[kind]
}

func (s *Server) verifyAnswer(w http.ResponseWriter, r *http.Request) {
	var req VerifyAnswerRequest
	if !s.read(w, r, &req) {
		return
	}
	if s.verifiers == nil {
		writeProblem(w, http.StatusNotFound, Problem{Code: "no_such_question", Detail: "this server has no kind that clients verify"})
		return
	}
	var vd verdict
	switch req.Verdict {
	case VerdictLanded:
		vd.landed, vd.result = true, req.Result
		if len(vd.result) == 0 {
			vd.result = json.RawMessage("null")
		}
	case VerdictNotLanded:
	case VerdictCannotTell:
		if strings.TrimSpace(req.Error) == "" || len(req.Error) > maxErrorText {
			writeProblem(w, http.StatusBadRequest, Problem{Code: "bad_request", Detail: fmt.Sprintf("cannot_tell needs its error, 1 to %d bytes: why the provider could not be asked, for the trail", maxErrorText)})
			return
		}
		vd.err = errors.New(req.Error)
	default:
		writeProblem(w, http.StatusBadRequest, Problem{Code: "bad_request", Detail: fmt.Sprintf("verdict is %.40q; it is one of landed, not_landed, cannot_tell", req.Verdict)})
		return
	}
	if req.Verdict != VerdictLanded && len(req.Result) > 0 {
		writeProblem(w, http.StatusBadRequest, Problem{Code: "bad_request", Detail: "only a landed verdict carries a result"})
		return
	}
	if req.Verdict != VerdictCannotTell && req.Error != "" {
		writeProblem(w, http.StatusBadRequest, Problem{Code: "bad_request", Detail: "only a cannot_tell verdict carries an error"})
		return
	}
	ok, before := s.verifiers.answer(req.Question, vd, req.Verdict)
	switch {
	case ok, before == req.Verdict:
		writeJSON(w, http.StatusOK, VerifyAnswerAnswer{Received: true})
	case before != "":
		writeProblem(w, http.StatusConflict, Problem{Code: "conflict", Detail: fmt.Sprintf("the question was answered %s already", before)})
	default:
		writeProblem(w, http.StatusNotFound, Problem{Code: "no_such_question",
			Detail: "no question of that id waits for an answer: it was given up on (its answer_within_ms passed, and the verifier counted as unable to tell) or never taken; the action is asked about again later"})
	}
}
