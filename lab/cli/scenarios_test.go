package cli_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/dburl"
	"github.com/oncehq/once/internal/faultproxy"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/lab/provider"
	"github.com/oncehq/once/protocol"
)

// scenarioFile is clients/scenarios.json: the scenarios every client of
// the protocol passes, and the kinds file of the server they run on.
type scenarioFile struct {
	About     string          `json:"about"`
	Kinds     json.RawMessage `json:"kinds"`
	Scenarios []scenario      `json:"scenarios"`
}

// scenario is one behaviour, and what it must end as. Drive names how
// the driver plays it (scenarioDrives); the rest are its parameters.
type scenario struct {
	ID          string            `json:"id"`
	Description string            `json:"description"`
	Drive       string            `json:"drive"`
	Kind        string            `json:"kind"`
	Workers     int               `json:"workers,omitempty"`
	KillAt      string            `json:"kill_at,omitempty"`
	Verifier    bool              `json:"verifier,omitempty"`
	Cut         string            `json:"cut,omitempty"`
	Payloads    []json.RawMessage `json:"payloads,omitempty"`
	RefuseFirst int               `json:"refuse_first,omitempty"`
	Expect      scenarioExpect    `json:"expect"`
}

type scenarioExpect struct {
	Status           once.Status `json:"status"`
	Attempt          int         `json:"attempt"`
	ProviderRequests int         `json:"provider_requests"`
	ProviderCreated  int         `json:"provider_created"`
	Verdict          string      `json:"verdict,omitempty"`
	// Between is the action after the first worker ended and before
	// the second started (drive "sequence").
	Between *struct {
		Status  once.Status `json:"status"`
		Attempt int         `json:"attempt"`
	} `json:"between,omitempty"`
	// Workers is how each worker process ends, by name ("*": every one
	// not named).
	Workers map[string]string `json:"workers"`
}

// scenarioDrives are the ways a scenario is played, each with the
// worker names it starts.
var scenarioDrives = map[string]func(t *testing.T, r *scenarioRun){
	"race":       driveRace,
	"kill":       driveKill,
	"pause":      drivePause,
	"lost_reply": driveLostReply,
	"sequence":   driveSequence,
	"restart":    driveRestart,
}

// loadScenarios reads and checks the scenario file: a mistake in it is
// a scenario that silently tests nothing.
func loadScenarios(t *testing.T) scenarioFile {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "clients", "scenarios.json"))
	if err != nil {
		t.Fatal(err)
	}
	var f scenarioFile
	d := json.NewDecoder(bytes.NewReader(raw))
	d.DisallowUnknownFields()
	if err := d.Decode(&f); err != nil {
		t.Fatalf("clients/scenarios.json: %v", err)
	}
	seen := map[string]bool{}
	for _, sc := range f.Scenarios {
		problem := ""
		switch {
		case sc.ID == "" || seen[sc.ID]:
			problem = "an id, unique"
		case sc.Description == "":
			problem = "a description"
		case scenarioDrives[sc.Drive] == nil:
			problem = "a drive, one of race, kill, pause, lost_reply, sequence, restart"
		case sc.Kind == "":
			problem = "a kind"
		case sc.Drive == "race" && sc.Workers < 2:
			problem = "workers, 2 or more, for a race"
		case sc.Drive == "kill" && sc.KillAt != "started" && sc.KillAt != "landed":
			problem = `kill_at: "started" (before the provider call) or "landed" (after it)`
		case sc.Drive == "lost_reply" && sc.Cut == "":
			problem = "cut: the request whose reply is lost"
		case sc.Expect.Status == "" || sc.Expect.Attempt < 1 || len(sc.Expect.Workers) == 0:
			problem = "expect: status, attempt and workers"
		case sc.Verifier != (sc.Expect.Verdict != ""):
			problem = "expect.verdict exactly when it has a verifier"
		}
		if problem != "" {
			t.Fatalf("clients/scenarios.json: scenario %q needs %s", sc.ID, problem)
		}
		seen[sc.ID] = true
	}
	if len(f.Scenarios) == 0 {
		t.Fatal("clients/scenarios.json holds no scenario")
	}
	return f
}

// scenarioLang starts worker processes of one language, once prepare
// has found (or built) what it runs.
type scenarioLang struct {
	name    string
	prepare func(t *testing.T, dir string) func() *exec.Cmd
	command func() *exec.Cmd
}

// scenarioLangs are the languages whose workers play the scenarios: Go
// (this test binary again, speaking the protocol with net/http), Python
// and TypeScript (their clients, the TypeScript one built as its own
// suite builds it).
var scenarioLangs = []scenarioLang{
	{name: "go", prepare: func(t *testing.T, _ string) func() *exec.Cmd {
		self, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		return func() *exec.Cmd { return exec.Command(self) }
	}},
	{name: "python", prepare: func(t *testing.T, _ string) func() *exec.Cmd {
		py := need(t, "python3")
		worker, _ := filepath.Abs(filepath.Join("..", "..", "clients", "python", "scenario_worker.py"))
		return func() *exec.Cmd { return exec.Command(py, worker) }
	}},
	{name: "ts", prepare: func(t *testing.T, dir string) func() *exec.Cmd {
		node, worker := need(t, "node"), buildTSWorker(t, dir)
		return func() *exec.Cmd { return exec.Command(node, worker) }
	}},
}

// buildTSWorker compiles clients/ts with its locked typescript in dir, a
// copy of its own, so that no other test's npm ci or build in clients/ts
// meets this one, and returns the worker's script.
func buildTSWorker(t *testing.T, dir string) string {
	npm := need(t, "npm")
	src, _ := filepath.Abs(filepath.Join("..", "..", "clients", "ts"))
	for _, name := range []string{"package.json", "package-lock.json", "tsconfig.json", "src", "scenario"} {
		if out, err := exec.Command("cp", "-R", filepath.Join(src, name), dir).CombinedOutput(); err != nil {
			t.Fatalf("copy clients/ts/%s: %v\n%s", name, err, out)
		}
	}
	for _, args := range [][]string{{"ci", "--no-audit", "--no-fund", "--prefer-offline"}, {"run", "build"}} {
		cmd := exec.Command(npm, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm %v: %v\n%s", args, err, out)
		}
	}
	return filepath.Join(dir, "dist", "scenario", "worker.js")
}

const scenarioToken = "scenario-worker-token-0123456789"

// scenarioEnv is what the scenarios of one language over one store
// share: the database, a protocol server over it, the provider, and the
// Go library's client that reads the ledger.
type scenarioEnv struct {
	db     string
	client *once.Client
	url    string
	prov   *scenarioProvider
	lang   scenarioLang
}

// newScenarioEnv serves /v1 over db in this process, as once serve
// mounts it (protocol.New), with the file's kinds and a bridge for
// client verifiers: once serve takes no kinds file yet.
func newScenarioEnv(t *testing.T, db string, kinds json.RawMessage, lang scenarioLang) *scenarioEnv {
	t.Helper()
	ctx := context.Background()
	mustRun(t, "migrate", "--db", db)
	s, err := dburl.Open(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	v := protocol.NewVerifiers()
	def, byKind, err := protocol.ParseKinds(bytes.NewReader(kinds), v)
	if err != nil {
		t.Fatalf("clients/scenarios.json kinds: %v", err)
	}
	c, err := once.New(once.Config{Store: s, Default: def, Kinds: byKind})
	if err != nil {
		t.Fatal(err)
	}
	p, err := protocol.New(protocol.Config{Client: c, Workers: []string{scenarioToken}, Verifiers: v})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: p}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return &scenarioEnv{db: db, client: c, url: "http://" + ln.Addr().String(), prov: newScenarioProvider(t), lang: lang}
}

// scenarioProvider is lab/provider (customers, keyed by Idempotency-Key,
// counted per key) with what the scenarios add: a lookup by key for the
// verifiers, and refusals of the first calls for a customer.
type scenarioProvider struct {
	p   *provider.Provider
	url string

	mu      sync.Mutex
	refuse  map[string]int // by email: calls still to refuse
	refused map[string]int // by Idempotency-Key: calls refused
}

func newScenarioProvider(t *testing.T) *scenarioProvider {
	c, _ := testdb.SQLiteClient(t, once.Config{})
	p, err := provider.New(provider.Config{Client: c})
	if err != nil {
		t.Fatal(err)
	}
	sp := &scenarioProvider{p: p, refuse: map[string]int{}, refused: map[string]int{}}
	srv := httptest.NewServer(sp)
	t.Cleanup(srv.Close)
	sp.url = srv.URL
	return sp
}

func (sp *scenarioProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if key, ok := strings.CutPrefix(r.URL.Path, "/scenario/landed/"); ok && r.Method == "GET" {
		created := sp.p.Created(key)
		if len(created) == 0 {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]string{"id": created[0].ID})
		return
	}
	if r.Method == "POST" && r.URL.Path == "/v1/customers" {
		body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var c struct{ Email string }
		json.Unmarshal(body, &c)
		sp.mu.Lock()
		refuse := sp.refuse[c.Email] > 0
		if refuse {
			sp.refuse[c.Email]--
			sp.refused[r.Header.Get("Idempotency-Key")]++
		}
		sp.mu.Unlock()
		if refuse {
			http.Error(w, `{"error":"try again later"}`, http.StatusServiceUnavailable)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	sp.p.ServeHTTP(w, r)
}

// requests counts the calls that reached the provider with key, refused
// ones too.
func (sp *scenarioProvider) requests(key string) int {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return sp.refused[key] + sp.p.Requests(key)
}

// scenarioRun is one scenario played in one language over one store.
type scenarioRun struct {
	env      *scenarioEnv
	sc       scenario
	intent   scenarioIntent
	key      once.Key
	procs    map[string]*scenarioProc
	order    []string
	verifier *scenarioProc
}

// TestScenarios plays clients/scenarios.json in each language (Go,
// Python, TypeScript) over each store (SQLite, PostgreSQL): worker
// processes against a protocol server, killed, stopped and cut off for
// real, and the ledger and the provider checked from outside.
func TestScenarios(t *testing.T) {
	f := loadScenarios(t)
	commands := map[string]func() *exec.Cmd{}
	dirs := map[string]string{}
	for _, lang := range scenarioLangs {
		dirs[lang.name] = t.TempDir()
	}
	for store, newDB := range databases(t) {
		t.Run(store, func(t *testing.T) {
			for _, lang := range scenarioLangs {
				t.Run(lang.name, func(t *testing.T) {
					if commands[lang.name] == nil {
						commands[lang.name] = lang.prepare(t, dirs[lang.name])
					}
					lang.command = commands[lang.name]
					env := newScenarioEnv(t, newDB(t), f.Kinds, lang)
					for _, sc := range f.Scenarios {
						t.Run(sc.ID, func(t *testing.T) { playScenario(t, env, sc) })
					}
				})
			}
		})
	}
}

func playScenario(t *testing.T, env *scenarioEnv, sc scenario) {
	var b [4]byte
	rand.Read(b[:])
	tag := hex.EncodeToString(b[:])
	r := &scenarioRun{env: env, sc: sc, procs: map[string]*scenarioProc{}, intent: scenarioIntent{
		Run: sc.ID + "-" + env.lang.name + "-" + tag, Kind: sc.Kind, Target: "ada+" + tag + "@example.com",
		Payload: json.RawMessage(fmt.Sprintf(`{"scenario":%q}`, sc.ID)),
	}}
	if len(sc.Payloads) > 0 {
		r.intent.Payload = sc.Payloads[0]
	}
	k, _, err := once.KeyOf(once.Intent{Run: r.intent.Run, Step: r.intent.Step, Kind: r.intent.Kind, Target: r.intent.Target, Payload: r.intent.Payload})
	if err != nil {
		t.Fatal(err)
	}
	r.key = k
	t.Logf("%s: %s (key %s)", sc.ID, sc.Description, k)
	scenarioDrives[sc.Drive](t, r)
	r.check(t)
}

// job is the job of a worker of the run, named name.
func (r *scenarioRun) job(name string) scenarioJob {
	return scenarioJob{Scenario: r.sc.ID, Name: name, Role: "do", URL: r.env.url, Token: scenarioToken, Provider: r.env.prov.url, Intent: r.intent}
}

// start starts a worker process of the run's language.
func (r *scenarioRun) start(t *testing.T, job scenarioJob) *scenarioProc {
	t.Helper()
	p := startScenarioProc(t, job.Name, r.env.lang.command(), job)
	if job.Role == "verify" {
		r.verifier = p
	} else {
		r.procs[job.Name] = p
		r.order = append(r.order, job.Name)
	}
	return p
}

// redeliver is how long a job is delivered again: longer than any
// scenario's wait for a lease to lapse.
const redeliver = 60_000

func driveRace(t *testing.T, r *scenarioRun) {
	var ps []*scenarioProc
	for i := range r.sc.Workers {
		j := r.job(fmt.Sprintf("w%d", i+1))
		j.Hold, j.Redeliver = "landed", redeliver
		ps = append(ps, r.start(t, j))
	}
	// One holds its effect until every other was told to come back:
	// they all raced for the claim while it was held.
	eventually(t, "one effect held while the others were told in_flight", func() bool {
		landed, waited := 0, 0
		for _, p := range ps {
			switch {
			case p.has(func(e scenarioEvent) bool { return e.Event == "held" }):
				landed++
			case p.has(func(e scenarioEvent) bool { return e.Event == "redeliver" && e.Code == "in_flight" }):
				waited++
			case p.exited():
				r.fail(t, "%s exited while the others raced", p.name)
			}
		}
		return landed > 0 && landed+waited == len(ps)
	})
	for _, p := range ps {
		p.release()
	}
	for _, p := range ps {
		p.wait(t)
	}
}

func driveKill(t *testing.T, r *scenarioRun) {
	j := r.job("a")
	j.Hold = r.sc.KillAt
	a := r.start(t, j)
	a.await(t, r, "held at "+r.sc.KillAt, func(e scenarioEvent) bool { return e.Event == "held" && e.At == r.sc.KillAt })
	a.kill(t)
	if r.sc.Verifier {
		v := r.job("verifier")
		v.Role, v.Kinds, v.Questions, v.VerifyFor = "verify", []string{r.sc.Kind}, 1, redeliver
		r.start(t, v)
	}
	b := r.job("b")
	b.Redeliver = redeliver
	r.start(t, b).wait(t)
	if r.verifier != nil {
		r.verifier.wait(t)
	}
}

func drivePause(t *testing.T, r *scenarioRun) {
	j := r.job("a")
	j.Hold = "landed"
	a := r.start(t, j)
	a.await(t, r, "held after the effect landed", func(e scenarioEvent) bool { return e.Event == "held" })
	a.signal(t, syscall.SIGSTOP)
	b := r.job("b")
	b.Redeliver = redeliver
	r.start(t, b).wait(t)
	a.signal(t, syscall.SIGCONT)
	a.release()
	a.wait(t)
}

func driveLostReply(t *testing.T, r *scenarioRun) {
	proxy, err := faultproxy.Start(strings.TrimPrefix(r.env.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	// An HTTP reply ends anywhere: the first bytes of the server's
	// answer to the marked request are dropped and the connection cut.
	cut := proxy.CutAfter([]byte(r.sc.Cut), nil)
	j := r.job("a")
	j.URL = "http://" + proxy.Addr()
	r.start(t, j).wait(t)
	select {
	case <-cut:
	default:
		r.fail(t, "the proxy never cut the reply to %q: the scenario did not happen", r.sc.Cut)
	}
}

func driveSequence(t *testing.T, r *scenarioRun) {
	if r.sc.RefuseFirst > 0 {
		r.env.prov.mu.Lock()
		r.env.prov.refuse[r.intent.Target] = r.sc.RefuseFirst
		r.env.prov.mu.Unlock()
	}
	r.start(t, r.job("a")).wait(t)
	if want := r.sc.Expect.Between; want != nil {
		a, err := r.env.client.Get(context.Background(), r.key)
		if err != nil {
			t.Fatal(err)
		}
		if a.Status != want.Status || a.Attempt != want.Attempt {
			r.fail(t, "after a: the action is %s at attempt %d; want %s at attempt %d", a.Status, a.Attempt, want.Status, want.Attempt)
		}
	}
	b := r.job("b")
	if len(r.sc.Payloads) > 1 {
		b.Intent.Payload = r.sc.Payloads[1]
	}
	r.start(t, b).wait(t)
}

func driveRestart(t *testing.T, r *scenarioRun) {
	base, srv := startServeProc(t, r.env.db, "127.0.0.1:0")
	j := r.job("a")
	j.Hold, j.URL = "landed", base
	a := r.start(t, j)
	a.await(t, r, "held after the effect landed", func(e scenarioEvent) bool { return e.Event == "held" })
	srv.kill(t)
	// While it is down, the outcome's first try meets a connection
	// closed with no answer (as a server killed mid-request gives): the
	// client must carry it to the server started again.
	addr := strings.TrimPrefix(base, "http://")
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	a.release()
	for seen := false; !seen; {
		ln.(*net.TCPListener).SetDeadline(time.Now().Add(time.Minute))
		c, err := ln.Accept()
		if err != nil {
			r.fail(t, "no outcome reached %s while once serve was down: %v", addr, err)
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		var got []byte
		buf := make([]byte, 4<<10)
		for !seen && len(got) < 64<<10 {
			n, err := c.Read(buf)
			got = append(got, buf[:n]...)
			seen = bytes.Contains(got, []byte("POST /v1/outcome"))
			if err != nil {
				break
			}
		}
		c.Close()
	}
	ln.Close()
	again, srv2 := startServeProc(t, r.env.db, addr)
	if again != base {
		r.fail(t, "once serve came back on %s, not %s", again, base)
	}
	a.wait(t)
	srv2.signal(t, syscall.SIGTERM)
	srv2.wait(t)
}

// startServeProc runs once serve (this test binary as the command) over
// db on addr, with the protocol for scenarioToken, and returns its URL.
func startServeProc(t *testing.T, db, addr string) (string, *scenarioProc) {
	t.Helper()
	tokens := filepath.Join(t.TempDir(), "workers")
	if err := os.WriteFile(tokens, []byte(scenarioToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "serve", "--addr", addr, "--db", db, "--reap-every", "0", "--worker-tokens-file", tokens)
	cmd.Env = append(os.Environ(), scenarioServeEnv+"=1")
	p := startScenarioProc(t, "once serve", cmd, nil)
	var base string
	eventually(t, "once serve's address", func() bool {
		if m := servingOn.FindStringSubmatch(p.stdoutText()); m != nil {
			base = strings.TrimSuffix(m[1], "/")
			return true
		}
		if p.exited() {
			t.Fatalf("once serve exited before it served:\n%s", p.stderr.String())
		}
		return false
	})
	return base, p
}

// check holds the run to its expectations: the ledger, the provider,
// every worker's end.
func (r *scenarioRun) check(t *testing.T) {
	t.Helper()
	exp := r.sc.Expect
	a, err := r.env.client.Get(context.Background(), r.key)
	if err != nil {
		r.fail(t, "the ledger has no action %s: %v", r.key, err)
	}
	if a.Status != exp.Status || a.Attempt != exp.Attempt {
		r.fail(t, "the action ended %s at attempt %d (%s); want %s at attempt %d", a.Status, a.Attempt, a.Error, exp.Status, exp.Attempt)
	}
	pk := string(r.key) // the provider key is the action's key
	created := r.env.prov.p.Created(pk)
	if n := r.env.prov.requests(pk); n != exp.ProviderRequests || len(created) != exp.ProviderCreated {
		r.fail(t, "the provider had %d requests and made %d objects for the key; want %d and %d", n, len(created), exp.ProviderRequests, exp.ProviderCreated)
	}
	if a.Status == once.StatusSucceeded && len(created) > 0 {
		want, _ := json.Marshal(created[0].ID)
		if !jsonEqual(a.Result, want) {
			r.fail(t, "the ledger's result is %s; the provider made %s", a.Result, want)
		}
	}
	for name := range exp.Workers {
		if name != "*" && r.procs[name] == nil {
			r.fail(t, "the scenario expects worker %q, which the %s drive does not start", name, r.sc.Drive)
		}
	}
	for _, name := range r.order {
		p := r.procs[name]
		want, ok := exp.Workers[name]
		if !ok {
			want = exp.Workers["*"]
		}
		got, result := p.ending()
		if got != want {
			r.fail(t, "worker %s ended %q; want %q", name, got, want)
		}
		if got == "result" && !jsonEqual(result, a.Result) {
			r.fail(t, "worker %s returned %s; the ledger holds %s", name, result, a.Result)
		}
	}
	if exp.Verdict != "" {
		var verdicts []string
		for _, e := range r.verifier.all() {
			if e.Event == "verified" {
				verdicts = append(verdicts, e.Verdict)
			}
		}
		if len(verdicts) != 1 || verdicts[0] != exp.Verdict {
			r.fail(t, "the verifier answered %v; want [%s]", verdicts, exp.Verdict)
		}
	}
	t.Logf("%s: %s at attempt %d, %d requests at the provider%s", r.sc.ID, a.Status, a.Attempt, r.env.prov.requests(pk), r.said())
}

// fail fails the run, showing what each process said.
func (r *scenarioRun) fail(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Fatalf("%s: %s%s", r.sc.ID, fmt.Sprintf(format, args...), r.said())
}

// said is what each process of the run printed.
func (r *scenarioRun) said() string {
	var b strings.Builder
	ps := make([]*scenarioProc, 0, len(r.order)+1)
	for _, name := range r.order {
		ps = append(ps, r.procs[name])
	}
	if r.verifier != nil {
		ps = append(ps, r.verifier)
	}
	for _, p := range ps {
		fmt.Fprintf(&b, "\n[%s, %s] stdout:\n%s[%s] stderr:\n%s", p.name, r.env.lang.name, p.stdoutText(), p.name, tailOf(p.stderr.String(), 4000))
	}
	return b.String()
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

func tailOf(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// scenarioEvent is a line a worker prints.
type scenarioEvent struct {
	Event       string          `json:"event"`
	Phase       string          `json:"phase"`
	At          string          `json:"at"`
	Attempt     int             `json:"attempt"`
	ProviderKey string          `json:"provider_key"`
	ID          string          `json:"id"`
	Code        string          `json:"code"`
	Detail      string          `json:"detail"`
	Outcome     string          `json:"outcome"`
	Result      json.RawMessage `json:"result"`
	Verdict     string          `json:"verdict"`
}

// scenarioProc is a process the driver started: a worker, or once
// serve.
type scenarioProc struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr syncBuffer
	done   chan struct{}

	mu     sync.Mutex
	out    strings.Builder
	events []scenarioEvent
	killed bool
}

// startScenarioProc starts cmd, with job (if any) in its environment,
// reading its stdout's lines as they come. The test's end kills it if it
// is still running.
func startScenarioProc(t *testing.T, name string, cmd *exec.Cmd, job any) *scenarioProc {
	t.Helper()
	if job != nil {
		b, _ := json.Marshal(job)
		cmd.Env = append(os.Environ(), scenarioJobEnv+"="+string(b), "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1")
	}
	p := &scenarioProc{name: name, cmd: cmd, done: make(chan struct{})}
	cmd.Stderr = &p.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			var e scenarioEvent
			err := json.Unmarshal([]byte(line), &e)
			p.mu.Lock()
			p.out.WriteString(line + "\n")
			if err == nil && e.Event != "" {
				p.events = append(p.events, e)
			}
			p.mu.Unlock()
		}
		cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		if !p.exited() {
			cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

func (p *scenarioProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *scenarioProc) all() []scenarioEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]scenarioEvent(nil), p.events...)
}

func (p *scenarioProc) stdoutText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

func (p *scenarioProc) has(match func(scenarioEvent) bool) bool {
	for _, e := range p.all() {
		if match(e) {
			return true
		}
	}
	return false
}

// await waits for an event the process prints, failing if it exits
// first.
func (p *scenarioProc) await(t *testing.T, r *scenarioRun, what string, match func(scenarioEvent) bool) {
	t.Helper()
	eventually(t, p.name+" "+what, func() bool {
		if p.has(match) {
			return true
		}
		if p.exited() {
			r.fail(t, "%s exited before it was %s", p.name, what)
		}
		return false
	})
}

// release lets a held effect go on.
func (p *scenarioProc) release() { io.WriteString(p.stdin, "go\n") }

func (p *scenarioProc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v to %s: %v", sig, p.name, err)
	}
}

// kill kills the process with SIGKILL and waits for it to be gone.
func (p *scenarioProc) kill(t *testing.T) {
	t.Helper()
	p.mu.Lock()
	p.killed = true
	p.mu.Unlock()
	p.signal(t, syscall.SIGKILL)
	p.wait(t)
}

// wait waits for the process to exit.
func (p *scenarioProc) wait(t *testing.T) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("%s did not exit within two minutes:\n%s\n%s", p.name, p.stdoutText(), p.stderr.String())
	}
}

// ending is how the worker ended: "killed", "result" (and its result),
// the code of the error it ended with, or what it printed last.
func (p *scenarioProc) ending() (string, json.RawMessage) {
	p.mu.Lock()
	killed := p.killed
	p.mu.Unlock()
	if killed {
		return "killed", nil
	}
	for _, e := range p.all() {
		if e.Event != "end" {
			continue
		}
		if e.Outcome == "result" {
			return "result", e.Result
		}
		return e.Code, nil
	}
	return fmt.Sprintf("no end (exit %v)", p.cmd.ProcessState), nil
}
