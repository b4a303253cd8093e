package protocol_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/postgres"
	"github.com/oncehq/once/protocol"
	"github.com/oncehq/once/sqlite"
)

const (
	workerToken   = "worker-token-0123456789"
	operatorToken = "operator-token-0123456789"
)

// stores are the stores the protocol is tested over: a SQLite file and
// a schema of its own on the test PostgreSQL.
func stores(t *testing.T) map[string]func(t *testing.T) once.Store {
	return map[string]func(t *testing.T) once.Store{
		"sqlite": func(t *testing.T) once.Store {
			s, err := sqlite.Open(filepath.Join(t.TempDir(), "once.db"), sqlite.Config{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		},
		"postgres": func(t *testing.T) once.Store {
			url := testdb.RequirePostgres(t)
			var b [6]byte
			rand.Read(b[:])
			schema := "once_protocol_" + hex.EncodeToString(b[:])
			ctx := context.Background()
			s, err := testdb.RetryTooManyClients(ctx, func() (*postgres.Store, error) {
				return postgres.Open(ctx, url+"&pool_max_conns=4", postgres.Config{Schema: schema})
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				s.Close()
				if c, err := pgx.Connect(ctx, url); err == nil {
					c.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
					c.Close(ctx)
				}
			})
			return s
		},
	}
}

// server is /v1 over a real HTTP server on loopback, with a client of
// cfg over store.
type server struct {
	t   *testing.T
	url string
	c   *once.Client
}

// verifiersOf is the bridge a test gives newServer for a store's server.
var verifiersOf = map[once.Store]*protocol.Verifiers{}

func newServer(t *testing.T, store once.Store, cfg once.Config) *server {
	t.Helper()
	cfg.Store = store
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	c, err := once.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p, err := protocol.New(protocol.Config{Client: c, Workers: []string{workerToken}, Operators: []string{operatorToken}, Verifiers: verifiersOf[store]})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(p)
	t.Cleanup(hs.Close)
	return &server{t: t, url: hs.URL, c: c}
}

// call sends body (JSON-encoded unless a string) to path with token,
// and returns the status and the decoded answer.
func (s *server) call(method, path, token string, body any) (int, map[string]any) {
	s.t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		r = strings.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			s.t.Fatal(err)
		}
		r = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, s.url+path, r)
	if err != nil {
		s.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatal(err)
	}
	var v map[string]any
	if err := json.Unmarshal(raw, &v); err != nil {
		s.t.Fatalf("%s %s: %d, not JSON: %q", method, path, resp.StatusCode, raw)
	}
	if resp.StatusCode >= 400 && resp.Header.Get("Content-Type") != "application/problem+json" {
		s.t.Fatalf("%s %s: %d with Content-Type %q; want application/problem+json", method, path, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	return resp.StatusCode, v
}

func (s *server) post(path string, body any) (int, map[string]any) {
	s.t.Helper()
	return s.call("POST", path, workerToken, body)
}

func wireIntent(step int64, payload any) map[string]any {
	return map[string]any{"run": "run-1", "step": step, "kind": "send_email", "target": "ada@example.com", "payload": payload}
}

func write() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func claimBody(in map[string]any) map[string]any {
	return map[string]any{"intent": in, "write": write()}
}

func ref(a map[string]any) map[string]any {
	return map[string]any{"key": a["key"], "attempt": a["attempt"], "token": a["token"]}
}

func outcome(a map[string]any, outcome string, extra map[string]any) map[string]any {
	b := ref(a)
	b["write"], b["outcome"] = write(), outcome
	for k, v := range extra {
		b[k] = v
	}
	return b
}

func want(t *testing.T, what string, code int, v map[string]any, wantCode int, field, value string) {
	t.Helper()
	if code != wantCode || (field != "" && v[field] != value) {
		t.Fatalf("%s = %d %v; want %d with %s %q", what, code, v, wantCode, field, value)
	}
}

// TestRoutesAreDocumented: the routes the server serves and the paths
// of openapi.json are the same, method by method.
func TestRoutesAreDocumented(t *testing.T) {
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(protocol.OpenAPI(), &doc); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	var documented []string
	for path, ops := range doc.Paths {
		for m := range ops {
			documented = append(documented, strings.ToUpper(m)+" "+path)
		}
	}
	served := protocol.Routes()
	slices.Sort(documented)
	slices.Sort(served)
	if !slices.Equal(documented, served) {
		t.Fatalf("openapi.json documents\n  %q\nthe server serves\n  %q", documented, served)
	}
	// And each route served is answered by its handler, not the
	// catch-all: an unauthenticated call is refused, not "no such route".
	s := newServer(t, stores(t)["sqlite"](t), once.Config{})
	for _, r := range served {
		method, path, _ := strings.Cut(r, " ")
		code, v := s.call(method, strings.ReplaceAll(path, "{key}", "k"), "", map[string]any{})
		if v["code"] == "no_such_route" || (code != 401 && code != 200) {
			t.Errorf("%s without a token = %d %v; want 401 from its route (or 200 for an open one)", r, code, v)
		}
	}
}

// TestClaimAnswers walks a claim through each of its answers.
func TestClaimAnswers(t *testing.T) {
	for name, open := range stores(t) {
		t.Run(name, func(t *testing.T) {
			s := newServer(t, open(t), once.Config{})
			in := wireIntent(1, map[string]any{"subject": "hello"})

			code, a := s.post("/v1/claim", claimBody(in))
			want(t, "claim", code, a, 200, "answer", "claimed")
			if a["attempt"] != 1.0 || a["token"] == "" || a["provider_key"] == "" || a["stop_after_ms"].(float64) <= 0 || a["heartbeat_every_ms"].(float64) <= 0 {
				t.Fatalf("claimed = %v", a)
			}
			k, f, _ := once.KeyOf(once.Intent{Run: "run-1", Step: 1, Kind: "send_email", Target: "ada@example.com", Payload: json.RawMessage(`{"subject":"hello"}`)})
			if a["key"] != string(k) || a["fingerprint"] != string(f) {
				t.Fatalf("key %v fingerprint %v; want the Go client's %s %s", a["key"], a["fingerprint"], k, f)
			}

			code, v := s.post("/v1/claim", claimBody(in))
			want(t, "a duplicate's claim while held", code, v, 409, "code", "in_flight")
			if v["retry_after_ms"].(float64) <= 0 {
				t.Fatalf("in flight without when to come back: %v", v)
			}
			changed := wireIntent(1, map[string]any{"subject": "changed"})
			code, v = s.post("/v1/claim", claimBody(changed))
			want(t, "a claim with another payload", code, v, 422, "code", "fingerprint_mismatch")

			code, v = s.post("/v1/heartbeat", ref(a))
			want(t, "heartbeat", code, v, 200, "", "")
			if v["stop_after_ms"].(float64) <= 0 {
				t.Fatalf("heartbeat = %v", v)
			}
			code, v = s.post("/v1/outcome", outcome(a, "succeeded", map[string]any{"result": map[string]any{"id": "msg-1"}}))
			want(t, "outcome", code, v, 200, "status", "succeeded")

			code, v = s.post("/v1/claim", claimBody(in))
			want(t, "a claim after success", code, v, 200, "answer", "replayed")
			if r, _ := json.Marshal(v["result"]); string(r) != `{"id":"msg-1"}` {
				t.Fatalf("replayed result %s", r)
			}
			code, v = s.post("/v1/heartbeat", ref(a))
			want(t, "heartbeat after the outcome", code, v, 409, "code", "fenced")

			// A permanent failure is replayed as failed.
			in2 := wireIntent(2, nil)
			_, a2 := s.post("/v1/claim", claimBody(in2))
			code, v = s.post("/v1/outcome", outcome(a2, "permanent", map[string]any{"error": "550 no such mailbox"}))
			want(t, "permanent", code, v, 200, "status", "failed")
			code, v = s.post("/v1/claim", claimBody(in2))
			want(t, "a claim after a permanent failure", code, v, 200, "answer", "failed")
			if !strings.Contains(v["message"].(string), "550 no such mailbox") {
				t.Fatalf("failed = %v", v)
			}

			// Retry later releases: the next claim is attempt 2, with
			// the same provider key.
			in3 := wireIntent(3, nil)
			_, a3 := s.post("/v1/claim", claimBody(in3))
			code, v = s.post("/v1/outcome", outcome(a3, "retry_later", map[string]any{"error": "429 slow down"}))
			want(t, "retry_later", code, v, 200, "status", "released")
			code, v = s.post("/v1/claim", claimBody(in3))
			want(t, "a claim after retry_later", code, v, 200, "answer", "claimed")
			if v["attempt"] != 2.0 || v["provider_key"] != a3["provider_key"] {
				t.Fatalf("reclaimed = %v; want attempt 2 with provider key %v", v, a3["provider_key"])
			}

			// The intent is checked before anything is written.
			bad := wireIntent(4, nil)
			bad["run"] = ""
			code, v = s.post("/v1/claim", claimBody(bad))
			want(t, "a claim without a run", code, v, 400, "code", "invalid_intent")
			if v["field"] != "Run" {
				t.Fatalf("invalid intent names %v; want Run", v["field"])
			}
			kb := claimBody(wireIntent(5, nil))
			kb["key"] = strings.Repeat("0", 64)
			code, v = s.post("/v1/claim", kb)
			want(t, "a claim whose client computed another key", code, v, 422, "code", "key_mismatch")
			if _, err := s.c.Get(context.Background(), once.Key(v["key"].(string))); err == nil {
				t.Fatal("a claim refused for its key wrote a row")
			}
		})
	}
}

// TestClaimSentAgain: the claim's reply is lost and the client sends
// the same request again: it gets the attempt the first won, and
// another client's claim meets it in flight. The outcome sent again
// gets the same answer; another outcome after it is a conflict.
func TestClaimSentAgain(t *testing.T) {
	for name, open := range stores(t) {
		t.Run(name, func(t *testing.T) {
			s := newServer(t, open(t), once.Config{})
			body := claimBody(wireIntent(1, nil))
			_, first := s.post("/v1/claim", body)
			code, again := s.post("/v1/claim", body)
			want(t, "the same claim sent again", code, again, 200, "answer", "claimed")
			if again["token"] != first["token"] || again["attempt"] != first["attempt"] {
				t.Fatalf("sent again = %v; want the first's attempt %v token %v", again, first["attempt"], first["token"])
			}
			o := outcome(again, "succeeded", map[string]any{"result": "250 queued"})
			for i := range 2 {
				code, v := s.post("/v1/outcome", o)
				want(t, "the outcome, sent #"+string(rune('1'+i)), code, v, 200, "status", "succeeded")
			}
			code, v := s.post("/v1/outcome", outcome(first, "permanent", map[string]any{"error": "no"}))
			want(t, "another outcome after it", code, v, 409, "code", "conflict")
			evs, err := s.c.Events(context.Background(), once.Key(first["key"].(string)))
			if err != nil {
				t.Fatal(err)
			}
			var types []string
			for _, e := range evs {
				types = append(types, string(e.Type))
			}
			if strings.Join(types, ",") != "claimed,succeeded" {
				t.Fatalf("trail %v; want one claim and one outcome", types)
			}
		})
	}
}

// TestHeartbeatFenced: a worker paused past its lease comes back; the
// lease lapsed and another took the action over: its heartbeat and its
// outcome are fenced, and nothing it says is recorded.
func TestHeartbeatFenced(t *testing.T) {
	for name, open := range stores(t) {
		t.Run(name, func(t *testing.T) {
			s := newServer(t, open(t), once.Config{Default: once.KindPolicy{Lease: time.Second, Recovery: once.RetryWithProviderKey}})
			in := wireIntent(1, nil)
			_, a := s.post("/v1/claim", claimBody(in))
			time.Sleep(1200 * time.Millisecond)
			code, b := s.post("/v1/claim", claimBody(in))
			want(t, "a claim after the lease lapsed", code, b, 200, "answer", "claimed")
			if b["attempt"] != 2.0 {
				t.Fatalf("takeover = %v; want attempt 2", b)
			}
			code, v := s.post("/v1/heartbeat", ref(a))
			want(t, "the paused worker's heartbeat", code, v, 409, "code", "fenced")
			code, v = s.post("/v1/outcome", outcome(a, "succeeded", nil))
			want(t, "the paused worker's outcome", code, v, 409, "code", "fenced")
			code, v = s.post("/v1/outcome", outcome(b, "succeeded", map[string]any{"result": "second"}))
			want(t, "the takeover's outcome", code, v, 200, "status", "succeeded")
		})
	}
}

// TestApprovalOverTheProtocol: a gated claim waits; a worker cannot
// decide it; an operator approves; the next claim runs it.
func TestApprovalOverTheProtocol(t *testing.T) {
	s := newServer(t, stores(t)["sqlite"](t), once.Config{Kinds: map[string]once.KindPolicy{"send_email": {Approval: once.ApprovalPolicy{Always: true}}}})
	in := wireIntent(1, nil)
	code, v := s.post("/v1/claim", claimBody(in))
	want(t, "a gated claim", code, v, 409, "code", "awaiting_approval")
	key := v["key"].(string)
	code, v = s.call("POST", "/v1/actions/"+key+"/approve", workerToken, map[string]any{"by": "ada"})
	want(t, "a worker's approval", code, v, 403, "code", "forbidden")
	code, v = s.call("POST", "/v1/actions/"+key+"/approve", operatorToken, map[string]any{"by": "ada", "attempt": 1})
	want(t, "an operator's approval", code, v, 200, "status", "approved")
	code, v = s.post("/v1/claim", claimBody(in))
	want(t, "the claim after approval", code, v, 200, "answer", "claimed")
	code, v = s.call("GET", "/v1/actions/"+key, workerToken, nil)
	want(t, "GET the action", code, v, 200, "status", "in_flight")
}

// TestRefusals: what the server refuses, before anything is claimed,
// and how it says so.
func TestRefusals(t *testing.T) {
	s := newServer(t, stores(t)["sqlite"](t), once.Config{})
	in := wireIntent(1, nil)
	cases := []struct {
		name, token string
		body        any
		status      int
		code, says  string
	}{
		{"no token", "", claimBody(in), 401, "unauthorized", "Bearer"},
		{"a wrong token", "not-a-token-of-this-server", claimBody(in), 401, "unauthorized", "Bearer"},
		{"no write token", workerToken, map[string]any{"intent": in}, 400, "bad_request", "write"},
		{"a misspelt field", workerToken, map[string]any{"intent": in, "write": write(), "payload": 1}, 400, "bad_request", "unknown field"},
		{"not JSON", workerToken, "{", 400, "bad_request", "JSON"},
		{"two values", workerToken, `{"intent":{},"write":"x"} {}`, 400, "bad_request", ""},
		{"a huge body", workerToken, `{"intent":{"run":"` + strings.Repeat("x", protocol.DefaultMaxBody) + `"}}`, 413, "too_large", "bytes"},
		{"a negative wait", workerToken, map[string]any{"intent": in, "write": write(), "wait_ms": -1}, 400, "bad_request", "wait_ms"},
		{"both payloads", workerToken, claimBody(map[string]any{"run": "r", "kind": "k", "payload": 1, "payload_base64": "AA=="}), 400, "invalid_intent", "payload"},
		{"bad base64", workerToken, claimBody(map[string]any{"run": "r", "kind": "k", "payload_base64": "*"}), 400, "invalid_intent", "base64"},
	}
	for _, c := range cases {
		code, v := s.call("POST", "/v1/claim", c.token, c.body)
		if code != c.status || v["code"] != c.code || !strings.Contains(v["detail"].(string), c.says) {
			t.Errorf("%s: %d %v; want %d %s saying %q", c.name, code, v, c.status, c.code, c.says)
		}
	}
	if n, err := s.c.Count(context.Background(), once.Filter{}); err != nil || n != 0 {
		t.Fatalf("refused claims wrote %d rows (%v)", n, err)
	}
	code, v := s.post("/v1/outcome", map[string]any{"key": "k", "attempt": 1, "token": "t", "write": write(), "outcome": "maybe"})
	want(t, "an outcome that is not one", code, v, 400, "code", "bad_request")
	code, v = s.post("/v1/outcome", map[string]any{"key": "k", "attempt": 1, "token": "t", "write": write(), "outcome": "unknown"})
	want(t, "an unknown outcome without its error", code, v, 400, "code", "bad_request")
	code, v = s.call("GET", "/v1/nothing", workerToken, nil)
	want(t, "a route that is not one", code, v, 404, "code", "no_such_route")
	if _, err := protocol.New(protocol.Config{Client: s.c}); err == nil {
		t.Fatal("a server with no token was made")
	}
}

// TestKeysMatchTheVectors: /v1/keys gives every vector of KEYS.md its
// key and fingerprint, with the payload as a client sends it (JSON as
// it is, raw bytes in base64, none left out), and refuses a key the
// client computed otherwise.
func TestKeysMatchTheVectors(t *testing.T) {
	raw, err := os.ReadFile("../testdata/keys/vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Vectors []struct {
			Name   string `json:"name"`
			Intent struct {
				Run, Kind, Target string
				Step              int64
				Payload           *struct {
					JSON   *string `json:"json"`
					RawHex *string `json:"raw_hex"`
				} `json:"payload"`
				PayloadInKey bool `json:"payload_in_key"`
			} `json:"intent"`
			Key, Fingerprint string
		} `json:"vectors"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil || len(doc.Vectors) == 0 {
		t.Fatalf("vectors: %v", err)
	}
	s := newServer(t, stores(t)["sqlite"](t), once.Config{})
	for _, v := range doc.Vectors {
		in := map[string]any{"run": v.Intent.Run, "step": v.Intent.Step, "kind": v.Intent.Kind, "target": v.Intent.Target, "payload_in_key": v.Intent.PayloadInKey}
		if p := v.Intent.Payload; p != nil && p.JSON != nil {
			in["payload"] = json.RawMessage(*p.JSON)
		} else if p != nil && p.RawHex != nil {
			b, _ := hex.DecodeString(*p.RawHex)
			in["payload_base64"] = base64.StdEncoding.EncodeToString(b)
		}
		code, got := s.post("/v1/keys", map[string]any{"intent": in, "key": v.Key, "fingerprint": v.Fingerprint})
		if code != 200 || got["key"] != v.Key || got["fingerprint"] != v.Fingerprint {
			t.Errorf("%s: %d %v; want key %s fingerprint %s", v.Name, code, got, v.Key, v.Fingerprint)
		}
	}
	code, got := s.post("/v1/keys", map[string]any{"intent": wireIntent(1, nil), "fingerprint": strings.Repeat("f", 64)})
	want(t, "keys with another fingerprint", code, got, 422, "code", "key_mismatch")
}
