package idemhttp_test

import (
	"context"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/oncehq/once"
	"github.com/oncehq/once/idemhttp"
	"github.com/oncehq/once/internal/testdb"
)

// reviewed starts a server whose handler panics (so its key goes to
// review) behind a middleware with cfg, sends it one request with key
// k-1, and resolves the action Done with result, as a person would.
func reviewed(t *testing.T, cfg idemhttp.Config, result json.RawMessage) *httptest.Server {
	t.Helper()
	c, _ := testdb.SQLiteClient(t, once.Config{})
	cfg.Scope = func(*http.Request) string { return "t" }
	h := idemhttp.Middleware(c, cfg)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("half done") }))
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	t.Cleanup(srv.Close)
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{}`))
	req.Header.Set(idemhttp.Header, "k-1")
	if resp, err := fresh.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("the panicking request was answered %d; want the connection dropped", resp.StatusCode)
	}
	acts, err := c.List(context.Background(), once.Filter{Status: once.StatusReview})
	if err != nil || len(acts) != 1 {
		t.Fatalf("actions in review: %v %v; want one", acts, err)
	}
	if _, err := c.Resolve(context.Background(), acts[0].Key, once.Resolution{Decision: once.DecisionDone, Result: result, By: "ops", Note: "done by hand"}); err != nil {
		t.Fatal(err)
	}
	return srv
}

// TestReplayedHeadersAreTheReplayHeaders: a stored response is replayed
// with the ReplayHeaders only, whoever stored it: a person's Done with a
// result shaped like a response, or a record made under another
// configuration. A header with a name or value no response may carry
// (a line break, a control byte), or a status outside 200 to 599, is not
// served.
func TestReplayedHeadersAreTheReplayHeaders(t *testing.T) {
	stored := func(status int, header map[string][]string, body string) json.RawMessage {
		b, err := json.Marshal(map[string]any{"status": status, "header": header, "body": []byte(body)})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	send := func(t *testing.T, srv *httptest.Server) reply {
		return post(t, srv.URL, "k-1", "a", `{}`)
	}

	t.Run("only the ReplayHeaders", func(t *testing.T) {
		srv := reviewed(t, idemhttp.Config{}, stored(http.StatusCreated, map[string][]string{
			"Set-Cookie":      {"session=attacker; Path=/"},
			"Content-Type":    {"application/json"},
			"Location":        {"/orders/17"},
			"X-Frame-Options": {"ALLOWALL"},
			"Refresh":         {"0; url=https://attacker.example/"},
		}, `{"order":17}`))
		r := send(t, srv)
		if r.status != http.StatusCreated || r.body != `{"order":17}` || r.header.Get(idemhttp.ReplayedHeader) != "true" {
			t.Fatalf("replay: %d %s %v; want the stored 201", r.status, r.body, r.header)
		}
		for _, h := range []string{"Set-Cookie", "X-Frame-Options", "Refresh"} {
			if v := r.header.Values(h); len(v) > 0 {
				t.Errorf("replay carries %s: %q; it is not in ReplayHeaders", h, v)
			}
		}
		if r.header.Get("Location") != "/orders/17" || r.header.Get("Content-Type") != "application/json" {
			t.Errorf("replay lost a ReplayHeader: %v", r.header)
		}
		if r.header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("replay has X-Content-Type-Options %q, want nosniff", r.header.Get("X-Content-Type-Options"))
		}
	})

	t.Run("ReplayHeaders narrowed since", func(t *testing.T) {
		srv := reviewed(t, idemhttp.Config{ReplayHeaders: []string{"Content-Type"}}, stored(http.StatusCreated, map[string][]string{
			"Content-Type": {"application/json"},
			"Location":     {"/orders/17"},
		}, `{"order":17}`))
		if r := send(t, srv); r.header.Get("Location") != "" || r.header.Get("Content-Type") != "application/json" {
			t.Fatalf("replay headers %v; want Content-Type only", r.header)
		}
	})

	t.Run("a value no header may carry", func(t *testing.T) {
		srv := reviewed(t, idemhttp.Config{}, stored(http.StatusCreated, map[string][]string{
			"Location":     {"/orders/17\r\nSet-Cookie: session=attacker"},
			"Content-Type": {"application/json\x00"},
		}, `{"order":17}`))
		r := send(t, srv)
		if r.status != http.StatusCreated || len(r.header.Values("Set-Cookie")) > 0 || r.header.Get("Location") != "" || strings.Contains(r.header.Get("Content-Type"), "json") {
			t.Fatalf("replay: %d %v; want 201 without the malformed Location and Content-Type", r.status, r.header)
		}
	})

	for _, status := range []int{0, 101, 199, 600, 999} {
		t.Run("status "+http.StatusText(status), func(t *testing.T) {
			srv := reviewed(t, idemhttp.Config{}, stored(status, nil, `hello`))
			if code := problemOf(t, send(t, srv), http.StatusConflict); code != "response-not-recorded" {
				t.Fatalf("stored status %d replayed as %q; want response-not-recorded", status, code)
			}
		})
	}
}

// TestReplayHeadersRefusedAtConstruction: headers that frame one
// message on one connection, or set a cookie, cannot be stored and sent
// again to whoever repeats the key: Middleware refuses them at startup.
func TestReplayHeadersRefusedAtConstruction(t *testing.T) {
	c, _ := testdb.SQLiteClient(t, once.Config{})
	for _, h := range []string{"Set-Cookie", "content-length", "Transfer-Encoding", "Connection", "Upgrade", "Trailer", "Idempotent-Replayed", "Bad Name", ""} {
		t.Run(h, func(t *testing.T) {
			defer func() {
				if p := recover(); p == nil || !strings.Contains(fmtAny(p), "ReplayHeaders") {
					t.Fatalf("recovered %v; want a panic naming ReplayHeaders", p)
				}
			}()
			idemhttp.Middleware(c, idemhttp.Config{Scope: func(*http.Request) string { return "t" }, ReplayHeaders: []string{"Content-Type", h}})
		})
	}
}

func fmtAny(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	if e, ok := v.(error); ok {
		return e.Error()
	}
	return ""
}
