// Package agentrun tests an agent process in any language the way the
// agent examples (examples/agent-python, examples/agent-ts) promise it
// behaves: killed with SIGKILL at every step boundary and at every point
// inside each of its five tool calls, then resumed under the same run id
// until it finishes, each effect happens exactly once, counted where it
// lands, at the mail server and at the payment provider.
//
// Everything the agent talks to runs on loopback in the test process: the
// protocol (/v1) over a real store (SQLite or PostgreSQL) with the
// example's kinds file, a real SMTP server (lab/mailbox) with a search
// API a verifier can ask, and a payment provider that honours
// Idempotency-Key (lab/provider). The agent is a real process, and it is
// its own SIGKILL (KILL_AT=STEP:PHASE), so the kill lands at an exact
// point of the call.
package agentrun

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/lab/mailbox"
	"github.com/oncehq/once/lab/provider"
	"github.com/oncehq/once/postgres"
	"github.com/oncehq/once/protocol"
	"github.com/oncehq/once/sqlite"
)

// Agent is how to start one run of an example's agent.
type Agent struct {
	// Dir is the directory it runs in.
	Dir string
	// Command is the program and its first arguments, such as
	// python3 agent.py; the run's flags follow them.
	Command []string
	// Env is added to the test's environment.
	Env []string
	// Kinds is the example's kinds file, which the server is given.
	Kinds string
}

// The plan every agent carries out: steps 0 to 4, in this order.
var plan = []string{"send_email", "send_email", "send_email", "charge_card", "send_email"}

// Phases inside a call where an agent kills itself (KILL_AT=STEP:PHASE).
var phases = []string{"claimed", "mid", "sent", "replied"}

// workerToken is the protocol's bearer token for the agents.
const workerToken = "agent-example-worker-token-0123456789"

// Need finds a program an example's test runs. Without it the test is
// skipped, but under CI (CI set) it fails: a missing program there would
// otherwise pass the example untested.
func Need(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not installed; the example cannot be tested", name)
		}
		t.Skipf("%s is not installed", name)
	}
	return p
}

// Test runs the agent through every kill, over SQLite and PostgreSQL:
// each step boundary, each point inside each call, and the
// counterexample, a run keyed by the model's tool-call id.
func Test(t *testing.T, a Agent) {
	for _, store := range []string{"sqlite", "postgres"} {
		t.Run(store, func(t *testing.T) {
			s := Start(t, store, a.Kinds)
			t.Run("boundary", func(t *testing.T) {
				for n := 0; n <= len(plan); n++ {
					t.Run(fmt.Sprint(n), func(t *testing.T) { s.KillAndResume(t, a, fmt.Sprintf("%d:before", n)) })
				}
			})
			t.Run("inside", func(t *testing.T) {
				for step := range plan {
					for _, phase := range phases {
						kill := fmt.Sprintf("%d:%s", step, phase)
						t.Run(kill, func(t *testing.T) { s.KillAndResume(t, a, kill) })
					}
				}
			})
			t.Run("keyed-by-tool-call-id", func(t *testing.T) { s.KeyedByToolCallID(t, a) })
		})
	}
}

// Sandbox is what one store's runs talk to.
type Sandbox struct {
	// URL is the protocol server's root; Client its once client, which
	// the checks read the ledger through.
	URL    string
	Client *once.Client
	// Mail is the SMTP server; MailSearch the root of its search API
	// (GET /messages?message_id=...), which the agents' verifiers ask.
	Mail       *mailbox.Server
	MailSearch string
	// Provider is the payment provider, at ProviderURL.
	Provider    *provider.Provider
	ProviderURL string

	mu       sync.Mutex
	requests map[string][]provider.Request // by Idempotency-Key, as answered
}

// Start starts a sandbox over store ("sqlite" or "postgres"), its server
// given kindsFile, as once serve's --kinds would give it.
func Start(t *testing.T, store, kindsFile string) *Sandbox {
	t.Helper()
	s := &Sandbox{requests: map[string][]provider.Request{}}
	f, err := os.Open(kindsFile)
	if err != nil {
		t.Fatal(err)
	}
	v := protocol.NewVerifiers()
	def, kinds, err := protocol.ParseKinds(f, v)
	f.Close()
	if err != nil {
		t.Fatalf("%s: %v", kindsFile, err)
	}
	st := openStore(t, store)
	if err := st.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s.Client, err = once.New(once.Config{Store: st, Default: def, Kinds: kinds}); err != nil {
		t.Fatal(err)
	}
	p, err := protocol.New(protocol.Config{Client: s.Client, Workers: []string{workerToken}, Verifiers: v})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	s.URL = srv.URL

	if s.Mail, err = mailbox.Start(mailbox.Config{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Mail.Close() })
	search := httptest.NewServer(http.HandlerFunc(s.search))
	t.Cleanup(search.Close)
	s.MailSearch = search.URL

	// The provider keeps its idempotency records in a database of its own.
	pc, _ := testdb.SQLiteClient(t, once.Config{})
	log := func(r provider.Request) {
		s.mu.Lock()
		s.requests[r.Key] = append(s.requests[r.Key], r)
		s.mu.Unlock()
	}
	if s.Provider, err = provider.New(provider.Config{Client: pc, Log: log}); err != nil {
		t.Fatal(err)
	}
	ps := httptest.NewServer(s.Provider)
	t.Cleanup(ps.Close)
	s.ProviderURL = ps.URL
	return s
}

func openStore(t *testing.T, store string) once.Store {
	ctx := context.Background()
	if store == "sqlite" {
		st, err := sqlite.Open(filepath.Join(t.TempDir(), "once.db"), sqlite.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	url := testdb.RequirePostgres(t)
	schema := "once_agent_" + randomHex(6)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	st, err := testdb.RetryTooManyClients(ctx, func() (*postgres.Store, error) {
		return postgres.Open(ctx, url+sep+"pool_max_conns=6", postgres.Config{Schema: schema})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		st.Close()
		if c, err := pgx.Connect(ctx, url); err == nil {
			c.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
			c.Close(ctx)
		}
	})
	return st
}

// search is the mail provider's search API: the messages the SMTP server
// accepted with a Message-ID, as a verifier asks for them (a mail
// provider's API, or IMAP SEARCH, where plain SMTP has no such question).
func (s *Sandbox) search(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("message_id")
	if r.Method != http.MethodGet || r.URL.Path != "/messages" || id == "" {
		http.Error(w, "GET /messages?message_id=<...> is the one question this API answers", http.StatusBadRequest)
		return
	}
	type found struct {
		MessageID string   `json:"message_id"`
		To        []string `json:"to"`
		Subject   string   `json:"subject"`
	}
	out := struct {
		Messages []found `json:"messages"`
	}{Messages: []found{}}
	for _, m := range s.Mail.Messages() {
		if m.MessageID == id {
			out.Messages = append(out.Messages, found{m.MessageID, m.To, m.Subject})
		}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}

// Customer creates a customer at the provider for a run to charge.
func (s *Sandbox) Customer(t *testing.T, run string) string {
	t.Helper()
	body := fmt.Sprintf(`{"email":"ada@example.com","name":"Ada for %s"}`, run)
	req, _ := http.NewRequest(http.MethodPost, s.ProviderURL+"/v1/customers", strings.NewReader(body))
	req.Header.Set("Idempotency-Key", "customer-"+run)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var o provider.Object
	if err := json.NewDecoder(resp.Body).Decode(&o); err != nil || resp.StatusCode != 200 {
		t.Fatalf("create customer: %d %v", resp.StatusCode, err)
	}
	return o.ID
}

// Result is how one agent process ended.
type Result struct {
	Out    string
	Code   int  // its exit code; -1 when a signal ended it
	Killed bool // SIGKILL ended it
}

// Run runs the agent once for run, killing itself at killAt ("" runs it
// through), and returns how it ended.
func (s *Sandbox) Run(t *testing.T, a Agent, run, customer, killAt string, flags ...string) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	args := append(append([]string{}, a.Command[1:]...), "--run", run, "--customer", customer,
		"--smtp", s.Mail.Addr(), "--provider", s.ProviderURL, "--mailbox", s.MailSearch)
	cmd := exec.CommandContext(ctx, a.Command[0], append(args, flags...)...)
	cmd.Dir = a.Dir
	cmd.Env = append(append(os.Environ(), a.Env...), "ONCE_URL="+s.URL, "ONCE_TOKEN="+workerToken, "KILL_AT="+killAt)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	r := Result{Out: out.String()}
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		r.Code = exit.ExitCode()
		ws, ok := exit.Sys().(syscall.WaitStatus)
		r.Killed = ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
	default:
		t.Fatalf("%v: %v\n%s", cmd.Args, err, r.Out)
	}
	if ctx.Err() != nil {
		t.Fatalf("%v did not end within two minutes:\n%s", cmd.Args, r.Out)
	}
	t.Logf("KILL_AT=%q %s: exit %d, killed %v\n%s", killAt, strings.Join(flags, " "), r.Code, r.Killed, r.Out)
	return r
}

// Resume runs the agent again for run until it finishes: exit 0. A run
// that answers 75 (a step not done yet) is run again, a few times.
func (s *Sandbox) Resume(t *testing.T, a Agent, run, customer string, flags ...string) Result {
	t.Helper()
	for range 5 {
		r := s.Run(t, a, run, customer, "", flags...)
		switch {
		case r.Code == 0 && strings.Contains(r.Out, "run "+run+" finished"):
			return r
		case r.Code != 75:
			t.Fatalf("the resumed run exited %d (killed %v); want it to finish", r.Code, r.Killed)
		}
	}
	t.Fatalf("the run did not finish in five tries")
	return Result{}
}

// KillAndResume kills a new run at kill, resumes it until it finishes,
// and checks that each effect happened once, and by the recovery the
// kill's point calls for.
func (s *Sandbox) KillAndResume(t *testing.T, a Agent, kill string) {
	run := "order-" + randomHex(4)
	customer := s.Customer(t, run)
	r := s.Run(t, a, run, customer, kill)
	if !r.Killed || !strings.Contains(r.Out, "kill: "+kill+" (SIGKILL)") {
		t.Fatalf("KILL_AT=%s: exit %d, killed %v; want the run killed there", kill, r.Code, r.Killed)
	}
	s.Resume(t, a, run, customer)
	steps := s.checkOnce(t, run, customer)
	s.checkRecovery(t, kill, steps)
}

// KeyedByToolCallID is the counterexample: the same kill, at step 3 with
// the charge's answer read and not recorded, in a run keyed by the
// model's tool-call ids. The resumed run's calls have new ids, so new
// keys: the three emails before it go out again, and the card is charged
// twice. The counts that pass above see each duplicate here.
func (s *Sandbox) KeyedByToolCallID(t *testing.T, a Agent) {
	run := "order-" + randomHex(4)
	customer := s.Customer(t, run)
	if r := s.Run(t, a, run, customer, "3:replied", "--key-by", "tool-call-id"); !r.Killed {
		t.Fatalf("exit %d; want the run killed at 3:replied", r.Code)
	}
	s.Resume(t, a, run, customer, "--key-by", "tool-call-id")
	copies := map[string]int{}
	for _, m := range s.messages(run) {
		copies[m.Subject]++
	}
	charges := s.charges(customer)
	twice := 0
	for _, n := range copies {
		if n == 2 {
			twice++
		}
	}
	if len(charges) != 2 || twice != 3 || len(copies) != 4 {
		t.Fatalf("keyed by tool-call id: %d charges and emails %v; want the counterexample: 2 charges, three emails twice", len(charges), copies)
	}
	t.Logf("keyed by tool-call id: %d charges (%s, %s) and emails %v", len(charges), charges[0].ID, charges[1].ID, copies)
}

// checkOnce checks each effect of run happened once where it lands, and
// that the ledger has the run's five steps succeeded; it returns them.
func (s *Sandbox) checkOnce(t *testing.T, run, customer string) []once.Action {
	t.Helper()
	copies, ids := map[string]int{}, map[string]int{}
	for _, m := range s.messages(run) {
		copies[strings.Join(m.To, ",")+" "+m.Subject]++
		ids[m.MessageID]++
	}
	for id, n := range ids {
		if n != 1 {
			t.Errorf("Message-ID %s arrived %d times", id, n)
		}
	}
	if len(copies) != 4 {
		t.Errorf("the run's emails: %v; want 4 different messages", copies)
	}
	for m, n := range copies {
		if n != 1 {
			t.Errorf("%q arrived %d times; want once", m, n)
		}
	}
	charges := s.charges(customer)
	if len(charges) != 1 {
		t.Fatalf("%d charges of %s; want one", len(charges), customer)
	}
	for _, m := range s.messages(run) {
		if strings.HasSuffix(m.Subject, ": receipt") && !bytes.Contains(m.Body, []byte(charges[0].ID)) {
			t.Errorf("the receipt says %q; want it to name the charge %s (step 3's result, replayed or not)", m.Body, charges[0].ID)
		}
	}
	steps, err := s.Client.RunSteps(context.Background(), run)
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != len(plan) {
		t.Fatalf("the ledger has %d steps of %s; want %d", len(steps), run, len(plan))
	}
	for i, st := range steps {
		if st.Step != int64(i) || st.Kind != plan[i] || st.Status != once.StatusSucceeded {
			t.Errorf("step %d of the ledger: step %d %s %s; want %s succeeded", i, st.Step, st.Kind, st.Status, plan[i])
		}
	}
	return steps
}

// checkRecovery checks that the step killed at kill was decided as its
// kind's recovery says: an email whose message had not arrived is sent
// (attempt 2) and one that had is found by the verifier (attempt 1); a
// charge is sent again with its key (attempt 2), and the provider answers
// a request it had finished from its store.
func (s *Sandbox) checkRecovery(t *testing.T, kill string, steps []once.Action) {
	t.Helper()
	var n int
	var phase string
	if _, err := fmt.Sscanf(strings.Replace(kill, ":", " ", 1), "%d %s", &n, &phase); err != nil {
		t.Fatal(err)
	}
	if phase == "before" {
		for _, st := range steps {
			if st.Attempt != 1 {
				t.Errorf("step %d took %d attempts; a run killed between steps needs one each", st.Step, st.Attempt)
			}
		}
		return
	}
	st := steps[n]
	landed := phase == "sent" || phase == "replied" // the whole message or request had gone out
	switch st.Kind {
	case "send_email":
		verified := s.verifiedLanded(t, st.Key)
		if landed && (st.Attempt != 1 || !verified) {
			t.Errorf("step %d: attempt %d, verifier found it %v; a message that arrived is found by the verifier, not sent again", n, st.Attempt, verified)
		}
		if !landed && (st.Attempt != 2 || verified) {
			t.Errorf("step %d: attempt %d, verifier found it %v; a message that never arrived is sent by attempt 2", n, st.Attempt, verified)
		}
	case "charge_card":
		if st.Attempt != 2 {
			t.Errorf("step %d: attempt %d; a charge killed inside its call is sent again, as attempt 2", n, st.Attempt)
		}
		// What each request with the charge's key came to, in order:
		// "created", "replayed" (the stored answer), or "nothing".
		got := s.answered(s.charges(st.Target)[0].Key)
		want := map[string][]string{
			"claimed": {"created"},             // killed before its request: attempt 2 sends the first
			"mid":     {"nothing", "created"},  // half a body: the provider read nothing it could run
			"replied": {"created", "replayed"}, // the charge was made; the retry is answered from the store
		}[phase]
		if phase == "sent" {
			// The whole request was sent and the client gone before its
			// answer: the provider may have started it, or not (it does
			// not start a request whose client left). Either way, once.
			want = []string{"created", "replayed"}
			if len(got) > 0 && got[0] == "nothing" {
				want = []string{"nothing", "created"}
			}
			t.Logf("killed with the charge sent: the provider's requests %v", got)
		}
		if !slices.Equal(got, want) {
			t.Errorf("step %d killed at %s: the provider's requests with its key came to %v; want %v", n, phase, got, want)
		}
	}
}

// answered is what each request with key came to at the provider, in
// the order they were made.
func (s *Sandbox) answered(key string) []string {
	s.mu.Lock()
	rs := slices.Clone(s.requests[key])
	s.mu.Unlock()
	slices.SortFunc(rs, func(a, b provider.Request) int { return a.Nth - b.Nth })
	out := make([]string, len(rs))
	for i, r := range rs {
		switch {
		case r.Created != nil:
			out[i] = "created"
		case r.Replayed:
			out[i] = "replayed"
		default:
			out[i] = "nothing"
		}
	}
	return out
}

// verifiedLanded reports whether the trail of key says the verifier found
// its effect landed.
func (s *Sandbox) verifiedLanded(t *testing.T, key once.Key) bool {
	evs, err := s.Client.Events(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if strings.Contains(e.Note, "verifier found the effect landed") {
			return true
		}
	}
	return false
}

// messages are those the mail server accepted for run.
func (s *Sandbox) messages(run string) []mailbox.Message {
	var out []mailbox.Message
	for _, m := range s.Mail.Messages() {
		if strings.HasPrefix(m.Subject, "Order "+run+":") {
			out = append(out, m)
		}
	}
	return out
}

// charges are the provider's charges of customer.
func (s *Sandbox) charges(customer string) []provider.Object {
	var out []provider.Object
	for _, o := range s.Provider.Objects() {
		if o.Object == "charge" && o.Customer == customer {
			out = append(out, o)
		}
	}
	return out
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
