package console_test

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/oncehq/once/console"
	"github.com/oncehq/once/internal/testdb"
)

// clientFrom is an HTTP client whose connections come from the loopback
// address ip, and which does not follow redirects.
func clientFrom(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	return &http.Client{
		Timeout:       10 * time.Second,
		Transport:     &http.Transport{DialContext: d.DialContext},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// TestTokenGuessesAreLimitedAndLogged: 200 wrong tokens from one
// address, over real connections, as the header, the cookie and
// ?token=. Past a small burst they are answered 429 with Retry-After and
// no longer checked; the failures reach the log in a few lines that
// name the address and never the token. A right token from another
// address still logs in (the login is logged) and reads the API. Before,
// all 200 were answered 401 at full speed and nothing was logged.
func TestTokenGuessesAreLimitedAndLogged(t *testing.T) {
	const token = "the-right-token-0123456789"
	var log testdb.LockedBuffer
	b := setup(t, console.Config{Token: token, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	srv := httptest.NewServer(b.h)
	t.Cleanup(srv.Close)

	attacker := clientFrom("127.0.0.2")
	const guesses = 200
	codes := map[int]int{}
	retryAfter := ""
	for i := range guesses {
		guess := fmt.Sprintf("guess-%04d", i)
		var req *http.Request
		switch i % 3 {
		case 0:
			req, _ = http.NewRequest(http.MethodGet, srv.URL+"/api/stats", nil)
			req.Header.Set("Authorization", "Bearer "+guess)
		case 1:
			req, _ = http.NewRequest(http.MethodGet, srv.URL+"/review", nil)
			req.AddCookie(&http.Cookie{Name: "once_token", Value: "Z3Vlc3M"}) // base64 of "guess"
		case 2:
			req, _ = http.NewRequest(http.MethodGet, srv.URL+"/?token="+guess, nil)
		}
		resp, err := attacker.Do(req)
		if err != nil {
			t.Fatalf("guess %d: %v", i, err)
		}
		resp.Body.Close()
		codes[resp.StatusCode]++
		if !resp.Close {
			t.Errorf("guess %d: %d keeps the connection open; want Connection: close", i, resp.StatusCode)
		}
		if resp.StatusCode == http.StatusTooManyRequests && retryAfter == "" {
			retryAfter = resp.Header.Get("Retry-After")
		}
		if resp.StatusCode != http.StatusUnauthorized && resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("guess %d: %d, want 401 or 429", i, resp.StatusCode)
		}
	}
	if codes[http.StatusTooManyRequests] < guesses/2 {
		t.Errorf("%d wrong tokens from one address: %v; want most of them answered 429", guesses, codes)
	}
	if retryAfter == "" {
		t.Errorf("a 429 without Retry-After")
	}

	// The operator, on another address, logs in with ?token= and then
	// uses the cookie; a script uses the header.
	op := clientFrom("127.0.0.3")
	resp, err := op.Get(srv.URL + "/review?token=" + token)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == "once_token" {
			cookie = c
		}
	}
	if resp.StatusCode != http.StatusSeeOther || cookie == nil {
		t.Fatalf("login with the right token from another address: %d, cookie %v", resp.StatusCode, cookie)
	}
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/review", nil)
	req.AddCookie(cookie)
	if resp, err = op.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/review with the login's cookie: %d, want 200", resp.StatusCode)
	}
	req, _ = http.NewRequest(http.MethodGet, srv.URL+"/api/stats", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	if resp, err = op.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/api/stats with the right token from another address: %d, want 200", resp.StatusCode)
	}

	out := log.String()
	var failures []string
	for line := range strings.Lines(out) {
		if strings.Contains(line, "wrong token") {
			failures = append(failures, line)
		}
	}
	if len(failures) == 0 || len(failures) > 5 {
		t.Errorf("%d log lines for %d wrong tokens; want a few (rate-limited):\n%s", len(failures), guesses, out)
	}
	for _, line := range failures {
		if !strings.Contains(line, "remote=127.0.0.2") {
			t.Errorf("a failure's log line does not name the address: %s", line)
		}
	}
	if !strings.Contains(out, "token login") || !strings.Contains(out, "remote=127.0.0.3") {
		t.Errorf("the login is not in the log:\n%s", out)
	}
	if strings.Contains(out, token) || strings.Contains(out, "guess-") || strings.Contains(out, "Z3Vlc3M") {
		t.Errorf("the log holds a token:\n%s", out)
	}
}
