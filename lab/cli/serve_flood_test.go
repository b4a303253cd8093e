package cli_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncehq/once/lab/cli"
)

// floodConn is one connection of a flood: what the console answered to
// its /healthz, and whether the console kept it open afterwards.
type floodConn struct {
	from string
	conn net.Conn
	held bool // answered and kept alive
}

// flood opens perAddr keep-alive connections to addr from each of the
// loopback addresses 127.0.0.2 … 127.0.0.(1+addrs), sends one
// unauthenticated GET /healthz on each and reads its answer. A
// connection kept open goes on asking (keepBusy) until the test ends.
// flood returns once every connection was answered, refused, or waited
// 30 s.
func flood(t *testing.T, addr string, addrs, perAddr int) []*floodConn {
	t.Helper()
	var (
		mu    sync.Mutex
		conns []*floodConn
		wg    sync.WaitGroup
		busy  sync.WaitGroup
		stop  = make(chan struct{})
	)
	for a := range addrs {
		from := fmt.Sprintf("127.0.0.%d", 2+a)
		for range perAddr {
			wg.Go(func() {
				d := dialerFrom(from, 30*time.Second)
				c, err := d.Dial("tcp", addr)
				if err != nil {
					return // not let in by the kernel: it holds nothing
				}
				fc := &floodConn{from: from, conn: c}
				mu.Lock()
				conns = append(conns, fc)
				mu.Unlock()
				c.SetDeadline(time.Now().Add(30 * time.Second))
				fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
				br := bufio.NewReader(c)
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					return // refused, reset, or still waiting to be accepted
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				// A 503 from /healthz (the store slow under the flood)
				// holds its connection as well as a 200.
				if !resp.Close {
					fc.held = true
					busy.Go(func() { keepBusy(c, br, stop) })
					return
				}
				// The console answered and said it closes: wait for the
				// close, so the slot is free before the test goes on.
				io.Copy(io.Discard, br)
			})
		}
	}
	wg.Wait()
	t.Cleanup(func() {
		close(stop)
		for _, fc := range conns {
			fc.conn.Close()
		}
		busy.Wait()
	})
	return conns
}

// keepBusy makes a request every 2 s on c until stop, so that c is
// never idle for long. It asks /healthz for a host the console does not
// answer: a 421 that keeps the connection open and costs the store
// nothing, so that the test measures the connection limits, not how fast
// the store answers 100 probes a second.
func keepBusy(c net.Conn, br *bufio.Reader, stop <-chan struct{}) {
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: elsewhere.example\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// TestServeFloodLeavesRoomForToken: twenty addresses open 24 keep-alive
// connections each to `once serve`, with its own limits, and make one
// unauthenticated /healthz on each, and a request every 2 s on each
// connection kept open: 480 connections, more than the server's
// cap, none of them idle. A request with the token must still be answered before
// its client gives up after 10 s, while the flood's connections are open;
// and no flood address is left holding more connections than the
// per-address cap. Before the console bounded unauthenticated
// connections, the first 256 filled every slot and the request waited
// for the 2-minute idle timeout.
func TestServeFloodLeavesRoomForToken(t *testing.T) {
	const token = "t0ken-for-the-flood"
	base, addr, _ := servingWithToken(t, token)

	conns := flood(t, addr, 20, 24)
	held, total := map[string]int{}, 0
	for _, fc := range conns {
		if fc.held {
			held[fc.from]++
			total++
		}
	}
	// The flood must be real: every slot a guest may take is taken.
	if total < cli.ServeGuestSlots() {
		t.Fatalf("the flood holds %d connections, fewer than the %d guests may hold; "+
			"can this machine dial from 127.0.0.2–127.0.0.21?", total, cli.ServeGuestSlots())
	}

	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}
	code, err := statsWithToken(client, base, token)
	if err != nil {
		t.Fatalf("GET /api/stats with the token, while %d flood connections are open: %v", len(conns), err)
	}
	if code != http.StatusOK {
		t.Errorf("GET /api/stats with the token during the flood: %d, want 200", code)
	}
	for from, n := range held {
		if n > cli.ServeGuestsPerAddr() {
			t.Errorf("%s holds %d connections without the token; the cap is %d", from, n, cli.ServeGuestsPerAddr())
		}
	}
}

// servingWithToken runs once serve on loopback over a fresh SQLite file,
// guarded by token, with no reaper; it returns the console's base URL,
// its host:port, and its stderr.
func servingWithToken(t *testing.T, token string) (base, addr string, stderr *syncBuffer) {
	t.Helper()
	db := filepath.Join(t.TempDir(), "once.db")
	mustRun(t, "migrate", "--db", db)
	base, _, stderr, _ = startServe(t, "--addr", "127.0.0.1:0", "--reap-every", "0", "--token", token, "--db", db)
	return base, strings.TrimSuffix(strings.TrimPrefix(base, "http://"), "/"), stderr
}

// dialerFrom dials from the loopback address from (127.0.0.0/8 is all
// local), so that a test can be many clients; it gives up after timeout.
func dialerFrom(from string, timeout time.Duration) *net.Dialer {
	return &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: timeout}
}

// statsWithToken asks c for the console's api/stats with token as the
// bearer, and returns the status it was answered.
func statsWithToken(c *http.Client, base, token string) (int, error) {
	req, err := http.NewRequest(http.MethodGet, base+"api/stats", nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}
