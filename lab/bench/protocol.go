package bench

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/protocol"
)

// The protocol arms send claim and outcome to the protocol's handler,
// served in this process on a loopback port over the client the Do arm
// beside them uses, through net/http's client: what a worker in another
// process pays for the HTTP hop, its JSON both ways included.

// maxAnswer bounds what the arms read of an answer: a claim's or an
// outcome's is a few hundred bytes, a problem's a few more.
const maxAnswer = 64 << 10

// protocolTimeout bounds one request of a protocol arm, so a server that
// stops answering fails the arm instead of hanging the run.
const protocolTimeout = time.Minute

// wirePayload is payload as the protocol carries it: the same JSON, so a
// claim over the wire keys an intent as Do keys it.
var wirePayload = func() json.RawMessage {
	b, err := json.Marshal(payload)
	if err != nil {
		panic(err)
	}
	return b
}()

// openHTTP makes the token the protocol's handlers take and the client
// the arms send through: one kept-alive connection per worker, so no
// action pays for connecting after the first at each worker count.
func (r *runner) openHTTP() {
	r.token = crand.Text()
	n := maxWorkers(r.opts.Workers)
	t := &http.Transport{MaxIdleConns: 3 * n, MaxIdleConnsPerHost: n, IdleConnTimeout: 10 * time.Minute, DisableCompression: true}
	r.http = &http.Client{Transport: t, Timeout: protocolTimeout}
	r.defer_(t.CloseIdleConnections)
}

// serveProtocol serves the protocol over c on a port of 127.0.0.1 until
// the run ends, and returns its base URL.
func (r *runner) serveProtocol(c *once.Client) (string, error) {
	if r.http == nil {
		r.openHTTP()
	}
	h, err := protocol.New(protocol.Config{Client: c, Workers: []string{r.token}})
	if err != nil {
		return "", err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("listening on loopback for the protocol arms: %w", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 10 * time.Minute}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(ln)
	}()
	r.defer_(func() {
		srv.Close()
		<-done
	})
	return "http://" + ln.Addr().String(), nil
}

// post sends req as JSON to the protocol at url and decodes a 200's
// answer into ans; any other status is an error carrying the problem.
func (r *runner) post(ctx context.Context, url string, req, ans any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("Authorization", "Bearer "+r.token)
	resp, err := r.http.Do(hr)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	switch {
	case err != nil:
		return fmt.Errorf("reading the answer of %s: %w", url, err)
	case len(b) > maxAnswer:
		return fmt.Errorf("the answer of %s is over %d bytes", url, maxAnswer)
	case resp.StatusCode != http.StatusOK:
		var p protocol.Problem
		if json.Unmarshal(b, &p) != nil || p.Code == "" {
			return fmt.Errorf("%s answered %s: %.200q", url, resp.Status, b)
		}
		return fmt.Errorf("%s answered %s, %s: %s", url, resp.Status, p.Code, p.Detail)
	}
	if err := json.Unmarshal(b, ans); err != nil {
		return fmt.Errorf("the answer of %s is not its JSON: %w", url, err)
	}
	return nil
}

// protocolNew claims a new intent each time over the protocol at url
// (the worker's own run, the step counting up, as doNew) and records
// that it succeeded with Do's result: two requests, each with a write
// token of its own, as a client sends them.
func (r *runner) protocolNew(url, run string) work {
	var step int64
	result := json.RawMessage(resultJSON)
	return func(ctx context.Context) (int, error) {
		in := protocol.Intent{Run: run, Step: step, Kind: benchKind, Target: benchTarget, Payload: wirePayload}
		step++
		var claim protocol.ClaimAnswer
		if err := r.post(ctx, url+"/v1/claim", protocol.ClaimRequest{Intent: in, Write: crand.Text()}, &claim); err != nil {
			return 0, err
		}
		if claim.Answer != protocol.AnswerClaimed || claim.Token == "" || claim.Attempt != 1 {
			return 0, fmt.Errorf("%s step %d: the claim answered %q, attempt %d, but its key is new", run, in.Step, claim.Answer, claim.Attempt)
		}
		req := protocol.OutcomeRequest{
			AttemptRef: protocol.AttemptRef{Key: claim.Key, Attempt: claim.Attempt, Token: claim.Token},
			Write:      crand.Text(), Outcome: protocol.OutcomeSucceeded, Result: result,
		}
		var out protocol.OutcomeAnswer
		if err := r.post(ctx, url+"/v1/outcome", req, &out); err != nil {
			return 0, err
		}
		if out.Status != string(once.StatusSucceeded) {
			return 0, fmt.Errorf("%s step %d: the outcome left it %q, not succeeded", run, in.Step, out.Status)
		}
		return 1, nil
	}
}

// protocolReplay claims, over the protocol at url, an intent of s's that
// succeeded, picked at random: replay_do's over the wire.
func (r *runner) protocolReplay(url string, s *site, rng *rand.Rand) work {
	return func(ctx context.Context) (int, error) {
		step := s.replaySteps[rng.IntN(len(s.replaySteps))]
		in := protocol.Intent{Run: s.replayRun, Step: step, Kind: benchKind, Target: benchTarget, Payload: wirePayload}
		var claim protocol.ClaimAnswer
		if err := r.post(ctx, url+"/v1/claim", protocol.ClaimRequest{Intent: in, Write: crand.Text()}, &claim); err != nil {
			return 0, err
		}
		if claim.Answer != protocol.AnswerReplayed || len(claim.Result) == 0 {
			return 0, fmt.Errorf("%s step %d was not replayed with its result (answer %q, result %s)", s.replayRun, step, claim.Answer, claim.Result)
		}
		return 1, nil
	}
}
