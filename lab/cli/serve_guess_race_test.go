package cli_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestConcurrentGuessesKeepTheBurst: one address has ten wrong tokens
// before it is limited, however it sends them. Sixteen connections (the
// per-address cap) each send a wrong token at the same moment, round
// after round, from a fresh address each round; at most ten of the
// sixteen may be checked (answered 401), the rest 429. When the bucket
// was read and spent in two steps, requests in flight together all
// passed the read before any spent, and an address guessed more than
// its burst, at every refill too.
func TestConcurrentGuessesKeepTheBurst(t *testing.T) {
	_, addr, _ := servingWithToken(t, "the-right-token")

	const perRound = 16
	worst := 0
	for round := range 200 {
		from := fmt.Sprintf("127.0.%d.%d", 3+round/250, 2+round%250)
		conns := make([]net.Conn, perRound)
		for i := range conns {
			d := dialerFrom(from, 10*time.Second)
			c, err := d.Dial("tcp", addr)
			if err != nil {
				t.Fatalf("dial from %s: %v", from, err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(20 * time.Second))
			// All but the last byte of the request, so that the sixteen
			// arrive together.
			fmt.Fprintf(c, "GET /api/stats HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer wrong-%d\r\n\r", addr, i)
			conns[i] = c
		}
		time.Sleep(50 * time.Millisecond) // every connection accepted and reading
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			checked int
		)
		start := make(chan struct{})
		for _, c := range conns {
			wg.Go(func() {
				<-start
				c.Write([]byte("\n"))
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					t.Errorf("from %s: %v", from, err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case http.StatusUnauthorized:
					mu.Lock()
					checked++
					mu.Unlock()
				case http.StatusTooManyRequests:
				default:
					t.Errorf("from %s: %d, want 401 or 429", from, resp.StatusCode)
				}
			})
		}
		close(start)
		wg.Wait()
		worst = max(worst, checked)
	}
	if worst > 10 {
		t.Fatalf("one address had %d of %d wrong tokens sent together checked (401); the burst is 10", worst, perRound)
	}
}
