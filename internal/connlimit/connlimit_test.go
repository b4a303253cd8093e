package connlimit

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestMax: the listener never holds more than its cap of open
// connections; a closed one makes room for the next.
func TestMax(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const limit, clients = 2, 6
	ln := Listen(inner, Limits{Max: limit})
	var open, most atomic.Int32
	accepted := make(chan net.Conn, clients)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			n := open.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			accepted <- c
		}
	}()
	var dialed []net.Conn
	for range clients {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		dialed = append(dialed, c)
	}
	// Take the first two, hold them while the rest wait, then close one
	// at a time: each close lets exactly one more in.
	var held []net.Conn
	for range limit {
		held = append(held, <-accepted)
	}
	for i := 0; i < clients; i++ {
		c := held[0]
		held = held[1:]
		open.Add(-1)
		c.Close()
		if i+limit < clients {
			held = append(held, <-accepted)
		}
	}
	ln.Close()
	if _, ok := <-accepted; ok {
		t.Errorf("the listener accepted more than the %d clients dialed", clients)
	}
	for _, c := range dialed {
		c.Close()
	}
	if m := most.Load(); m > limit {
		t.Errorf("%d connections were open at once, over the cap of %d", m, limit)
	}
}

// serve runs an http.Server on a Listener with lim over loopback; its
// handler authorizes a request that carries "Authorization: yes".
func serve(t *testing.T, lim Limits) string {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := Listen(inner, lim)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "yes" {
			Authorized(w, r)
		}
		io.WriteString(w, "ok\n")
	})}
	go ln.Serve(srv)
	t.Cleanup(func() { srv.Close() })
	return inner.Addr().String()
}

// get sends one request on c and reads the answer.
func get(t *testing.T, c net.Conn, br *bufio.Reader, auth string) *http.Response {
	t.Helper()
	return do(t, c, br, "GET /", auth)
}

// do sends one request ("METHOD TARGET") on c and reads the answer.
func do(t *testing.T, c net.Conn, br *bufio.Reader, line, auth string) *http.Response {
	t.Helper()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "%s HTTP/1.1\r\nHost: x\r\nAuthorization: %s\r\n\r\n", line, auth)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Header.Set("X-Body", string(b))
	return resp
}

// TestPerAddr: an address holding its cap of guests is refused the next
// with a 503 that says why and what to do; once one of its guests
// shows the credential, it counts no more, and another is admitted.
func TestPerAddr(t *testing.T) {
	addr := serve(t, Limits{Max: 16, PerAddr: 2})
	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, bufio.NewReader(c)
	}
	c1, b1 := dial()
	get(t, c1, b1, "no")
	c2, b2 := dial()
	get(t, c2, b2, "no")
	c3, b3 := dial()
	resp := get(t, c3, b3, "no")
	if body := resp.Header.Get("X-Body"); resp.StatusCode != http.StatusServiceUnavailable ||
		!strings.Contains(body, "already holds 2 connections") || !strings.Contains(body, "send the token") {
		t.Fatalf("the third guest from one address: %d %q, want 503 naming the cap", resp.StatusCode, body)
	}
	if resp := get(t, c1, b1, "yes"); resp.StatusCode != http.StatusOK {
		t.Fatalf("an authorized request on a guest: %d", resp.StatusCode)
	}
	c4, b4 := dial()
	if resp := get(t, c4, b4, "no"); resp.StatusCode != http.StatusOK {
		t.Errorf("a guest after another showed the credential: %d, want 200", resp.StatusCode)
	}
}

// TestReserve: with every slot but the reserve taken by guests, a guest
// in the reserve gets one answer and its connection is closed ("OPTIONS
// *", which the server would answer itself, included), while a
// connection there that shows the credential is kept.
func TestReserve(t *testing.T) {
	addr := serve(t, Limits{Max: 3, Reserved: 1})
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		get(t, c, bufio.NewReader(c), "no")
	}
	t.Cleanup(func() {
		for _, c := range held {
			c.Close()
		}
	})
	for _, tt := range []struct {
		line, auth string
		wantClose  bool
	}{{"GET /", "no", true}, {"OPTIONS *", "no", true}, {"GET /", "yes", false}} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		resp := do(t, c, bufio.NewReader(c), tt.line, tt.auth)
		if resp.StatusCode != http.StatusOK || resp.Close != tt.wantClose {
			t.Errorf("%s, Authorization %s, in the reserve: %d, close %v; want 200, close %v",
				tt.line, tt.auth, resp.StatusCode, resp.Close, tt.wantClose)
		}
		c.Close()
	}
}
