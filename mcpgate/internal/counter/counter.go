// Package counter is an MCP server for tests that counts its side effects.
//
// A test of exactly-once needs to know how many times an effect really
// happened, and the answer must survive the death of every process in
// the test: the host, the gateway and this server. So each effect is
// one JSON line appended to a file and synced before the tool replies.
// A test reads the file with [Count] after the dust settles.
//
// The tools stand for the kinds an agent meets:
//
//   - send_message is destructive and not idempotent, like email.
//   - charge is idempotent by key, like a payment provider.
//   - find_message is read-only, so a verifier can ask whether a
//     message was sent.
//   - fail_tool runs and reports failure to the model.
//   - list_effects is read-only and counts effects per tool.
//
// send_message and charge take sleep_ms, a pause before the effect, so
// a test can kill a process while the call is open and nothing
// happened; and after_ms, a pause after the effect and before the
// reply, so a test can cut the caller when the effect happened but no
// one heard of it.
package counter

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log"
	"os"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Effect is one line of the effects file.
type Effect struct {
	Tool string          `json:"tool"`
	Args json.RawMessage `json:"args"`
	// Key is the provider's idempotency key, if the call carried one.
	Key string `json:"key,omitempty"`
	// Meta is the call's _meta, so a test can see what a gateway passed on.
	Meta map[string]any `json:"meta,omitempty"`
	// Result is the structured result, kept so that a repeated charge
	// returns what the first one returned.
	Result json.RawMessage `json:"result,omitempty"`
	Time   time.Time       `json:"time"`
}

// Effects reads every effect in file. A missing file has none.
// A torn last line, left by a kill during the write, is skipped: its
// fsync never finished, so the tool never replied for it.
func Effects(file string) ([]Effect, error) {
	f, err := os.Open(file)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Effect
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var e Effect
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			continue
		}
		out = append(out, e)
	}
	return out, sc.Err()
}

// Count returns how many effects tool had in file.
func Count(file, tool string) (int, error) {
	es, err := Effects(file)
	n := 0
	for _, e := range es {
		if e.Tool == tool {
			n++
		}
	}
	return n, err
}

// ledger appends effects to the file. The mutex makes charge's
// look-up-then-record one step within a process; one process at a time
// should own a file.
type ledger struct {
	mu   sync.Mutex
	file string
	// stubborn: the server does not listen to cancellation and finishes
	// its calls after its client is gone, as many servers do; calls
	// counts them, and each is marked "received:<tool>" as it arrives.
	stubborn bool
	calls    sync.WaitGroup
}

// NewStubborn is New for a server that ignores cancellation and whose
// calls outlive their client: wait returns once every call has ended.
// A test uses it to see what happens to a call whose gateway died
// while the server still held it.
func NewStubborn(file string) (s *mcp.Server, wait func()) {
	l := &ledger{file: file, stubborn: true}
	return l.server(), l.calls.Wait
}

// arrive is where send and charge begin: a stubborn server cuts the
// call loose from its client and marks its arrival.
func (l *ledger) arrive(ctx context.Context, req *mcp.CallToolRequest) (context.Context, func()) {
	if !l.stubborn {
		return ctx, func() {}
	}
	l.calls.Add(1)
	l.mu.Lock()
	l.record(Effect{Tool: "received:" + req.Params.Name, Args: req.Params.Arguments})
	l.mu.Unlock()
	return context.WithoutCancel(ctx), l.calls.Done
}

// record appends e and syncs, so the effect is on disk before anyone
// is told of it.
func (l *ledger) record(e Effect) error {
	e.Time = time.Now().UTC()
	line, err := json.Marshal(e)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(l.file, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(append(line, '\n')); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Pause holds the optional pauses of send_message and charge.
type Pause struct {
	SleepMS int `json:"sleep_ms,omitempty" jsonschema:"milliseconds to wait before the effect"`
	AfterMS int `json:"after_ms,omitempty" jsonschema:"milliseconds to wait after the effect, before the reply"`
}

// SendArgs are send_message's arguments.
type SendArgs struct {
	To      string `json:"to"`
	Subject string `json:"subject"`
	Body    string `json:"body,omitempty"`
	Pause
}

// ChargeArgs are charge's arguments.
type ChargeArgs struct {
	Customer       string `json:"customer"`
	Amount         int    `json:"amount"`
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	Pause
}

// FindArgs are find_message's arguments.
type FindArgs struct {
	To      string `json:"to"`
	Subject string `json:"subject"`
}

// Sent is send_message's structured result.
type Sent struct {
	ID string `json:"id"`
}

// Charged is charge's structured result.
type Charged struct {
	ID       string `json:"id"`
	Customer string `json:"customer"`
	Amount   int    `json:"amount"`
}

// Found is find_message's structured result.
type Found struct {
	Found bool `json:"found"`
}

// Counts is list_effects' structured result.
type Counts struct {
	Counts map[string]int `json:"counts"`
}

// New returns the server, recording effects in file.
func New(file string) *mcp.Server {
	l := &ledger{file: file}
	return l.server()
}

func (l *ledger) server() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "counter", Version: "0.1.0"}, nil)
	yes, no := true, false
	mcp.AddTool(s, &mcp.Tool{
		Name:        "send_message",
		Description: "Send a message. Each call sends one more.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: &yes, IdempotentHint: false, OpenWorldHint: &yes},
	}, l.send)
	mcp.AddTool(s, &mcp.Tool{
		Name:        "charge",
		Description: "Charge a customer. A repeated idempotency_key charges once.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: &yes, IdempotentHint: true, OpenWorldHint: &yes},
	}, l.charge)
	mcp.AddTool(s, &mcp.Tool{
		Name:        "find_message",
		Description: "Tell whether a message to this address with this subject was sent.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: &no},
	}, l.find)
	mcp.AddTool(s, &mcp.Tool{
		Name:        "fail_tool",
		Description: "Always fails, as a tool error the model sees.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: &no},
	}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		return nil, nil, errors.New("fail_tool always fails")
	})
	mcp.AddTool(s, &mcp.Tool{
		Name:        "list_effects",
		Description: "Count the effects so far, per tool.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: &no},
	}, l.list)
	return s
}

func (l *ledger) send(ctx context.Context, req *mcp.CallToolRequest, a SendArgs) (*mcp.CallToolResult, Sent, error) {
	ctx, done := l.arrive(ctx, req)
	defer done()
	if err := pause(ctx, req, a.SleepMS, "before"); err != nil {
		return nil, Sent{}, err
	}
	out := Sent{ID: "msg_" + token()}
	res, _ := json.Marshal(out)
	l.mu.Lock()
	err := l.record(Effect{Tool: "send_message", Args: req.Params.Arguments, Meta: req.Params.Meta, Result: res})
	l.mu.Unlock()
	if err != nil {
		return nil, Sent{}, err
	}
	afterPause(ctx, req, a.AfterMS)
	return text("sent to " + a.To), out, nil
}

func (l *ledger) charge(ctx context.Context, req *mcp.CallToolRequest, a ChargeArgs) (*mcp.CallToolResult, Charged, error) {
	ctx, done := l.arrive(ctx, req)
	defer done()
	if err := pause(ctx, req, a.SleepMS, "before"); err != nil {
		return nil, Charged{}, err
	}
	l.mu.Lock()
	out, fresh, err := l.chargeOnce(req, a)
	l.mu.Unlock()
	if err != nil {
		return nil, Charged{}, err
	}
	if fresh {
		// A provider answers a repeated key from what it stored, at
		// once: only a new charge pauses before its reply.
		afterPause(ctx, req, a.AfterMS)
	}
	return text(fmt.Sprintf("charged %s %d", out.Customer, out.Amount)), out, nil
}

// chargeOnce returns the first charge under the key if there was one,
// and records a new charge (fresh) if not. The caller holds l.mu.
func (l *ledger) chargeOnce(req *mcp.CallToolRequest, a ChargeArgs) (out Charged, fresh bool, err error) {
	if a.IdempotencyKey != "" {
		es, err := Effects(l.file)
		if err != nil {
			return Charged{}, false, err
		}
		for _, e := range es {
			if e.Tool == "charge" && e.Key == a.IdempotencyKey {
				var first Charged
				err := json.Unmarshal(e.Result, &first)
				return first, false, err
			}
		}
	}
	out = Charged{ID: "ch_" + token(), Customer: a.Customer, Amount: a.Amount}
	res, _ := json.Marshal(out)
	err = l.record(Effect{Tool: "charge", Args: req.Params.Arguments, Key: a.IdempotencyKey, Meta: req.Params.Meta, Result: res})
	return out, true, err
}

func (l *ledger) find(_ context.Context, _ *mcp.CallToolRequest, a FindArgs) (*mcp.CallToolResult, Found, error) {
	es, err := Effects(l.file)
	if err != nil {
		return nil, Found{}, err
	}
	for _, e := range es {
		var s SendArgs
		if e.Tool == "send_message" && json.Unmarshal(e.Args, &s) == nil && s.To == a.To && s.Subject == a.Subject {
			return nil, Found{Found: true}, nil
		}
	}
	return nil, Found{}, nil
}

func (l *ledger) list(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, Counts, error) {
	es, err := Effects(l.file)
	if err != nil {
		return nil, Counts{}, err
	}
	c := Counts{Counts: map[string]int{}}
	for _, e := range es {
		c.Counts[e.Tool]++
	}
	return nil, c, nil
}

// pause waits ms before the effect, sending progress if the caller asked
// for it. A call cancelled while it waits does nothing: that is what a
// careful server does, and the case a gateway must not mistake for done.
func pause(ctx context.Context, req *mcp.CallToolRequest, ms int, stage string) error {
	progress(ctx, req, 0, stage)
	if ms <= 0 {
		return nil
	}
	t := time.NewTimer(time.Duration(ms) * time.Millisecond)
	defer t.Stop()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			// Said on stderr so a test can tell how the call ended.
			log.Printf("%s cancelled before its effect: %v", req.Params.Name, context.Cause(ctx))
			return ctx.Err()
		case <-t.C:
			return nil
		case <-tick.C:
			progress(ctx, req, float64(n)/float64(n+1), "waiting")
		}
	}
}

// afterPause waits ms after the effect. It ignores cancellation: the
// effect happened, and the reply is what a test means to lose.
func afterPause(ctx context.Context, req *mcp.CallToolRequest, ms int) {
	progress(ctx, req, 1, "done")
	if ms > 0 {
		time.Sleep(time.Duration(ms) * time.Millisecond)
	}
}

// progress notifies the caller if it sent a progress token.
func progress(ctx context.Context, req *mcp.CallToolRequest, p float64, msg string) {
	tok := req.Params.GetProgressToken()
	if tok == nil || req.Session == nil {
		return
	}
	_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: p, Total: 1, Message: msg})
}

func text(s string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
}

func token() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
