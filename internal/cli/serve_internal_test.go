package cli

import (
	"net"
	"slices"
	"sync/atomic"
	"testing"
)

// TestAllowedHosts: the names `once serve` answers for each kind of
// bind address.
func TestAllowedHosts(t *testing.T) {
	loop := []string{"127.0.0.1", "::1", "localhost"}
	tests := []struct {
		host  string
		extra []string
		want  []string
	}{
		{"127.0.0.1", nil, loop},
		{"localhost", nil, loop},
		{"::1", []string{"console.test"}, append(slices.Clone(loop), "console.test")},
		{"127.0.0.2", nil, append(slices.Clone(loop), "127.0.0.2")},
		{"10.1.2.3", nil, []string{"10.1.2.3"}},
		{"Ops.Example", []string{"10.1.2.3"}, []string{"ops.example", "10.1.2.3"}},
		// Every interface: any name (the token guards it), unless names
		// are given; then those and loopback.
		{"0.0.0.0", nil, nil},
		{"", nil, nil},
		{"::", []string{"ops.example"}, append(slices.Clone(loop), "ops.example")},
	}
	for _, tt := range tests {
		if got := allowedHosts(tt.host, tt.extra); !slices.Equal(got, tt.want) {
			t.Errorf("allowedHosts(%q, %q) = %q, want %q", tt.host, tt.extra, got, tt.want)
		}
	}
	var l hostList
	for _, bad := range []string{"", "http://x", "x:80", "a b"} {
		if err := l.Set(bad); err == nil {
			t.Errorf("--allow-host %q accepted", bad)
		}
	}
	for _, good := range []string{"Console.Example", "[::1]", "10.0.0.1"} {
		if err := l.Set(good); err != nil {
			t.Errorf("--allow-host %q: %v", good, err)
		}
	}
	if want := []string{"console.example", "::1", "10.0.0.1"}; !slices.Equal(l, want) {
		t.Errorf("--allow-host values %q, want %q", l, want)
	}
}

// TestLimitListener: the listener never holds more than its cap of open
// connections; a closed one makes room for the next.
func TestLimitListener(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const limit, clients = 2, 6
	ln := limitListener(inner, limit)
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
