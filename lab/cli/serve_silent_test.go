package cli_test

import (
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/oncehq/once/lab/cli"
)

// TestServeSilentGuestsLeaveRoomForToken: the reserve is for requests
// with the token, but a connection that sends nothing is a guest the
// listener admits into it, and holds its slot until the header timeout.
// Guests fill the 224 slots they may (kept busy, as in
// TestServeFloodLeavesRoomForToken); then 200 addresses each keep one
// connection open that sends nothing, dialling again as soon as it is
// closed. A request with the token must still be answered before its
// client gives up after 10 s.
func TestServeSilentGuestsLeaveRoomForToken(t *testing.T) {
	const token = "t0ken-for-the-silent"
	base, addr, _ := servingWithToken(t, token)

	conns := flood(t, addr, 20, 24)
	held := 0
	for _, fc := range conns {
		if fc.held {
			held++
		}
	}
	if held < cli.ServeGuestSlots() {
		// Every slot a guest may take is taken: the silent
		// connections meet a full server.
		t.Fatalf("the flood holds %d connections, fewer than the %d guests may hold", held, cli.ServeGuestSlots())
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() { close(stop); wg.Wait() }()
	for a := range 200 {
		from := fmt.Sprintf("127.0.%d.%d", 5+a/250, 2+a%250)
		wg.Go(func() {
			d := dialerFrom(from, 30*time.Second)
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := d.Dial("tcp", addr)
				if err != nil {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				done := make(chan struct{})
				go func() { io.Copy(io.Discard, c); close(done) }()
				select {
				case <-stop:
					c.Close()
					<-done
					return
				case <-done:
					c.Close()
				}
			}
		})
	}
	time.Sleep(time.Second) // the silent connections in the reserve and the backlog

	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}
	code, err := statsWithToken(client, base, token)
	if err != nil {
		t.Fatalf("GET /api/stats with the token, while 200 addresses hold silent connections: %v", err)
	}
	if code != http.StatusOK {
		t.Errorf("GET /api/stats with the token: %d, want 200", code)
	}
}
