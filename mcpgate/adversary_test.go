package mcpgate

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/oncehq/once"
	"github.com/oncehq/once/sqlite"
)

// An adversary's tests of the gateway: each names what it would break.

// tally is an upstream of untyped tools: each call of a tool counts one
// effect, whatever its arguments, and answers what the test says.
type tally struct {
	mu    sync.Mutex
	count map[string]int
	hold  chan struct{}
}

func (u *tally) n(tool string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.count[tool]
}

func (u *tally) add(s *mcp.Server, name string, answer func(req *mcp.CallToolRequest) *mcp.CallToolResult) {
	s.AddTool(&mcp.Tool{Name: name, InputSchema: map[string]any{"type": "object"}},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			u.mu.Lock()
			u.count[name]++
			hold := u.hold
			u.mu.Unlock()
			if hold != nil && name == "slow" {
				<-hold
			}
			if answer != nil {
				return answer(req), nil
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil
		})
}

type advRig struct {
	up      *tally
	gw      *Gateway
	connect func(t *testing.T) *mcp.ClientSession
}

func newAdvRig(t *testing.T, policy string, opts Options, tools func(*mcp.Server, *tally)) *advRig {
	t.Helper()
	store, f := storeAndPolicy(t, policy)
	up := &tally{count: map[string]int{}}
	srv := mcp.NewServer(&mcp.Implementation{Name: "tally", Version: "1"}, nil)
	tools(srv, up)
	opts.Store, opts.Policy = store, f
	if opts.Progress == 0 {
		opts.Progress = 50 * time.Millisecond
	}
	opts.Upstream = func(ctx context.Context) (mcp.Transport, error) {
		ct, st := mcp.NewInMemoryTransports()
		if _, err := srv.Connect(ctx, st, nil); err != nil {
			return nil, err
		}
		return ct, nil
	}
	gw, err := New(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	closeAtEnd(t, gw)
	r := &advRig{up: up, gw: gw}
	r.connect = func(t *testing.T) *mcp.ClientSession { return clientOf(t, gw) }
	return r
}

func rawCall(run, tool, args string) *mcp.CallToolParams {
	return &mcp.CallToolParams{Name: tool, Arguments: json.RawMessage(args), Meta: mcp.Meta{MetaRun: run, MetaStep: 0}}
}

// The same call written two ways (a number as 42 or 42.0, an object's
// members in another order, a string escaped) is one call to every
// JSON reader upstream, and was one fingerprint here, but the key
// argument's value went into the key as written: two keys, and the
// effect ran twice.
func TestKeyArgumentsWrittenDifferentlyAreOneCall(t *testing.T) {
	r := newAdvRig(t, `{"server": "s", "tools": {
	  "book":  {"key": ["/room"]},
	  "book2": {"key": ["/room", "/who"]}}}`, Options{}, func(s *mcp.Server, u *tally) {
		u.add(s, "book", nil)
		u.add(s, "book2", nil)
	})
	cs := r.connect(t)
	for _, tc := range []struct {
		tool string
		ways []string
	}{
		{"book", []string{`{"room": 42}`, `{"room": 42.0}`, `{"room": 4.2e1}`}},
		{"book", []string{`{"room": {"floor": 1, "n": 2}}`, `{"room": {"n": 2, "floor": 1}}`}},
		{"book2", []string{`{"room": "a", "who": "ann"}`, `{"room": "\u0061", "who": "ann"}`}},
	} {
		before := r.up.n(tc.tool)
		for _, args := range tc.ways {
			res, err := cs.CallTool(t.Context(), rawCall("written", tc.tool, args))
			if err != nil || res.IsError {
				t.Fatalf("%s %s: %v %q", tc.tool, args, err, text(res))
			}
		}
		if got := r.up.n(tc.tool) - before; got != 1 {
			t.Errorf("%s written %d ways ran %d times, want once: %v", tc.tool, len(tc.ways), got, tc.ways)
		}
	}
}

// A duplicate of a running call waits for its outcome in a slot of its
// own. A caller that sends duplicates and leaves (its requests
// cancelled) has nothing running and nobody to tell, yet each waiting
// duplicate kept its slot for the tool's whole wait, and the gateway
// refused every other call meanwhile.
func TestDuplicatesWhoseCallersLeftFreeTheirSlots(t *testing.T) {
	r := newAdvRig(t, `{"server": "s", "tools": {"slow": {"wait": "5m"}, "book": {}}}`,
		Options{MaxCalls: 3}, func(s *mcp.Server, u *tally) {
			u.add(s, "slow", nil)
			u.add(s, "book", nil)
		})
	hold := make(chan struct{})
	r.up.hold = hold
	defer close(hold)
	cs := r.connect(t)
	go cs.CallTool(context.Background(), rawCall("left", "slow", `{"n": 1}`))
	waitFor(t, func() bool { return r.up.n("slow") == 1 })
	for range 2 {
		ctx, cancel := context.WithCancel(t.Context())
		errc := make(chan error, 1)
		go func() {
			_, err := cs.CallTool(ctx, rawCall("left", "slow", `{"n": 1}`))
			errc <- err
		}()
		time.Sleep(200 * time.Millisecond) // it meets the claim and waits
		cancel()
		<-errc
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		res, err := cs.CallTool(t.Context(), rawCall("left", "book", `{"room": 1}`))
		if err != nil {
			t.Fatal(err)
		}
		if !res.IsError {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("one call runs and its two duplicates' callers left, yet another call is refused: %q", text(res))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := r.up.n("slow"); n != 1 {
		t.Fatalf("slow ran %d times, want 1", n)
	}
}

// A result over MaxResultBytes cannot be stored. The effect ran, and
// the first caller got its answer; but the action went to review, and
// every later call of the same intent was told "the outcome of this
// call is unknown; a person is checking": a model reads that as "it may
// not have happened", and an operator is asked about an action whose
// outcome is known.
func TestAResultTooLargeToStoreIsStillReplayedAsPerformed(t *testing.T) {
	big := strings.Repeat("x", 8<<10)
	r := newAdvRig(t, `{"server": "s", "tools": {"export": {}}}`, Options{MaxResultBytes: 4 << 10},
		func(s *mcp.Server, u *tally) {
			u.add(s, "export", func(*mcp.CallToolRequest) *mcp.CallToolResult {
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: big}}}
			})
			u.add(s, "nest", func(*mcp.CallToolRequest) *mcp.CallToolResult {
				var v any = "leaf"
				for range once.MaxResultDepth + 10 {
					v = []any{v}
				}
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "nested"}}, StructuredContent: map[string]any{"v": v}}
			})
		})
	cs := r.connect(t)
	for _, tool := range []string{"export", "nest"} {
		first, err := cs.CallTool(t.Context(), rawCall("big", tool, `{"what": "all"}`))
		if err != nil || first.IsError {
			t.Fatalf("%s, first call: %v %q", tool, err, text(first))
		}
		if tool == "export" && !strings.Contains(text(first), big) {
			t.Fatalf("the first call did not get the whole result: %d bytes of text", len(text(first)))
		}
		again, err := cs.CallTool(t.Context(), rawCall("big", tool, `{"what": "all"}`))
		if err != nil {
			t.Fatal(err)
		}
		if again.IsError || again.Meta[MetaReplayed] != true || !strings.Contains(text(again), "already performed") {
			t.Fatalf("%s, the repeated call: isError %v, meta %v, %q", tool, again.IsError, again.Meta, text(again))
		}
		key, _ := again.Meta[MetaKey].(string)
		a, err := r.gw.Client().Get(t.Context(), once.Key(key))
		if err != nil || a.Status != once.StatusSucceeded {
			t.Fatalf("%s, the action: %v %v; want succeeded", tool, a.Status, err)
		}
		if n := r.up.n(tool); n != 1 {
			t.Fatalf("%s ran %d times, want 1", tool, n)
		}
	}
}

// An upstream served over HTTP with sessions that restarts forgets its
// sessions: the next call is answered 404, session not found, before
// anything runs. The gateway called that an unknown outcome: the call
// went to a person (or a verifier) and the model was told "a person is
// checking", for a call nobody ran.
func TestACallToAnUpstreamThatForgotItsSessionIsSentOnANewOne(t *testing.T) {
	up := &tally{count: map[string]int{}}
	srv := mcp.NewServer(&mcp.Implementation{Name: "tally", Version: "1"}, nil)
	up.add(srv, "book", nil)
	var current atomic.Pointer[http.Handler]
	restart := func() {
		var h http.Handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
		current.Store(&h)
	}
	restart()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*current.Load()).ServeHTTP(w, r) }))
	t.Cleanup(hs.Close)

	store, err := sqlite.Open(filepath.Join(t.TempDir(), "once.db"), sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	if err := store.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	f, err := ParsePolicy(strings.NewReader(`{"server": "s", "tools": {"book": {"key": ["/room"]}}}`))
	if err != nil {
		t.Fatal(err)
	}
	gw, err := New(t.Context(), Options{Store: store, Policy: f, Upstream: func(context.Context) (mcp.Transport, error) {
		return &mcp.StreamableClientTransport{Endpoint: hs.URL}, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close(context.Background()) })
	cs := clientOf(t, gw)

	for i, room := range []string{"a", "b"} {
		if i == 1 {
			restart()
		}
		res, err := cs.CallTool(t.Context(), rawCall("forgot", "book", `{"room": "`+room+`"}`))
		if err != nil || res.IsError {
			t.Fatalf("room %s: %v %q", room, err, text(res))
		}
	}
	if n := up.n("book"); n != 2 {
		t.Fatalf("book ran %d times, want 2", n)
	}
}

// The provider-key argument is the gateway's: it replaces what the
// model wrote. A key pointer into it (or the empty pointer, the whole
// arguments) keyed the call by what the model wrote there, so a retry
// that wrote another value was a new action with a new provider key,
// and the provider charged twice; a verifier argument pointing into it
// never found it (the stored arguments leave it out). Both are refused.
func TestParsePolicyRefusesKeysIntoTheProviderKey(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{`{"server": "m", "tools": {"charge": {"key": ["/idempotency_key"], "provider_key": "idempotency_key"}}}`, "provider_key"},
		{`{"server": "m", "tools": {"charge": {"key": ["/idempotency_key/0"], "provider_key": "idempotency_key"}}}`, "provider_key"},
		{`{"server": "m", "tools": {"charge": {"key": [""], "provider_key": "idempotency_key"}}}`, "whole arguments"},
		{`{"server": "m", "tools": {"charge": {"key": [""]}}}`, "whole arguments"},
		{`{"server": "m", "tools": {"charge": {"provider_key": "k", "recovery": "verify_then_decide",
		   "verifier": {"tool": "find", "arguments": {"id": "/k"}, "landed": "/found"}}}}`, "$provider_key"},
	} {
		_, err := ParsePolicy(strings.NewReader(tc.file))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParsePolicy(%s): %v; want an error saying %q", tc.file, err, tc.want)
		}
	}
	if _, err := ParsePolicy(strings.NewReader(`{"server": "m", "tools": {"charge": {"key": ["/customer"], "provider_key": "idempotency_key", "recovery": "verify_then_decide",
	   "verifier": {"tool": "find", "arguments": {"id": "$provider_key", "c": "/customer"}, "landed": "/found"}}}}`)); err != nil {
		t.Errorf("a sound policy: %v", err)
	}
}

// A verifier's answer is read at its "landed" pointer: true landed,
// false did not, anything else cannot tell. A JSON null decoded into a
// bool without an error and read as false, "did not land": the call
// whose gateway died was run again, although the verifier had said it
// did not know.
func TestAVerifierAnsweringNullCannotTell(t *testing.T) {
	for _, answer := range []string{`null`, `"false"`, `0`, `{}`} {
		t.Run(answer, func(t *testing.T) {
			r := newAdvRig(t, `{"server": "s", "tools": {"send": {"key": ["/to"], "lease": "100ms", "wait": "1s", "recovery": "verify_then_decide",
			   "verifier": {"tool": "find", "arguments": {"to": "/to"}, "landed": "/found"}}}}`, Options{},
				func(s *mcp.Server, u *tally) {
					u.add(s, "send", nil)
					u.add(s, "find", func(*mcp.CallToolRequest) *mcp.CallToolResult {
						var v any
						_ = json.Unmarshal([]byte(answer), &v)
						return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: answer}}, StructuredContent: map[string]any{"found": v}}
					})
				})
			// A gateway claimed the call and died: its claim stands, and
			// its lease lapses.
			p := rawCall("died", "send", `{"to": "ann"}`)
			raw := &mcp.CallToolParamsRaw{Name: p.Name, Arguments: json.RawMessage(`{"to": "ann"}`), Meta: mcp.Meta{MetaRun: "died", MetaStep: float64(0)}}
			m := r.gw.tool("send")
			c, err := r.gw.intentOf("send", &m.policy, raw, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := r.gw.Client().Claim(t.Context(), c.intent); err != nil {
				t.Fatal(err)
			}
			time.Sleep(300 * time.Millisecond)
			cs := r.connect(t)
			res, err := cs.CallTool(t.Context(), p)
			if err != nil {
				t.Fatal(err)
			}
			if n := r.up.n("send"); n != 0 || !res.IsError {
				t.Fatalf("the verifier answered found: %s, and the call was sent again (%d times): %q", answer, n, text(res))
			}
		})
	}
}

// The gateway's _meta members are its word to the caller: whether a
// result is a replay, and the action's key. An upstream that wrote them
// into its own result was believed: a first call came back marked
// replayed, and a model told "nothing was sent" of a call that was.
func TestAnUpstreamCannotSpeakForTheGateway(t *testing.T) {
	r := newAdvRig(t, `{"server": "s", "tools": {"book": {}}}`, Options{}, func(s *mcp.Server, u *tally) {
		u.add(s, "book", func(*mcp.CallToolRequest) *mcp.CallToolResult {
			return &mcp.CallToolResult{Meta: mcp.Meta{MetaReplayed: true, "oncehq.dev/other": "x"},
				Content: []mcp.Content{&mcp.TextContent{Text: "booked"}}}
		})
	})
	cs := r.connect(t)
	res, err := cs.CallTool(t.Context(), rawCall("spoof", "book", `{"room": 1}`))
	if err != nil || res.IsError {
		t.Fatalf("book: %v %q", err, text(res))
	}
	if _, ok := res.Meta[MetaReplayed]; ok || res.Meta["oncehq.dev/other"] != nil {
		t.Fatalf("the first call's result carries the upstream's word for the gateway's: %v", res.Meta)
	}
}

// An upstream that needs the user to visit a URL first (an OAuth sign-in
// with a third party) answers the call with the URLElicitationRequired
// error, before it does anything. The gateway took that for an unknown
// outcome: the call went to review, the model was told a person was
// checking, and the host never saw the URL it should have shown.
func TestAnUpstreamAskingForAURLIsPassedOnAndNothingIsClaimed(t *testing.T) {
	var signedIn atomic.Bool
	r := newAdvRig(t, `{"server": "s", "tools": {"post": {"key": ["/channel"]}}}`, Options{}, func(s *mcp.Server, u *tally) {
		s.AddTool(&mcp.Tool{Name: "post", InputSchema: map[string]any{"type": "object"}},
			func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				if !signedIn.Load() {
					return nil, mcp.URLElicitationRequiredError([]*mcp.ElicitParams{{Mode: "url", URL: "https://chat.example.com/oauth", ElicitationID: "e1", Message: "sign in to chat"}})
				}
				u.mu.Lock()
				u.count["post"]++
				u.mu.Unlock()
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "posted"}}}, nil
			})
	})
	cs := r.connect(t)
	p := rawCall("url", "post", `{"channel": "ops", "text": "hi"}`)
	res, err := cs.CallTool(t.Context(), p)
	var rpc *jsonrpc.Error
	if !errors.As(err, &rpc) || rpc.Code != mcp.CodeURLElicitationRequired || !strings.Contains(string(rpc.Data), "chat.example.com/oauth") {
		t.Fatalf("the call: %v (result %v); want the upstream's URLElicitationRequired error, with its URL", err, res)
	}
	m := r.gw.tool("post")
	raw := &mcp.CallToolParamsRaw{Name: "post", Arguments: json.RawMessage(`{"channel": "ops", "text": "hi"}`), Meta: mcp.Meta{MetaRun: "url", MetaStep: float64(0)}}
	c, err := r.gw.intentOf("post", &m.policy, raw, nil)
	if err != nil {
		t.Fatal(err)
	}
	key, _, _ := once.KeyOf(c.intent)
	if a, err := r.gw.Client().Get(t.Context(), key); err != nil || a.Status != once.StatusReleased {
		t.Fatalf("the action: %v %v; want released (nothing ran)", a.Status, err)
	}
	signedIn.Store(true)
	res, err = cs.CallTool(t.Context(), p)
	if err != nil || res.IsError || r.up.n("post") != 1 {
		t.Fatalf("after signing in: %v %q, posted %d times", err, text(res), r.up.n("post"))
	}
}

// A server refuses a call it will not process at all (the client lacks
// a capability it requires, or speaks a protocol version it does not)
// with the protocol's own error codes, before anything runs. The
// gateway called each an unknown outcome: every call went to review,
// and an operator was asked about calls that never ran.
func TestAnUpstreamRefusingTheProtocolIsNotAnUnknownOutcome(t *testing.T) {
	for _, code := range []int64{mcp.CodeMissingRequiredClientCapabilities, mcp.CodeUnsupportedProtocolVersion} {
		r := newAdvRig(t, `{"server": "s", "tools": {"post": {}}}`, Options{}, func(s *mcp.Server, u *tally) {
			s.AddTool(&mcp.Tool{Name: "post", InputSchema: map[string]any{"type": "object"}},
				func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
					return nil, &jsonrpc.Error{Code: code, Message: "refused by the protocol"}
				})
		})
		cs := r.connect(t)
		res, err := cs.CallTool(t.Context(), rawCall("proto", "post", `{"text": "hi"}`))
		if err != nil {
			t.Fatal(err)
		}
		key, _ := res.Meta[MetaKey].(string)
		a, gerr := r.gw.Client().Get(t.Context(), once.Key(key))
		if gerr != nil || a.Status == once.StatusReview || strings.Contains(text(res), "a person is checking") {
			t.Fatalf("code %d: the action is %v (%v), the model read %q", code, a.Status, gerr, text(res))
		}
	}
}

// The verifier is called directly upstream, unclaimed, each time a call
// whose gateway died is checked: a verifier that is the tool itself
// sends the message again to find out whether it was sent, and one the
// file itself says is not read-only has effects of its own.
func TestParsePolicyRefusesAVerifierWithEffects(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{`{"server": "m", "tools": {"send": {"key": ["/to"], "recovery": "verify_then_decide",
		   "verifier": {"tool": "send", "arguments": {"to": "/to"}, "landed": "/found"}}}}`, "the tool itself"},
		{`{"server": "m", "tools": {"send": {"key": ["/to"], "recovery": "verify_then_decide",
		   "verifier": {"tool": "find", "arguments": {"to": "/to"}, "landed": "/found"}},
		   "find": {"read_only": false}}}`, "read_only"},
	} {
		_, err := ParsePolicy(strings.NewReader(tc.file))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParsePolicy(%s): %v; want an error saying %q", tc.file, err, tc.want)
		}
	}
	if _, err := ParsePolicy(strings.NewReader(`{"server": "m", "tools": {"send": {"key": ["/to"], "recovery": "verify_then_decide",
	   "verifier": {"tool": "find", "arguments": {"to": "/to"}, "landed": "/found"}}, "find": {"read_only": true}}}`)); err != nil {
		t.Errorf("a sound policy: %v", err)
	}
}

// hangTransport is an upstream that accepts no connection: its Connect
// waits for release or the context.
type hangTransport struct{ release chan struct{} }

func (h hangTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-h.release:
		return nil, errors.New("the upstream is gone")
	}
}

// While the gateway connects again to an upstream that hangs (a command
// that starts and never answers initialize, a URL that accepts and
// never replies), the connect was bounded only by the first call's
// attempt (MaxExecution, 5 minutes by default), and every other call
// waited on the connection's lock whatever its own deadline: a call
// with a one-second timeout waited the five minutes too.
func TestACallWaitingForTheUpstreamsConnectionKeepsItsOwnDeadline(t *testing.T) {
	defer func(d time.Duration) { connectTimeout = d }(connectTimeout)
	connectTimeout = 2 * time.Second
	store, err := sqlite.Open(filepath.Join(t.TempDir(), "once.db"), sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	if err := store.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	f, err := ParsePolicy(strings.NewReader(`{"server": "s", "tools": {"book": {"max_execution": "30s"}, "look": {"read_only": true}}}`))
	if err != nil {
		t.Fatal(err)
	}
	up := &tally{count: map[string]int{}}
	srv := mcp.NewServer(&mcp.Implementation{Name: "tally", Version: "1"}, nil)
	up.add(srv, "book", nil)
	up.add(srv, "look", nil)
	release := make(chan struct{})
	var first *mcp.ServerSession
	var dials atomic.Int32
	gw, err := New(t.Context(), Options{Store: store, Policy: f, Upstream: func(ctx context.Context) (mcp.Transport, error) {
		if dials.Add(1) > 1 {
			return hangTransport{release}, nil
		}
		ct, st := mcp.NewInMemoryTransports()
		ss, err := srv.Connect(ctx, st, nil)
		first = ss
		return ct, err
	}})
	if err != nil {
		t.Fatal(err)
	}
	closeAtEnd(t, gw)
	t.Cleanup(func() { close(release) })
	ct, st := mcp.NewInMemoryTransports()
	if _, err := gw.Server().Connect(t.Context(), st, nil); err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(t.Context(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })

	// The upstream goes away; the next call connects again, and hangs.
	first.Close()
	waitFor(t, func() bool {
		gw.up.mu.Lock()
		defer gw.up.mu.Unlock()
		return gw.up.session == nil
	})
	booked := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, _ := cs.CallTool(context.Background(), rawCall("hang", "book", `{"room": 1}`))
		booked <- res
	}()
	waitFor(t, func() bool { return dials.Load() == 2 })
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	began := time.Now()
	looked := make(chan error, 1)
	go func() {
		_, err := gw.up.call(ctx, &mcp.CallToolParams{Name: "look", Arguments: map[string]any{}})
		looked <- err
	}()
	select {
	case err := <-looked:
		if err == nil {
			t.Fatal("a call through a hung connection answered")
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("a call with a 1s timeout still waits after %s for another call's connection", time.Since(began).Round(time.Second))
	}
	select {
	case res := <-booked:
		if res == nil || !res.IsError || !strings.Contains(text(res), "not performed") {
			t.Fatalf("the call whose connect hung: %v", res)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the call whose connect hung still waits after %s", time.Since(began).Round(time.Second))
	}
	if up.n("book") != 0 {
		t.Fatal("book ran")
	}
}

// Each tools/list_changed the upstream sends started a listing of its
// whole tool list (up to 10,000 tools) in a goroutine of its own: an
// upstream that sent them faster than it answered the listings had the
// gateway hold as many listings open at once as it sent notifications.
func TestListChangedNotificationsDoNotPileUpListings(t *testing.T) {
	var armed atomic.Bool
	var open, most atomic.Int32
	gate := make(chan struct{})
	var srv *mcp.Server
	r := newAdvRig(t, `{"server": "s"}`, Options{}, func(s *mcp.Server, u *tally) {
		srv = s
		u.add(s, "book", nil)
		s.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
			return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
				if method == "tools/list" && armed.Load() {
					n := open.Add(1)
					defer open.Add(-1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					<-gate
				}
				return next(ctx, method, req)
			}
		})
	})
	_ = r
	armed.Store(true)
	for i := range 30 {
		srv.AddTool(&mcp.Tool{Name: "t" + strconv.Itoa(i), InputSchema: map[string]any{"type": "object"}},
			func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				return &mcp.CallToolResult{}, nil
			})
		time.Sleep(20 * time.Millisecond) // past the SDK's 10 ms debounce: one notification each
	}
	time.Sleep(200 * time.Millisecond)
	got := most.Load()
	close(gate)
	if got > 2 {
		t.Fatalf("%d listings of the upstream's tools were open at once, for 30 notifications", got)
	}
	// The last change is mirrored all the same.
	cs := r.connect(t)
	waitFor(t, func() bool {
		n := 0
		for _, err := range cs.Tools(t.Context(), nil) {
			if err != nil {
				t.Fatal(err)
			}
			n++
		}
		return n == 31
	})
}

// Close waits for the calls running and closes the upstream. A call that
// came after (an HTTP request the server's shutdown let through, or a
// tools/list_changed refresh) connected to the upstream again: a
// command started after its gateway had closed, left running, and an
// effect performed by a gateway that had said it was done.
func TestNothingReachesTheUpstreamAfterClose(t *testing.T) {
	r := newAdvRig(t, `{"server": "s", "tools": {"book": {}}}`, Options{}, func(s *mcp.Server, u *tally) {
		u.add(s, "book", nil)
	})
	cs := r.connect(t)
	if err := r.gw.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	res, err := cs.CallTool(t.Context(), rawCall("closed", "book", `{"room": 1}`))
	if err != nil {
		t.Fatal(err)
	}
	if n := r.up.n("book"); n != 0 || !res.IsError {
		t.Fatalf("after Close, book ran %d times: %q", n, text(res))
	}
	if _, err := r.gw.up.tools(t.Context()); err == nil {
		t.Fatal("after Close, the upstream's tools were listed")
	}
}
