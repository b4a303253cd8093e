package main

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
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/lab/mailbox"
	"github.com/oncehq/once/lab/provider"
	"github.com/oncehq/once/postgres"
	"github.com/oncehq/once/smtpsend"
	"github.com/oncehq/once/sqlite"
)

// The agent runs as a real process, killed with a real SIGKILL: the test
// binary started again with childEnv set runs main's run instead of the
// tests.
const childEnv = "ONCE_AGENT_EXAMPLE_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines leaked:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// steps is how many steps a run has, and so boundaries the pauses mark:
// before each step and after the last.
const steps = 6

// env is what one run talks to: a mail server and a provider on
// loopback, and the ledger's database.
type env struct {
	mail     *mailbox.Server
	provider *provider.Provider
	provURL  string
	db       string // the --db flag
	runID    string
	// ledger opens a client on the ledger, for the checks and for the
	// person who resolves a review (call it while no agent runs on
	// SQLite).
	ledger func(t *testing.T) (*once.Client, func())
	// orders counts the orders table's rows for the run.
	orders func(t *testing.T) int
}

type hooks struct {
	mailBeforeReply     func(mailbox.Message)
	providerBeforeReply func(*http.Request, provider.Object)
	providerLog         func(provider.Request)
}

// newEnv starts the loopback servers and names the database for store
// ("sqlite" or "postgres").
func newEnv(t *testing.T, store string, h hooks) *env {
	t.Helper()
	e := &env{runID: "order-" + randomHex(4)}
	var err error
	e.mail, err = mailbox.Start(mailbox.Config{BeforeReply: h.mailBeforeReply})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.mail.Close() })

	provClient, _ := testdb.SQLiteClient(t, once.Config{})
	e.provider, err = provider.New(provider.Config{Client: provClient, BeforeReply: h.providerBeforeReply, Log: h.providerLog})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(e.provider)
	t.Cleanup(srv.Close)
	e.provURL = srv.URL

	switch store {
	case "sqlite":
		path := filepath.Join(t.TempDir(), "agent.db")
		e.db = path
		e.ledger = func(t *testing.T) (*once.Client, func()) {
			s, err := sqlite.Open(path, sqlite.Config{})
			if err != nil {
				t.Fatal(err)
			}
			c, err := once.New(once.Config{Store: s})
			if err != nil {
				t.Fatal(err)
			}
			return c, func() { s.Close() }
		}
		e.orders = func(t *testing.T) int {
			s, err := sqlite.Open(path, sqlite.Config{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			var n int
			if err := s.DB().QueryRow(`SELECT count(*) FROM orders WHERE run_id = ?`, e.runID).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
	case "postgres":
		base := testdb.RequirePostgres(t)
		schema := "once_agent_" + randomHex(6)
		sep := "?"
		if strings.Contains(base, "?") {
			sep = "&"
		}
		// A small pool: the shared server allows 100 connections.
		e.db = base + sep + "pool_max_conns=2&once_schema=" + schema
		open := func(t *testing.T) *postgres.Store {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			s, err := testdb.RetryTooManyClients(ctx, func() (*postgres.Store, error) {
				return postgres.Open(ctx, base+sep+"pool_max_conns=2", postgres.Config{Schema: schema})
			})
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
		t.Cleanup(func() {
			s := open(t)
			defer s.Close()
			if _, err := s.Pool().Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`); err != nil {
				t.Errorf("dropping schema %s: %v", schema, err)
			}
		})
		e.ledger = func(t *testing.T) (*once.Client, func()) {
			s := open(t)
			c, err := once.New(once.Config{Store: s})
			if err != nil {
				t.Fatal(err)
			}
			return c, func() { s.Close() }
		}
		e.orders = func(t *testing.T) int {
			s := open(t)
			defer s.Close()
			var n int
			q := `SELECT count(*) FROM ` + pgx.Identifier{schema, "orders"}.Sanitize() + ` WHERE run_id = $1`
			if err := s.Pool().QueryRow(context.Background(), q, e.runID).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
	default:
		t.Fatalf("unknown store %q", store)
	}
	return e
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// agentProc is one agent process.
type agentProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string // stdout, line by line; closed at its end
	mu    sync.Mutex
	out   []string // every stdout line so far
	err   bytes.Buffer
	done  chan struct{}
	code  int
}

// start starts the agent on e with the given extra flags. The lease is
// short, so a resumed run does not wait long for a killed run's claim,
// and long enough that a live run starved of CPU for a moment under the
// race detector keeps its claim.
func (e *env) start(t *testing.T, extra ...string) *agentProc {
	t.Helper()
	args := append([]string{"--run", e.runID, "--db", e.db, "--smtp", e.mail.Addr(), "--provider", e.provURL, "--lease", "3s", "--step-timeout", "30s"}, extra...)
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	p := &agentProc{cmd: cmd, lines: make(chan string, 100), done: make(chan struct{})}
	cmd.Stderr = &p.err
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.mu.Lock()
			p.out = append(p.out, sc.Text())
			p.mu.Unlock()
			p.lines <- sc.Text()
		}
		close(p.lines)
		err := cmd.Wait()
		p.code = 0
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			p.code = ee.ExitCode()
		} else if err != nil {
			p.code = -1
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.done
	})
	return p
}

// transcript is everything the process printed so far.
func (p *agentProc) transcript() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.out, "\n") + "\n" + p.err.String()
}

// waitPause reads lines up to the next pause marker and returns it.
func (p *agentProc) waitPause(t *testing.T) string {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				t.Fatalf("the agent ended before its next pause:\n%s", p.transcript())
			}
			if strings.HasPrefix(line, "pause: ") {
				return line
			}
		case <-timeout:
			t.Fatalf("no pause within 60s:\n%s", p.transcript())
		}
	}
}

// kill SIGKILLs the process and waits for it.
func (p *agentProc) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	p.wait(t)
}

// wait waits for the process to end and returns its exit code.
func (p *agentProc) wait(t *testing.T) int {
	t.Helper()
	go func() {
		for range p.lines { // drain, so the reader reaches Wait
		}
	}()
	select {
	case <-p.done:
	case <-time.After(90 * time.Second):
		t.Fatalf("the agent did not end within 90s:\n%s", p.transcript())
	}
	return p.code
}

// stepLine matches a step's final line in the transcript.
var stepLine = regexp.MustCompile(`^step (\d+) +(\S+) +(\S+) +(ran|replayed|review|refused|failed|gave up) +key ([0-9a-f]{12}) +(\S+)`)

// outcomes returns each step's final word (ran, replayed, review…) from
// a transcript.
func outcomes(transcript string) map[int]string {
	m := map[int]string{}
	for _, line := range strings.Split(transcript, "\n") {
		if g := stepLine.FindStringSubmatch(line); g != nil {
			var n int
			fmt.Sscan(g[1], &n)
			m[n] = g[4]
		}
	}
	return m
}

// stores runs f for each store the agent takes.
func stores(t *testing.T, f func(t *testing.T, store string)) {
	for _, store := range []string{"sqlite", "postgres"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			f(t, store)
		})
	}
}

// checkExactlyOnce checks every effect of the run happened once: one
// message per email step's Message-ID, one object per provider key (and
// the given number of requests with it), one order row, and six
// succeeded steps in the ledger.
func checkExactlyOnce(t *testing.T, e *env, requests map[string]int) {
	t.Helper()
	c, done := e.ledger(t)
	acts, err := c.RunSteps(context.Background(), e.runID)
	done()
	if err != nil {
		t.Fatal(err)
	}
	if len(acts) != steps {
		t.Fatalf("the ledger has %d steps for the run, want %d: %+v", len(acts), steps, acts)
	}
	kinds := []string{"send_email", "create_customer", "charge_card", "record_order", "send_email", "send_email"}
	for i, a := range acts {
		if a.Step != int64(i) || a.Kind != kinds[i] || a.Status != once.StatusSucceeded {
			t.Errorf("step %d in the ledger: step %d, kind %s, status %s; want kind %s, succeeded", i, a.Step, a.Kind, a.Status, kinds[i])
		}
		switch a.Kind {
		case "send_email":
			id := smtpsend.MessageID(a.Key, "")
			if n := e.mail.Count(id); n != 1 {
				t.Errorf("step %d: the mailbox holds %d messages with Message-ID %s, want 1", i, n, id)
			}
		case "create_customer", "charge_card":
			// The provider key is the action's key.
			if n := len(e.provider.Created(string(a.Key))); n != 1 {
				t.Errorf("step %d (%s): the provider created %d objects with key %.12s, want 1", i, a.Kind, n, a.Key)
			}
			want := 1
			if r, ok := requests[a.Kind]; ok {
				want = r
			}
			if n := e.provider.Requests(string(a.Key)); n != want {
				t.Errorf("step %d (%s): the provider saw %d requests with key %.12s, want %d", i, a.Kind, n, a.Key, want)
			}
		}
	}
	if n := len(e.mail.Messages()); n != 3 {
		t.Errorf("the mailbox holds %d messages, want 3", n)
	}
	if n := len(e.provider.Objects()); n != 2 {
		t.Errorf("the provider created %d objects, want 2 (a customer and a charge): %+v", n, e.provider.Objects())
	}
	if n := e.orders(t); n != 1 {
		t.Errorf("the orders table has %d rows for the run, want 1", n)
	}
}

// TestKillAtEveryStepBoundary kills the run with SIGKILL at each boundary
// (before each step, and after the last), resumes it without pausing, and
// checks that the steps before the boundary replay, the steps after it
// run, and every effect happened once.
func TestKillAtEveryStepBoundary(t *testing.T) {
	stores(t, func(t *testing.T, store string) {
		for n := 0; n <= steps; n++ {
			t.Run(fmt.Sprintf("boundary%d", n), func(t *testing.T) {
				e := newEnv(t, store, hooks{})
				p := e.start(t, "--pause-before-each-step")
				for i := 0; i <= n; i++ {
					marker := p.waitPause(t)
					want := fmt.Sprintf("pause: before step %d ", i)
					if i == steps {
						want = "pause: after the last step"
					}
					if !strings.HasPrefix(marker, want) {
						t.Fatalf("pause %d is %q, want it to start with %q", i, marker, want)
					}
					if i < n {
						io.WriteString(p.stdin, "\n")
					}
				}
				p.kill(t)
				first := outcomes(p.transcript())
				for i := range steps {
					if want := map[bool]string{true: "ran", false: ""}[i < n]; first[i] != want {
						t.Errorf("killed run: step %d %q, want %q\n%s", i, first[i], want, p.transcript())
					}
				}

				q := e.start(t)
				if code := q.wait(t); code != exitOK {
					t.Fatalf("resumed run exited %d, want 0:\n%s", code, q.transcript())
				}
				second := outcomes(q.transcript())
				for i := range steps {
					want := "ran"
					if i < n {
						want = "replayed"
					}
					if second[i] != want {
						t.Errorf("resumed run: step %d %q, want %q\n%s", i, second[i], want, q.transcript())
					}
				}
				checkExactlyOnce(t, e, nil)
			})
		}
	})
}

// TestKillInsideProviderCall kills the run while its charge is held in
// the provider's handler, after the charge was made: the run died not
// knowing. The resumed run waits out the dead attempt's lease, and
// RetryWithProviderKey sends the call again with the same Idempotency-Key.
//
// If the provider finished the first call meanwhile, it answers the retry
// from its store: two requests, one charge, and the step ran as attempt 2.
// If the provider is still busy with the first call, it answers 409; the
// run waits and sends the call again (a new attempt each time, the same
// key), until the provider has finished and replays: more requests, still
// one charge.
func TestKillInsideProviderCall(t *testing.T) {
	for _, busy := range []bool{false, true} {
		name := map[bool]string{false: "provider finished", true: "provider still busy"}[busy]
		t.Run(name, func(t *testing.T) {
			stores(t, func(t *testing.T, store string) { killInsideProviderCall(t, store, busy) })
		})
	}
}

func killInsideProviderCall(t *testing.T, store string, busy bool) {
	held := make(chan struct{})
	release := make(chan struct{})
	answered := make(chan provider.Request, 100)
	e := newEnv(t, store, hooks{
		providerBeforeReply: func(_ *http.Request, o provider.Object) {
			if o.Object == "charge" {
				close(held)
				<-release
			}
		},
		providerLog: func(r provider.Request) {
			if r.Path == "/v1/charges" {
				answered <- r
			}
		},
	})
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(free)
	p := e.start(t)
	select {
	case <-held:
	case <-time.After(60 * time.Second):
		t.Fatalf("the charge never reached the provider:\n%s", p.transcript())
	}
	p.kill(t)
	if got := outcomes(p.transcript()); got[2] != "" {
		t.Fatalf("the killed run finished step 2 (%q); it should have died in it:\n%s", got[2], p.transcript())
	}

	if !busy {
		// The provider finishes the call and stores its answer, which
		// nobody receives.
		free()
		select {
		case r := <-answered:
			if r.Nth != 1 || r.Created == nil {
				t.Fatalf("first charge request: %+v; want request 1, which created the charge", r)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the provider did not finish the held charge")
		}
	}

	q := e.start(t)
	if busy {
		// Let the provider finish only once the resumed run has been
		// told it is still busy with the key.
		deadline := time.After(60 * time.Second)
	wait:
		for {
			select {
			case line, ok := <-q.lines:
				if !ok {
					t.Fatalf("the resumed run ended before the provider was released:\n%s", q.transcript())
				}
				if strings.Contains(line, "waiting") && strings.Contains(line, "the provider answered 409 Conflict") {
					break wait
				}
			case <-deadline:
				t.Fatalf("the resumed run never met the busy provider:\n%s", q.transcript())
			}
		}
		free()
	}
	if code := q.wait(t); code != exitOK {
		t.Fatalf("resumed run exited %d, want 0:\n%s", code, q.transcript())
	}
	out := q.transcript()
	got := outcomes(out)
	want := map[int]string{0: "replayed", 1: "replayed", 2: "ran", 3: "ran", 4: "ran", 5: "ran"}
	for i := range steps {
		if got[i] != want[i] {
			t.Errorf("resumed run: step %d %q, want %q\n%s", i, got[i], want[i], out)
		}
	}
	attempt := "2"
	if busy {
		attempt = `\d+`
	}
	if !regexp.MustCompile(`(?m)^step 2 .* ran .*\(attempt ` + attempt + `; the provider answered the retried call from its idempotency store\)$`).MatchString(out) {
		t.Errorf("step 2 should say it ran as attempt %s, answered from the provider's store:\n%s", attempt, out)
	}

	// What the provider saw: the first request created the charge, the
	// last one was answered from its store, and any in between (busy)
	// were refused with 409.
	var reqs []provider.Request
	for len(answered) > 0 {
		reqs = append(reqs, <-answered)
	}
	last := reqs[len(reqs)-1]
	if !last.Replayed || last.Created != nil || last.Status != 200 {
		t.Errorf("last charge request: %+v; want one answered from the store, nothing created", last)
	}
	n := 2
	if busy {
		n = len(reqs)
		refused := 0
		for _, r := range reqs {
			if r.Status == http.StatusConflict {
				refused++
				if r.Created != nil {
					t.Errorf("a refused request created something: %+v", r)
				}
			}
		}
		if refused == 0 || refused != n-2 {
			t.Errorf("%d charge requests, %d of them refused with 409; want the first, the refused ones, and the replayed one", n, refused)
		}
	}
	checkExactlyOnce(t, e, map[string]int{"charge_card": n})
}

// TestKillInsideEmail kills the run after the mail server read the first
// message whole and before it replied: the message arrived, and the run
// died not knowing. Email has no key a server honours, so the resumed
// run does not send it again: once the dead attempt's lease is out,
// AskPerson puts the step up for review and the run stops with exit
// status 3, naming the Message-ID to search for. The person finds it in
// the mailbox and records it done; the run, started again, replays the
// step and finishes. One copy of the message, whatever happened.
func TestKillInsideEmail(t *testing.T) {
	stores(t, func(t *testing.T, store string) {
		held := make(chan mailbox.Message, 1)
		release := make(chan struct{})
		var firstOnly sync.Once
		e := newEnv(t, store, hooks{
			mailBeforeReply: func(m mailbox.Message) {
				first := false
				firstOnly.Do(func() { first = true })
				if first {
					held <- m
					<-release
				}
			},
		})
		t.Cleanup(func() {
			select {
			case <-release:
			default:
				close(release)
			}
		})
		p := e.start(t)
		var m mailbox.Message
		select {
		case m = <-held:
		case <-time.After(60 * time.Second):
			t.Fatalf("the first email never reached the server:\n%s", p.transcript())
		}
		p.kill(t)
		close(release)

		q := e.start(t)
		if code := q.wait(t); code != exitReview {
			t.Fatalf("resumed run exited %d, want %d (a person decides):\n%s", code, exitReview, q.transcript())
		}
		out := q.transcript()
		if got := outcomes(out); got[0] != "review" || len(got) != 1 {
			t.Fatalf("resumed run: steps %v, want step 0 in review and nothing after it:\n%s", got, out)
		}
		if !strings.Contains(out, "Message-ID "+m.MessageID) {
			t.Fatalf("the review note does not name the Message-ID %s to search for:\n%s", m.MessageID, out)
		}

		// The person: search the mailbox by the Message-ID the note
		// names, find the message, and record that it was sent.
		if _, ok := e.mail.Find(m.MessageID); !ok {
			t.Fatalf("the mailbox has no message %s", m.MessageID)
		}
		key := once.Key(strings.TrimSuffix(strings.TrimPrefix(m.MessageID, "<"), "@once>"))
		c, done := e.ledger(t)
		a, err := c.Resolve(context.Background(), key, once.Resolution{
			Decision: once.DecisionDone, Result: json.RawMessage(`"found in the mailbox"`), By: "test", Note: "Message-ID found in the mailbox",
		})
		done()
		if err != nil || a.Status != once.StatusSucceeded || a.Step != 0 {
			t.Fatalf("resolving step 0: %+v, %v", a, err)
		}

		r := e.start(t)
		if code := r.wait(t); code != exitOK {
			t.Fatalf("the run after the review exited %d, want 0:\n%s", code, r.transcript())
		}
		out = r.transcript()
		got := outcomes(out)
		want := map[int]string{0: "replayed", 1: "ran", 2: "ran", 3: "ran", 4: "ran", 5: "ran"}
		for i := range steps {
			if got[i] != want[i] {
				t.Errorf("run after the review: step %d %q, want %q\n%s", i, got[i], want[i], out)
			}
		}
		if !regexp.MustCompile(`(?m)^step 0 .* replayed .* found in the mailbox$`).MatchString(out) {
			t.Errorf("step 0 should replay the person's result:\n%s", out)
		}
		checkExactlyOnce(t, e, nil)
	})
}

// TestFlags checks that bad flags are refused with a message naming the
// flag, before anything is opened.
func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--run is required"},
		{[]string{"--run", " "}, "--run is required"},
		{[]string{"--run", "r", "--lease", "10ms"}, "--lease 10ms is too short"},
		{[]string{"--run", "r", "--smtp", "localhost"}, `--smtp "localhost" is not HOST:PORT`},
		{[]string{"--run", "r", "--provider", "127.0.0.1:8025"}, `--provider "127.0.0.1:8025" is not an http:// or https:// URL`},
		{[]string{"--run", "r", "--step-timeout", "0s"}, "--step-timeout 0s must be positive"},
		{[]string{"--run", "r", "extra"}, `unexpected argument "extra"`},
		{[]string{"--nope"}, "flag provided but not defined: -nope"},
	} {
		var out, errOut bytes.Buffer
		code := run(context.Background(), tc.args, strings.NewReader(""), &out, &errOut)
		if code != exitUsage || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("agent %q: exit %d, stderr %q; want exit %d and %q", tc.args, code, errOut.String(), exitUsage, tc.want)
		}
	}
}

// TestBadDatabase checks that a --db that is neither a SQLite path nor a
// postgres:// URL is refused by name, not made into a file.
func TestBadDatabase(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	for _, db := range []string{"mysql://u@h/db", "postgres:/h/db", ""} {
		var out, errOut bytes.Buffer
		code := run(context.Background(), []string{"--run", "r", "--db", db}, strings.NewReader(""), &out, &errOut)
		if code != exitError || !strings.Contains(errOut.String(), "--db") {
			t.Errorf("--db %q: exit %d, stderr %q; want exit %d and a message about --db", db, code, errOut.String(), exitError)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("files were created: %v", entries)
	}
}

// TestChangedStepIsRefused resumes a finished run whose first email now
// says something else (another sender): the step's payload is
// fingerprinted beside its key, so the changed step is refused, not sent
// as a second, different email, and the run stops with exit status 1.
func TestChangedStepIsRefused(t *testing.T) {
	e := newEnv(t, "sqlite", hooks{})
	p := e.start(t)
	if code := p.wait(t); code != exitOK {
		t.Fatalf("first run exited %d:\n%s", code, p.transcript())
	}
	q := e.start(t, "--from", "sales@example.com")
	if code := q.wait(t); code != exitError {
		t.Fatalf("changed run exited %d, want %d:\n%s", code, exitError, q.transcript())
	}
	out := q.transcript()
	if got := outcomes(out); got[0] != "refused" || len(got) != 1 {
		t.Fatalf("changed run: steps %v, want step 0 refused and nothing after it:\n%s", got, out)
	}
	if !strings.Contains(out, "was first attempted with payload") {
		t.Errorf("the refusal does not say the payload differs:\n%s", out)
	}
	checkExactlyOnce(t, e, nil)
}
