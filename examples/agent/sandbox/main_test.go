package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/oncehq/once"
	"github.com/oncehq/once/idemhttp"
	"github.com/oncehq/once/smtpsend"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines leaked:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// syncBuffer is an io.Writer the sandbox's goroutines share.
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

// waitFor waits until out matches re, and returns the match.
func waitFor(t *testing.T, out *syncBuffer, re *regexp.Regexp) []string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			return m
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no %q in the sandbox's output:\n%s", re, out.String())
	return nil
}

// TestSandbox starts the sandbox on free ports, sends it a message and
// the same charge twice, and checks what it prints: each arrival, the
// replayed request, and the counts when it stops.
func TestSandbox(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &syncBuffer{}
	errOut := &syncBuffer{}
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"--smtp", "127.0.0.1:0", "--http", "127.0.0.1:0"}, out, errOut) }()
	m := waitFor(t, out, regexp.MustCompile(`mail server on (\S+), payment provider on (\S+);`))
	smtpAddr, base := m[1], m[2]

	s := &smtpsend.Sender{Addr: smtpAddr, Timeout: 10 * time.Second}
	if _, err := s.Send(ctx, once.Attempt{Key: "k-mail", Number: 1}, smtpsend.Message{From: "shop@example.com", To: []string{"ada@example.com"}, Subject: "Hi", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &idemhttp.Transport{}}
	defer hc.CloseIdleConnections()
	post := func(path, key, body string) {
		req, _ := http.NewRequestWithContext(idemhttp.WithKey(ctx, key), http.MethodPost, base+path, strings.NewReader(body))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	post("/v1/customers", "k-cus", `{"email":"ada@example.com"}`)
	post("/v1/charges", "k-charge", `{"customer":"cus_1","amount":100,"currency":"eur"}`)
	post("/v1/charges", "k-charge", `{"customer":"cus_1","amount":100,"currency":"eur"}`)

	waitFor(t, out, regexp.MustCompile(`mailbox +ada@example.com +"Hi" +<k-mail@once>  copy 1`))
	waitFor(t, out, regexp.MustCompile(`provider +POST /v1/charges +key k-charge +request 1 with this key  200  created ch_1`))
	waitFor(t, out, regexp.MustCompile(`provider +POST /v1/charges +key k-charge +request 2 with this key  200  replayed the stored answer; nothing created`))

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v\n%s", err, errOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the sandbox did not stop")
	}
	if !strings.Contains(out.String(), "sandbox: 1 message, none twice; 2 objects at the provider: cus_1 (key k-cus, 1 request) ch_1 (key k-charge, 2 requests)") {
		t.Errorf("summary missing or wrong:\n%s", out.String())
	}
}

// TestSandboxFlags: bad flags are refused by name.
func TestSandboxFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--hold-charge", "-1s"}, "must not be negative"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"--smtp", "127.0.0.1:0", "--http", "256.0.0.1:x"}, "--http 256.0.0.1:x"},
	} {
		var out, errOut syncBuffer
		err := run(context.Background(), tc.args, &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("sandbox %q: %v; want %q", tc.args, err, tc.want)
		}
	}
}
