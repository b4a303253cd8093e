package idemhttp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/oncehq/once"
	"github.com/oncehq/once/idemhttp"
	"github.com/oncehq/once/internal/testdb"
)

// statusProvider answers /status/N with status N and a body naming it;
// /hang-up closes the connection without an answer.
func statusProvider(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hang-up" {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		code, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/status/"))
		if code >= 300 && code < 400 {
			w.Header().Set("Location", "/elsewhere")
		}
		w.WriteHeader(code)
		fmt.Fprintf(w, "answer %d\x1b[2J", code)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// classOf names what an effect's error makes of its action.
func classOf(err error) string {
	switch {
	case err == nil:
		return "succeeded"
	case errors.Is(err, once.ErrPermanent):
		return "permanent"
	case errors.Is(err, once.ErrRetryLater):
		return "retry later"
	}
	return "unknown"
}

// TestOutcomeClassifiesTheProviderAnswer: a 2xx is a success; a 4xx
// the provider will give again (a declined card, a malformed request)
// is Permanent; a 409 (the key's first request still runs), 408, 425,
// 429, a 5xx, an answer that is neither success nor refusal (3xx) and
// every transport error are unknown outcomes, which the kind's recovery
// decides: the provider may have acted. The body stays readable.
func TestOutcomeClassifiesTheProviderAnswer(t *testing.T) {
	srv := statusProvider(t)
	hc := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, tc := range []struct {
		code int
		want string
	}{
		{200, "succeeded"}, {201, "succeeded"}, {204, "succeeded"},
		{301, "unknown"}, {303, "unknown"},
		{400, "permanent"}, {402, "permanent"}, {404, "permanent"}, {410, "permanent"}, {422, "permanent"},
		{408, "unknown"}, {409, "unknown"}, {425, "unknown"}, {429, "unknown"},
		{500, "unknown"}, {502, "unknown"}, {503, "unknown"}, {504, "unknown"},
	} {
		resp, err := hc.Post(srv.URL+"/status/"+strconv.Itoa(tc.code), "application/json", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		got := idemhttp.Outcome(resp, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if classOf(got) != tc.want {
			t.Errorf("%d: %v is %s; want %s", tc.code, got, classOf(got), tc.want)
		}
		if want := fmt.Sprintf("answer %d\x1b[2J", tc.code); tc.code != 204 && string(body) != want {
			t.Errorf("%d: the body read after Outcome is %q; want %q whole", tc.code, body, want)
		}
		var se *idemhttp.StatusError
		if tc.want != "succeeded" {
			if !errors.As(got, &se) || se.StatusCode != tc.code {
				t.Errorf("%d: %v is no *StatusError with its status", tc.code, got)
			} else if msg := got.Error(); !strings.Contains(msg, strconv.Itoa(tc.code)) || strings.Contains(msg, "\x1b") || strings.Contains(msg, srv.URL+"/status/?") {
				t.Errorf("%d: message %q; want the status, the body escaped", tc.code, msg)
			}
		}
	}

	// Transport errors: a hang-up after the request went out, and a
	// refused connection (Go's client resends a keyed request by itself
	// on a connection that broke, so even a refused one may follow a
	// request that arrived).
	_, hangUp := hc.Post(srv.URL+"/hang-up", "application/json", strings.NewReader(`{}`))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	_, refused := hc.Post("http://"+closed+"/charges", "application/json", strings.NewReader(`{}`))
	for name, err := range map[string]error{"hang-up": hangUp, "refused": refused} {
		if err == nil {
			t.Fatalf("%s: no transport error", name)
		}
		if got := idemhttp.Outcome(nil, err); classOf(got) != "unknown" || !errors.Is(got, err) {
			t.Errorf("%s: %v is %s; want unknown, wrapping the transport error", name, got, classOf(got))
		}
	}
}

// TestOutcomeThroughDo: what Outcome returns becomes the action's
// status: a 402 fails it for good, and every duplicate gets the failure;
// a 503 under RetryWithProviderKey releases it for the next delivery,
// and under the default recovery a person reviews it.
func TestOutcomeThroughDo(t *testing.T) {
	srv := statusProvider(t)
	c, _ := testdb.SQLiteClient(t, once.Config{Kinds: map[string]once.KindPolicy{"charge": {Recovery: once.RetryWithProviderKey}}})
	hc := &http.Client{Transport: &idemhttp.Transport{}}
	call := func(code int) func(context.Context, once.Attempt) (string, error) {
		return func(ctx context.Context, a once.Attempt) (string, error) {
			req, err := http.NewRequestWithContext(idemhttp.WithKey(ctx, a.ProviderKey), http.MethodPost, srv.URL+"/status/"+strconv.Itoa(code), nil)
			if err != nil {
				return "", once.Permanent(err)
			}
			resp, err := hc.Do(req)
			if err := idemhttp.Outcome(resp, err); err != nil {
				if resp != nil {
					resp.Body.Close()
				}
				return "", err
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			return string(b), err
		}
	}
	for _, tc := range []struct {
		kind string
		code int
		want once.Status
	}{
		{"charge", 402, once.StatusFailed},
		{"charge", 503, once.StatusReleased},
		{"email", 503, once.StatusReview},
		{"charge", 201, once.StatusSucceeded},
	} {
		in := once.Intent{Run: "order-" + strconv.Itoa(tc.code) + tc.kind, Kind: tc.kind, Target: "cus_1"}
		res, err := once.Do(context.Background(), c, in, call(tc.code))
		key, _, _ := once.KeyOf(in)
		a, gerr := c.Get(context.Background(), key)
		if gerr != nil {
			t.Fatal(gerr)
		}
		if a.Status != tc.want {
			t.Errorf("%s answered %d: the action is %s (%v); want %s", tc.kind, tc.code, a.Status, err, tc.want)
		}
		if tc.want == once.StatusSucceeded && res.Value != "answer 201\x1b[2J" {
			t.Errorf("201: value %q", res.Value)
		}
	}
}
