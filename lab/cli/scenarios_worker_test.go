package cli_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sync"
	"time"

	"github.com/oncehq/once/lab/cli"
)

// The test binary is also the scenarios' Go worker and their once serve
// process: scenarios_test.go runs it again with one of these set. It is
// decided in init, before the test flags are parsed.
const (
	scenarioJobEnv   = "ONCE_SCENARIO_JOB"
	scenarioServeEnv = "ONCE_SCENARIO_SERVE"
)

func init() {
	if os.Getenv(scenarioServeEnv) == "1" {
		os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
	}
	if job := os.Getenv(scenarioJobEnv); job != "" {
		os.Exit(goScenarioWorker(job))
	}
}

// scenarioJob is what a worker process of any language is told to do.
type scenarioJob struct {
	Scenario string         `json:"scenario"`
	Name     string         `json:"name"`
	Role     string         `json:"role"` // "do" or "verify"
	URL      string         `json:"url"`
	Token    string         `json:"token"`
	Provider string         `json:"provider"`
	Intent   scenarioIntent `json:"intent"`
	// Hold is where the effect waits for a line on stdin: "started"
	// (before the provider call), "landed" (after it) or nowhere.
	Hold string `json:"hold,omitempty"`
	// Redeliver is how long the job is delivered again while the
	// answer says to retry, in milliseconds.
	Redeliver int64    `json:"redeliver_ms,omitempty"`
	Kinds     []string `json:"verify_kinds,omitempty"`
	VerifyFor int64    `json:"verify_for_ms,omitempty"`
	Questions int      `json:"questions,omitempty"`
}

type scenarioIntent struct {
	Run     string          `json:"run"`
	Step    int64           `json:"step"`
	Kind    string          `json:"kind"`
	Target  string          `json:"target"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

// goScenarioWorker is the Go worker of the scenarios. It speaks the
// protocol with net/http, as the Python and TypeScript workers do with
// their clients, so that every scenario (a lost reply, a restarted
// server) means the same in the three languages; the Go library's own
// Claim and Attempt under these faults are tested by storetest and the
// lab. It is a worker, not a client: what it needs of the protocol, no
// more.
func goScenarioWorker(raw string) int {
	var job scenarioJob
	if err := json.Unmarshal([]byte(raw), &job); err != nil {
		fmt.Fprintln(os.Stderr, "scenario worker:", err)
		return 2
	}
	w := &goWorker{job: job, hc: &http.Client{Timeout: 30 * time.Second}, stdin: bufio.NewReader(os.Stdin)}
	w.emit(map[string]any{"event": "ready", "lang": "go", "name": job.Name})
	var err error
	if job.Role == "verify" {
		err = w.verify()
	} else {
		err = w.do()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "scenario worker:", err)
		return 1
	}
	return 0
}

type goWorker struct {
	job   scenarioJob
	hc    *http.Client
	stdin *bufio.Reader
	mu    sync.Mutex
	held  bool
}

func (w *goWorker) emit(ev map[string]any) {
	b, _ := json.Marshal(ev)
	w.mu.Lock()
	defer w.mu.Unlock()
	os.Stdout.Write(append(b, '\n'))
}

// wireProblem is an answer of the server that is not a 200, or no answer.
type wireProblem struct {
	Code         string `json:"code"`
	Detail       string `json:"detail"`
	RetryAfterMS int64  `json:"retry_after_ms"`
	status       int
}

func (p *wireProblem) Error() string { return p.Code + ": " + p.Detail }

// call sends a request to the server, again the same while no answer
// comes or the answer is a 503, for budget: every write of the protocol
// answers the same when sent again.
func (w *goWorker) call(path string, body any, out any, budget time.Duration) error {
	data, err := json.Marshal(body)
	if err != nil {
		return err
	}
	end := time.Now().Add(budget)
	wait := 50 * time.Millisecond
	for {
		var last error
		req, _ := http.NewRequest("POST", w.job.URL+path, bytes.NewReader(data))
		req.Header.Set("Authorization", "Bearer "+w.job.Token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := w.hc.Do(req)
		if err == nil {
			b, rerr := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
			resp.Body.Close()
			switch {
			case rerr != nil:
				last = &wireProblem{Code: "unreachable", Detail: rerr.Error()}
			case resp.StatusCode == http.StatusOK:
				return json.Unmarshal(b, out)
			default:
				p := &wireProblem{status: resp.StatusCode}
				if json.Unmarshal(b, p) != nil || p.Code == "" {
					p.Code, p.Detail = "error", fmt.Sprintf("HTTP %d: %.200s", resp.StatusCode, b)
				}
				if resp.StatusCode != http.StatusServiceUnavailable {
					return p
				}
				last = p
			}
		} else {
			last = &wireProblem{Code: "unreachable", Detail: err.Error()}
		}
		if time.Now().Add(wait).After(end) {
			return last
		}
		time.Sleep(wait)
		wait = min(2*wait, time.Second)
	}
}

func scenarioWriteToken() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// errRetryLater is an effect's "it did not happen; try again later".
var errRetryLater = errors.New("retry later")

type claimAnswer struct {
	Answer           string          `json:"answer"`
	Key              string          `json:"key"`
	Attempt          int             `json:"attempt"`
	Token            string          `json:"token"`
	ProviderKey      string          `json:"provider_key"`
	StopAfterMS      int64           `json:"stop_after_ms"`
	HeartbeatEveryMS int64           `json:"heartbeat_every_ms"`
	Result           json.RawMessage `json:"result"`
	Message          string          `json:"message"`
}

// doOnce is one delivery of the job: claim, run the effect while a
// goroutine heartbeats, record the outcome.
func (w *goWorker) doOnce() (json.RawMessage, error) {
	in := w.job.Intent
	sent := time.Now()
	var a claimAnswer
	if err := w.call("/v1/claim", map[string]any{"intent": in, "write": scenarioWriteToken()}, &a, 10*time.Second); err != nil {
		return nil, err
	}
	switch a.Answer {
	case "replayed":
		return a.Result, nil
	case "failed":
		return nil, &wireProblem{Code: "failed", Detail: a.Message}
	}
	ref := map[string]any{"key": a.Key, "attempt": a.Attempt, "token": a.Token}
	outcome := func(o string, fields map[string]any) error {
		body := map[string]any{"write": scenarioWriteToken(), "outcome": o}
		for k, v := range ref {
			body[k] = v
		}
		for k, v := range fields {
			body[k] = v
		}
		var got struct{ Status string }
		return w.call("/v1/outcome", body, &got, 30*time.Second)
	}
	if time.Since(sent) >= time.Duration(a.StopAfterMS)*time.Millisecond {
		// Its answer came after its lease was spent: another worker may
		// be taking it over, so the effect does not start here.
		outcome("retry_later", map[string]any{"error": "the claim's answer came after its lease was spent"})
		return nil, &wireProblem{Code: "lease_spent", Detail: "the claim came back after its lease was spent", RetryAfterMS: 1000}
	}
	ctx, stop := context.WithCancel(context.Background())
	beating := make(chan struct{})
	go func() {
		defer close(beating)
		every := max(time.Duration(a.HeartbeatEveryMS)*time.Millisecond, 50*time.Millisecond)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(every):
			}
			var hb struct{}
			var p *wireProblem
			if err := w.call("/v1/heartbeat", ref, &hb, every); errors.As(err, &p) && p.Code == "fenced" {
				return
			}
		}
	}()
	id, err := w.effect(a)
	stop()
	<-beating
	switch {
	case errors.Is(err, errRetryLater):
		if oerr := outcome("retry_later", map[string]any{"error": err.Error()}); oerr != nil {
			return nil, oerr
		}
		return nil, &wireProblem{Code: "retry_later", Detail: err.Error()}
	case err != nil:
		if oerr := outcome("unknown", map[string]any{"error": err.Error()}); oerr != nil {
			return nil, oerr
		}
		return nil, &wireProblem{Code: "error:unknown", Detail: err.Error()}
	}
	result, _ := json.Marshal(id)
	if err := outcome("succeeded", map[string]any{"result": json.RawMessage(result)}); err != nil {
		return nil, err
	}
	return result, nil
}

func (w *goWorker) hold(at string) {
	if w.job.Hold == at && !w.held {
		w.held = true
		w.emit(map[string]any{"event": "held", "at": at})
		w.stdin.ReadString('\n')
	}
}

func (w *goWorker) effect(a claimAnswer) (string, error) {
	w.emit(map[string]any{"event": "effect", "phase": "started", "attempt": a.Attempt, "provider_key": a.ProviderKey})
	w.hold("started")
	body, _ := json.Marshal(map[string]string{"email": w.job.Intent.Target, "name": w.job.Intent.Run})
	req, _ := http.NewRequest("POST", w.job.Provider+"/v1/customers", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", a.ProviderKey)
	resp, err := w.hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		return "", fmt.Errorf("%w: the provider answered %d", errRetryLater, resp.StatusCode)
	default:
		return "", fmt.Errorf("the provider answered %d", resp.StatusCode)
	}
	var o struct{ ID string }
	if err := json.NewDecoder(resp.Body).Decode(&o); err != nil {
		return "", err
	}
	w.emit(map[string]any{"event": "effect", "phase": "landed", "attempt": a.Attempt, "id": o.ID})
	w.hold("landed")
	return o.ID, nil
}

// redelivers says whether a queue would deliver the job again after err,
// and when: the codes the clients' dispose retries.
func redelivers(err error) (time.Duration, bool) {
	var p *wireProblem
	if !errors.As(err, &p) {
		return 0, false
	}
	switch p.Code {
	case "in_flight", "outcome_unknown", "awaiting_approval", "store_unavailable", "not_recorded", "unreachable", "lease_spent", "needs_verifier":
		return max(time.Duration(p.RetryAfterMS)*time.Millisecond, time.Second), true
	}
	return 0, false
}

func (w *goWorker) do() error {
	end := time.Now().Add(time.Duration(w.job.Redeliver) * time.Millisecond)
	for {
		result, err := w.doOnce()
		if err == nil {
			w.emit(map[string]any{"event": "end", "outcome": "result", "result": result})
			return nil
		}
		code := "error"
		var p *wireProblem
		if errors.As(err, &p) {
			code = p.Code
		}
		if after, ok := redelivers(err); ok && time.Now().Before(end) {
			w.emit(map[string]any{"event": "redeliver", "code": code, "after_ms": after.Milliseconds()})
			time.Sleep(min(after, 500*time.Millisecond))
			continue
		}
		w.emit(map[string]any{"event": "end", "outcome": "error", "code": code, "detail": err.Error()})
		return nil
	}
}

// verify is a client verifier: it takes questions about dead claims,
// asks the provider whether the effect landed, and answers.
func (w *goWorker) verify() error {
	end := time.Now().Add(time.Duration(orDefault(w.job.VerifyFor, 30000)) * time.Millisecond)
	want := max(w.job.Questions, 1)
	answered := 0
	for answered < want && time.Now().Before(end) {
		var got struct {
			Questions []struct {
				Question    string `json:"question"`
				Key         string `json:"key"`
				Attempt     int    `json:"attempt"`
				ProviderKey string `json:"provider_key"`
			} `json:"questions"`
		}
		if err := w.call("/v1/verify/take", map[string]any{"kinds": w.job.Kinds, "wait_ms": 2000, "max": 1}, &got, 10*time.Second); err != nil {
			return err
		}
		for _, q := range got.Questions {
			w.emit(map[string]any{"event": "question", "key": q.Key, "attempt": q.Attempt})
			answer := map[string]any{"question": q.Question}
			resp, err := w.hc.Get(w.job.Provider + "/scenario/landed/" + url.PathEscape(q.ProviderKey))
			if err != nil {
				return err
			}
			var o struct{ ID string }
			derr := json.NewDecoder(resp.Body).Decode(&o)
			resp.Body.Close()
			switch {
			case resp.StatusCode == http.StatusOK && derr == nil:
				answer["verdict"] = "landed"
				answer["result"] = o.ID
			case resp.StatusCode == http.StatusNotFound:
				answer["verdict"] = "not_landed"
			default:
				answer["verdict"], answer["error"] = "cannot_tell", fmt.Sprintf("the provider answered %d", resp.StatusCode)
			}
			var ok struct{ Received bool }
			if err := w.call("/v1/verify/answer", answer, &ok, 10*time.Second); err != nil {
				return err
			}
			w.emit(map[string]any{"event": "verified", "verdict": answer["verdict"]})
			answered++
		}
	}
	outcome := "no_question"
	if answered > 0 {
		outcome = "verified"
	}
	w.emit(map[string]any{"event": "end", "outcome": outcome})
	return nil
}

// orDefault is v, or def when v is zero.
func orDefault(v, def int64) int64 {
	if v == 0 {
		return def
	}
	return v
}
