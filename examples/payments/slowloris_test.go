package main

import (
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// dribble opens a connection to p, writes head, then one byte of more
// a second until the connection breaks. It returns a channel closed when
// the server closes the connection (a read ends).
func dribble(t *testing.T, p *proc, head, more string) <-chan struct{} {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(p.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	go func() {
		for i := 0; ; i = (i + 1) % len(more) {
			time.Sleep(time.Second)
			if _, err := conn.Write([]byte{more[i]}); err != nil {
				return
			}
		}
	}()
	closed := make(chan struct{})
	go func() {
		io.Copy(io.Discard, conn)
		close(closed)
	}()
	return closed
}

// TestSlowClientsAreCut: a client that sends its request a byte a second,
// in the header or in the body, must not hold its connection (and the
// goroutine and buffers behind it) for as long as it likes. The server
// cuts it at its read timeouts; the test gives it a minute.
func TestSlowClientsAreCut(t *testing.T) {
	t.Parallel()
	p := start(t, filepath.Join(t.TempDir(), "payments.db"))
	headers := dribble(t, p, "POST /charges HTTP/1.1\r\nHost: payments\r\n", "X-Slow: aaaaaaaaaaaaaaaaaaaa\r\n")
	body := dribble(t, p, "POST /charges HTTP/1.1\r\nHost: payments\r\nIdempotency-Key: k-slow\r\nContent-Type: application/json\r\nContent-Length: 16000\r\n\r\n", `{"amount":1250,`)
	for name, closed := range map[string]<-chan struct{}{"headers": headers, "body": body} {
		select {
		case <-closed:
		case <-time.After(time.Minute):
			t.Errorf("a client sending its %s a byte a second still held its connection after a minute", name)
		}
	}
}

// sockets counts the sockets process pid holds open.
func sockets(t *testing.T, pid int) int {
	t.Helper()
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	fds, err := os.ReadDir(dir)
	if err != nil {
		t.Skipf("counting the server's sockets needs %s: %v", dir, err)
	}
	n := 0
	for _, fd := range fds {
		if link, err := os.Readlink(filepath.Join(dir, fd.Name())); err == nil && strings.HasPrefix(link, "socket:") {
			n++
		}
	}
	return n
}

// TestConnectionCap: connections past --max-conns wait to be accepted
// instead of each taking a goroutine and buffers: twenty slow clients
// against a cap of 8 leave the server holding 8 (and its listener), and
// it says so in its log. Once the slow ones are cut, a request is served.
func TestConnectionCap(t *testing.T) {
	t.Parallel()
	p := start(t, filepath.Join(t.TempDir(), "payments.db"), "--max-conns", "8")
	for range 20 {
		dribble(t, p, "GET /charges HTTP/1.1\r\n", "X-Slow: aaaaaaaaaaaaaaaaaaaa\r\n")
	}
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(p.stderr.String(), "connection limit reached"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("20 slow clients against --max-conns 8: the server never said it reached its connection limit; it holds %d sockets", sockets(t, p.cmd.Process.Pid))
		}
	}
	if n := sockets(t, p.cmd.Process.Pid); n > 8+1 {
		t.Fatalf("the server holds %d sockets; want at most 8 connections and its listener", n)
	}
	a, err := send("GET", p.base+"/charges", "", "", "")
	if err != nil || a.status != 200 {
		t.Fatalf("a request once the slow clients were cut: %+v %v; want 200", a, err)
	}
}

// TestHeadersTooLarge: request headers past 16 KiB (and net/http's
// slack) are refused with 431 before anything reads them further.
func TestHeadersTooLarge(t *testing.T) {
	t.Parallel()
	p := start(t, filepath.Join(t.TempDir(), "payments.db"))
	req, err := http.NewRequest(http.MethodGet, p.base+"/charges", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Big", strings.Repeat("a", 32<<10))
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("32 KiB of headers: %d; want 431", resp.StatusCode)
	}
}
