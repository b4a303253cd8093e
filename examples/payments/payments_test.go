package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/testdb"
)

// The tests run the example as users do: built into a binary, started as
// a process on a free port, spoken to over real HTTP, and killed with
// SIGKILL. Each runs against SQLite and, when it is reachable,
// PostgreSQL.

var (
	binDir   string
	buildMu  sync.Mutex
	built    string
	buildErr error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "payments-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// binary builds the example once per test binary (with the race
// detector when the tests run under it) and returns its path.
func binary(t *testing.T) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if built == "" && buildErr == nil {
		goTool, err := exec.LookPath("go")
		if err != nil {
			buildErr = fmt.Errorf("the go command is not on PATH (%v); the test builds the example with it", err)
		} else {
			out := filepath.Join(binDir, "payments")
			args := []string{"build", "-o", out}
			if raceEnabled {
				args = append(args, "-race")
			}
			cmd := exec.Command(goTool, append(args, ".")...)
			if b, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("go build: %v\n%s", err, b)
			} else {
				built = out
			}
		}
	}
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return built
}

// eachStore runs fn against a new SQLite file and a new PostgreSQL
// schema, in parallel. fn gets the --db URL.
func eachStore(t *testing.T, fn func(t *testing.T, db string)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		fn(t, filepath.Join(t.TempDir(), "payments.db"))
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		fn(t, postgresDB(t))
	})
}

// postgresDB returns a URL whose tables go to a schema of their own,
// dropped when the test ends, with a small pool: the server is shared.
func postgresDB(t *testing.T) string {
	t.Helper()
	base := testdb.RequirePostgres(t)
	var b [6]byte
	rand.Read(b[:])
	schema := "payments_" + hex.EncodeToString(b[:])
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("once_schema", schema)
	q.Set("pool_max_conns", "3")
	u.RawQuery = q.Encode()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := testdb.RetryTooManyClients(ctx, func() (*pgx.Conn, error) { return pgx.Connect(ctx, base) })
		if err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	return u.String()
}

// proc is a running example process.
type proc struct {
	cmd    *exec.Cmd
	base   string
	stderr *syncBuffer
	done   chan struct{}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var listening = regexp.MustCompile(`^payments: listening on (http://127\.0\.0\.1:\d+) `)

// start runs the example on db, on a free port, with a 1s lease unless
// args say otherwise, and waits until it listens. It is killed when the
// test ends.
func start(t *testing.T, db string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(binary(t), append([]string{"--addr", "127.0.0.1:0", "--db", db, "--lease", "1s"}, args...)...)
	p := &proc{cmd: cmd, stderr: new(syncBuffer), done: make(chan struct{})}
	cmd.Stderr = p.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := listening.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
		close(addr)
	}()
	go func() {
		cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill(t)
		if t.Failed() {
			t.Logf("payments process %d stderr:\n%s", cmd.Process.Pid, p.stderr)
		}
	})
	select {
	case a, ok := <-addr:
		if !ok {
			t.Fatalf("the example exited before it listened: %s", p.stderr)
		}
		p.base = a
	case <-time.After(time.Minute):
		t.Fatalf("the example did not listen within a minute: %s", p.stderr)
	}
	return p
}

// kill ends the process with SIGKILL and waits for it.
func (p *proc) kill(t *testing.T) {
	t.Helper()
	select {
	case <-p.done:
		return
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Logf("kill: %v", err)
	}
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		t.Fatalf("process %d did not end after SIGKILL", p.cmd.Process.Pid)
	}
}

// answer is an HTTP response, read whole.
type answer struct {
	status int
	header http.Header
	body   string
}

func (a answer) replayed() bool { return a.header.Get("Idempotent-Replayed") == "true" }

// code is the problem code of an error answer.
func (a answer) code(t *testing.T) string {
	t.Helper()
	if ct := a.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("answer %d has Content-Type %q, want application/problem+json: %s", a.status, ct, a.body)
	}
	var p struct{ Code string }
	if err := json.Unmarshal([]byte(a.body), &p); err != nil {
		t.Fatalf("problem body %q: %v", a.body, err)
	}
	return p.Code
}

func (a answer) charge(t *testing.T) charge {
	t.Helper()
	var c charge
	if err := json.Unmarshal([]byte(a.body), &c); err != nil || c.ID == "" {
		t.Fatalf("answer %d is not a charge: %q (%v)", a.status, a.body, err)
	}
	return c
}

var httpClient = &http.Client{Timeout: time.Minute}

// send makes one request; key "" sends no Idempotency-Key, tenant ""
// no Authorization.
func send(method, url, key, tenant, body string) (answer, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if tenant != "" {
		req.Header.Set("Authorization", "Bearer "+tenant)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(b)}, err
}

func (p *proc) post(t *testing.T, key, tenant, body string) answer {
	t.Helper()
	a, err := send(http.MethodPost, p.base+"/charges", key, tenant, body)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func (p *proc) charges(t *testing.T, tenant string) []charge {
	t.Helper()
	a, err := send(http.MethodGet, p.base+"/charges", "", tenant, "")
	if err != nil {
		t.Fatal(err)
	}
	if a.status != http.StatusOK {
		t.Fatalf("GET /charges: %d %s", a.status, a.body)
	}
	var list struct{ Charges []charge }
	if err := json.Unmarshal([]byte(a.body), &list); err != nil {
		t.Fatalf("GET /charges: %q: %v", a.body, err)
	}
	return list.Charges
}

// newKey returns a key no other test uses.
func newKey() string {
	var b [8]byte
	rand.Read(b[:])
	return "key-" + hex.EncodeToString(b[:])
}

const (
	adaBody   = `{"amount":1250,"currency":"EUR","customer":"cus_ada"}`
	otherBody = `{"amount":9900,"currency":"EUR","customer":"cus_ada"}`
)

// actions opens db as the example does and returns the tenant's actions.
func actions(t *testing.T, db, tenant string) []once.Action {
	t.Helper()
	ctx := context.Background()
	store, _, err := open(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	c, err := once.New(once.Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	as, err := c.List(ctx, once.Filter{Run: "tenant:" + tenant})
	if err != nil {
		t.Fatal(err)
	}
	return as
}

// TestAcceptance is the sequence README.md shows: the same key and body
// twice make one charge, the second answer replayed; the same key with
// another body is 422; no key is 400; the list holds one charge.
func TestAcceptance(t *testing.T) {
	eachStore(t, func(t *testing.T, db string) {
		p := start(t, db)
		key := newKey()

		first := p.post(t, key, "", adaBody)
		if first.status != http.StatusCreated || first.replayed() {
			t.Fatalf("first POST: %d replayed=%v %s; want 201, not replayed", first.status, first.replayed(), first.body)
		}
		c := first.charge(t)
		if c.Amount != 1250 || c.Currency != "EUR" || c.Customer != "cus_ada" || !strings.HasPrefix(c.ID, "ch_") {
			t.Errorf("charge %+v does not match the request", c)
		}
		if loc := first.header.Get("Location"); loc != "/charges/"+c.ID {
			t.Errorf("Location %q, want /charges/%s", loc, c.ID)
		}

		again := p.post(t, key, "", adaBody)
		if again.status != http.StatusCreated || !again.replayed() || again.body != first.body {
			t.Fatalf("repeat: %d replayed=%v %s; want 201, Idempotent-Replayed: true, the first body %s", again.status, again.replayed(), again.body, first.body)
		}

		other := p.post(t, key, "", otherBody)
		if other.status != http.StatusUnprocessableEntity || other.code(t) != "key-reused" {
			t.Fatalf("same key, another body: %d %s; want 422 key-reused", other.status, other.body)
		}

		noKey := p.post(t, "", "", adaBody)
		if noKey.status != http.StatusBadRequest || noKey.code(t) != "key-missing" {
			t.Fatalf("no key: %d %s; want 400 key-missing", noKey.status, noKey.body)
		}

		list := p.charges(t, "")
		if len(list) != 1 || list[0] != c {
			t.Fatalf("GET /charges: %+v; want the one charge %+v", list, c)
		}
		got, err := send(http.MethodGet, p.base+"/charges/"+c.ID, "", "", "")
		if err != nil || got.status != http.StatusOK || got.charge(t) != c {
			t.Fatalf("GET /charges/%s: %+v %v", c.ID, got, err)
		}

		// The action log agrees: one action for the tenant, succeeded
		// at its first attempt.
		as := actions(t, db, defaultTenant)
		if len(as) != 1 || as[0].Status != once.StatusSucceeded || as[0].Attempt != 1 || as[0].Target != key {
			t.Fatalf("actions: %+v; want one succeeded at attempt 1 for key %s", as, key)
		}
	})
}

// TestConcurrentSameKey sends the same request eight times at once:
// exactly one runs and creates the charge; every other is told it is in
// flight (409) or gets the first answer replayed.
func TestConcurrentSameKey(t *testing.T) {
	eachStore(t, func(t *testing.T, db string) {
		p := start(t, db)
		key := newKey()
		const n = 8
		answers := make([]answer, n)
		errs := make([]error, n)
		var ready, wg sync.WaitGroup
		ready.Add(n)
		gate := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				ready.Done()
				<-gate
				answers[i], errs[i] = send(http.MethodPost, p.base+"/charges", key, "", adaBody)
			})
		}
		ready.Wait()
		close(gate)
		wg.Wait()

		var ran []answer
		replayed, inFlight := 0, 0
		for i, a := range answers {
			switch {
			case errs[i] != nil:
				t.Fatalf("request %d: %v", i, errs[i])
			case a.status == http.StatusCreated && !a.replayed():
				ran = append(ran, a)
			case a.status == http.StatusCreated:
				replayed++
			case a.status == http.StatusConflict && a.code(t) == "key-in-flight":
				inFlight++
			default:
				t.Fatalf("request %d: %d %s; want 201 or 409 key-in-flight", i, a.status, a.body)
			}
		}
		t.Logf("%d ran, %d replayed, %d in flight", len(ran), replayed, inFlight)
		if len(ran) != 1 {
			t.Fatalf("%d requests ran the charge (201 without Idempotent-Replayed); want exactly 1", len(ran))
		}
		for i, a := range answers {
			if a.status == http.StatusCreated && a.body != ran[0].body {
				t.Errorf("request %d answered %s; the charge that ran is %s", i, a.body, ran[0].body)
			}
		}
		if list := p.charges(t, ""); len(list) != 1 || list[0] != ran[0].charge(t) {
			t.Fatalf("charges after %d concurrent requests: %+v; want the one that ran", n, list)
		}
		// The ones told 409 retry and get the same answer.
		if a := p.post(t, key, "", adaBody); a.status != http.StatusCreated || !a.replayed() || a.body != ran[0].body {
			t.Fatalf("retry: %d replayed=%v %s", a.status, a.replayed(), a.body)
		}
	})
}

// TestRestartReplays kills the process with SIGKILL after a charge and
// starts another on the same database: the repeat gets the stored answer.
func TestRestartReplays(t *testing.T) {
	eachStore(t, func(t *testing.T, db string) {
		p := start(t, db)
		key := newKey()
		first := p.post(t, key, "", adaBody)
		if first.status != http.StatusCreated {
			t.Fatalf("first POST: %d %s", first.status, first.body)
		}
		p.kill(t)

		p2 := start(t, db)
		again := p2.post(t, key, "", adaBody)
		if again.status != http.StatusCreated || !again.replayed() || again.body != first.body {
			t.Fatalf("after restart: %d replayed=%v %s; want the first answer %s, replayed", again.status, again.replayed(), again.body, first.body)
		}
		if list := p2.charges(t, ""); len(list) != 1 {
			t.Fatalf("charges after restart: %+v; want one", list)
		}
	})
}

// TestCrashBetweenChargeAndRecord kills the process after it wrote a
// charge and before its answer was recorded. The charge stands, its
// action is in flight; a process started on the same database answers
// the client's retry, once the dead claim's lease has run out, by
// running the charge again, which finds the charge instead of making a
// second, and records that answer.
func TestCrashBetweenChargeAndRecord(t *testing.T) {
	eachStore(t, func(t *testing.T, db string) {
		p := start(t, db, "--hold-after-charge", "10m")
		key := newKey()
		posted := make(chan error, 1)
		go func() {
			a, err := send(http.MethodPost, p.base+"/charges", key, "", adaBody)
			if err == nil {
				err = fmt.Errorf("the held POST was answered: %d %s", a.status, a.body)
			}
			posted <- err
		}()
		var written []charge
		for deadline := time.Now().Add(time.Minute); len(written) == 0; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the charge was not written within a minute")
			}
			written = p.charges(t, "")
		}
		p.kill(t)
		if err := <-posted; err == nil || strings.Contains(err.Error(), "answered") {
			t.Fatalf("the POST should have lost its connection to the killed process: %v", err)
		}
		if as := actions(t, db, defaultTenant); len(as) != 1 || as[0].Status != once.StatusInFlight {
			t.Fatalf("after the kill: actions %+v; want one in flight", as)
		}

		p2 := start(t, db)
		var retried answer
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
			retried = p2.post(t, key, "", adaBody)
			if retried.status != http.StatusConflict {
				break
			}
			if code := retried.code(t); code != "key-in-flight" {
				t.Fatalf("retry: 409 %s; want key-in-flight until the lease runs out", code)
			}
			if time.Now().After(deadline) {
				t.Fatal("the dead claim was not recovered within a minute")
			}
		}
		if retried.status != http.StatusCreated || retried.replayed() {
			t.Fatalf("retry after the lease: %d replayed=%v %s; want 201 from running the charge again", retried.status, retried.replayed(), retried.body)
		}
		if c := retried.charge(t); c != written[0] {
			t.Fatalf("retry answered charge %+v; the charge written before the crash is %+v", c, written[0])
		}
		if list := p2.charges(t, ""); len(list) != 1 {
			t.Fatalf("charges: %+v; want the one written before the crash", list)
		}
		if !strings.Contains(p2.stderr.String(), "charge found, written by an earlier attempt") {
			t.Errorf("the retry did not find the charge the killed process wrote; its log:\n%s", p2.stderr)
		}
		if a := p2.post(t, key, "", adaBody); !a.replayed() || a.body != retried.body {
			t.Fatalf("repeat: %d replayed=%v %s; want the recorded answer", a.status, a.replayed(), a.body)
		}
		if as := actions(t, db, defaultTenant); len(as) != 1 || as[0].Status != once.StatusSucceeded || as[0].Attempt != 2 {
			t.Fatalf("actions %+v; want one succeeded at attempt 2", as)
		}
	})
}

// TestInvalidBodyChangesNothing sends bodies that are not valid charges
// under one key: each is refused before the key is recorded, so the key
// then makes the valid charge.
func TestInvalidBodyChangesNothing(t *testing.T) {
	eachStore(t, func(t *testing.T, db string) {
		p := start(t, db)
		key := newKey()
		for _, tc := range []struct {
			body   string
			status int
			code   string
			fields []string
		}{
			{``, 400, "body-malformed", nil},
			{`null`, 400, "body-malformed", nil},
			{`[1]`, 400, "body-malformed", nil},
			{`{"amount":1250`, 400, "body-malformed", nil},
			{adaBody + `{}`, 400, "body-malformed", nil},
			{`{}`, 422, "charge-invalid", []string{"amount", "currency", "customer"}},
			{`{"amount":0,"currency":"EUR","customer":"c"}`, 422, "charge-invalid", []string{"amount"}},
			{`{"amount":-5,"currency":"EUR","customer":"c"}`, 422, "charge-invalid", []string{"amount"}},
			{`{"amount":12.5,"currency":"EUR","customer":"c"}`, 422, "charge-invalid", []string{"amount"}},
			{`{"amount":1e3,"currency":"EUR","customer":"c"}`, 422, "charge-invalid", []string{"amount"}},
			{`{"amount":"1250","currency":"EUR","customer":"c"}`, 422, "charge-invalid", []string{"amount"}},
			{`{"amount":9007199254740992,"currency":"EUR","customer":"c"}`, 422, "charge-invalid", []string{"amount"}},
			{`{"amount":1250,"currency":"EURO","customer":"c"}`, 422, "charge-invalid", []string{"currency"}},
			{`{"amount":1250,"currency":"E1R","customer":"c"}`, 422, "charge-invalid", []string{"currency"}},
			{`{"amount":1250,"currency":978,"customer":"c"}`, 422, "charge-invalid", []string{"currency"}},
			{`{"amount":1250,"currency":"EUR","customer":"  "}`, 422, "charge-invalid", []string{"customer"}},
			{`{"amount":1250,"currency":"EUR","customer":"a\nb"}`, 422, "charge-invalid", []string{"customer"}},
			{`{"amount":1250,"currency":"EUR","customer":null}`, 422, "charge-invalid", []string{"customer"}},
			{`{"amount":1250,"currency":"EUR","customer":"c","captured":true}`, 422, "charge-invalid", []string{"captured"}},
			{`{"amount":1250,"currency":"EUR","customer":"` + strings.Repeat("x", 17<<10) + `"}`, 413, "body-too-large", nil},
		} {
			a := p.post(t, key, "", tc.body)
			if a.status != tc.status || a.code(t) != tc.code {
				t.Errorf("body %.60q: %d %s; want %d %s", tc.body, a.status, a.body, tc.status, tc.code)
				continue
			}
			var prob struct{ Errors []fieldError }
			json.Unmarshal([]byte(a.body), &prob)
			var fields []string
			for _, e := range prob.Errors {
				fields = append(fields, e.Field)
				if e.Detail == "" {
					t.Errorf("body %.60q: field %s has no detail", tc.body, e.Field)
				}
			}
			if fmt.Sprint(fields) != fmt.Sprint(tc.fields) {
				t.Errorf("body %.60q: faulty fields %v, want %v", tc.body, fields, tc.fields)
			}
		}
		if list := p.charges(t, ""); len(list) != 0 {
			t.Fatalf("invalid bodies made charges: %+v", list)
		}
		if as := actions(t, db, defaultTenant); len(as) != 0 {
			t.Fatalf("invalid bodies were recorded: %+v", as)
		}
		// The same body in another spelling is the same charge.
		first := p.post(t, key, "", `{"customer":"cus_ada", "currency":"eur", "amount":1250}`)
		if first.status != http.StatusCreated || first.replayed() {
			t.Fatalf("valid body after the invalid ones: %d %s", first.status, first.body)
		}
		if a := p.post(t, key, "", adaBody); a.status != http.StatusCreated || !a.replayed() || a.body != first.body {
			t.Fatalf("the same charge spelt differently: %d replayed=%v %s; want the first answer", a.status, a.replayed(), a.body)
		}
	})
}

// TestTenants: the same key from two tenants makes two charges, each
// tenant lists its own, and a malformed Authorization is refused.
func TestTenants(t *testing.T) {
	eachStore(t, func(t *testing.T, db string) {
		p := start(t, db)
		key := newKey()
		acme := p.post(t, key, "acme", adaBody)
		globex := p.post(t, key, "globex", adaBody)
		if acme.status != http.StatusCreated || globex.status != http.StatusCreated || globex.replayed() {
			t.Fatalf("acme: %d %s; globex: %d replayed=%v %s", acme.status, acme.body, globex.status, globex.replayed(), globex.body)
		}
		if acme.charge(t).ID == globex.charge(t).ID {
			t.Fatal("two tenants' requests under one key made one charge")
		}
		for tenant, want := range map[string]charge{"acme": acme.charge(t), "globex": globex.charge(t)} {
			if list := p.charges(t, tenant); len(list) != 1 || list[0] != want {
				t.Errorf("%s lists %+v; want its own charge %+v", tenant, list, want)
			}
		}
		if list := p.charges(t, ""); len(list) != 0 {
			t.Errorf("tenant %s lists %+v; want none", defaultTenant, list)
		}
		if a, err := send(http.MethodGet, p.base+"/charges/"+acme.charge(t).ID, "", "globex", ""); err != nil || a.status != http.StatusNotFound {
			t.Errorf("globex reading acme's charge: %+v %v; want 404", a, err)
		}
		for _, auth := range []string{"Basic YWxhZGRpbjpvcGVu", "Bearer ", "Bearer a b", "Bearer " + strings.Repeat("x", 65)} {
			req, _ := http.NewRequest(http.MethodPost, p.base+"/charges", strings.NewReader(adaBody))
			req.Header.Set("Idempotency-Key", key)
			req.Header.Set("Authorization", auth)
			resp, err := httpClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
				t.Errorf("Authorization %q: %d; want 401 with WWW-Authenticate", auth, resp.StatusCode)
			}
		}
	})
}

// TestKeyReusedAfterPurge: once the idempotency record of a charge is
// purged, the key sent again with the same charge gets that charge back,
// and with another charge is refused by the charges table, not charged.
func TestKeyReusedAfterPurge(t *testing.T) {
	eachStore(t, func(t *testing.T, db string) {
		p := start(t, db)
		key := newKey()
		first := p.post(t, key, "", adaBody)
		if first.status != http.StatusCreated {
			t.Fatalf("first POST: %d %s", first.status, first.body)
		}
		ctx := context.Background()
		store, _, err := open(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		defer store.Close()
		c, err := once.New(once.Config{Store: store})
		if err != nil {
			t.Fatal(err)
		}
		purge := func() {
			t.Helper()
			for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
				n, err := c.Purge(ctx, once.PurgeOptions{OlderThan: time.Millisecond})
				if err != nil {
					t.Fatal(err)
				}
				if n == 1 {
					return
				}
				if time.Now().After(deadline) {
					t.Fatal("the action was not purged within a minute")
				}
			}
		}

		purge()
		same := p.post(t, key, "", adaBody)
		if same.status != http.StatusCreated || same.replayed() || same.charge(t) != first.charge(t) {
			t.Fatalf("same charge after purge: %d replayed=%v %s; want 201 with the first charge %s, run again", same.status, same.replayed(), same.body, first.body)
		}

		purge()
		other := p.post(t, key, "", otherBody)
		if other.status != http.StatusUnprocessableEntity || other.code(t) != "key-reused" {
			t.Fatalf("key reused for another charge after purge: %d %s; want 422 key-reused", other.status, other.body)
		}
		if list := p.charges(t, ""); len(list) != 1 || list[0] != first.charge(t) {
			t.Fatalf("charges: %+v; want the first one only", list)
		}
	})
}

// TestUsage: bad flags and databases are refused with a message that
// says what to do, and the right exit code.
func TestUsage(t *testing.T) {
	t.Parallel()
	taken := start(t, filepath.Join(t.TempDir(), "taken.db"))
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--db", "mysql://u@h/db"}, 1, "not supported"},
		{[]string{"--db", "host=localhost user=postgres"}, 1, "write it as a URL"},
		{[]string{"--db", filepath.Join(t.TempDir(), "missing", "dir", "x.db")}, 1, "directory exist"},
		{[]string{"--lease", "1ms"}, 2, "--lease 1ms is too short"},
		{[]string{"--hold-after-charge", "-1s"}, 2, "must not be negative"},
		{[]string{"--max-conns", "0"}, 2, "--max-conns 0: give at least 1"},
		{[]string{"extra"}, 2, `unexpected argument "extra"`},
		{[]string{"--nope"}, 2, "flag provided but not defined"},
		{[]string{"--addr", strings.TrimPrefix(taken.base, "http://"), "--db", filepath.Join(t.TempDir(), "x.db")}, 1, "pass another --addr"},
	} {
		cmd := exec.Command(binary(t), tc.args...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != tc.code || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("payments %q: exit %d, stderr %q; want exit %d and %q", tc.args, code, stderr.String(), tc.code, tc.want)
		}
	}
}
