// Command counter is the MCP server of package counter, for tests of
// once mcp. It serves over stdio by default, or Streamable HTTP with
// --http; either way each effect is a synced line in --effects.
//
// Usage:
//
//	counter --effects FILE [--stdio | --http 127.0.0.1:0 [--stateful]]
//
// With --http it prints the endpoint's URL as its first line of stdout,
// so a test may ask for port 0 and learn the port.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/oncehq/once/mcpgate/internal/counter"
)

func main() {
	effects := flag.String("effects", "", "file the effects are appended to (required)")
	_ = flag.Bool("stdio", true, "serve over stdin and stdout (the default)")
	addr := flag.String("http", "", "serve Streamable HTTP on this loopback address instead of stdio")
	stateful := flag.Bool("stateful", false, "with --http, keep sessions (Mcp-Session-Id); such a server cannot speak 2026-07-28")
	stubborn := flag.Bool("stubborn", false, "ignore cancellation, and over stdio finish the calls under way after stdin closes, as many servers do")
	flag.Parse()
	log.SetPrefix("counter: ")
	log.SetFlags(0)
	if *effects == "" {
		log.Fatal("--effects is required")
	}
	srv, wait := counter.New(*effects), func() {}
	if *stubborn {
		srv, wait = counter.NewStubborn(*effects)
	}
	if *addr == "" {
		if err := srv.Run(context.Background(), &mcp.StdioTransport{}); err != nil && !errors.Is(err, context.Canceled) {
			log.Fatal(err)
		}
		wait()
		return
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	if ip := ln.Addr().(*net.TCPAddr).IP; !ip.IsLoopback() {
		log.Fatalf("refusing non-loopback address %s", ln.Addr())
	}
	// Stateless by default: the Go SDK serves 2026-07-28 over HTTP only
	// without sessions, and still serves older clients that way.
	// PropagateRequestCancellation lets a dropped POST cancel its call,
	// as it does on a real server; it applies to 2026-07-28 only.
	opts := &mcp.StreamableHTTPOptions{Stateless: !*stateful, PropagateRequestCancellation: true}
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, opts)
	mux := http.NewServeMux()
	mux.Handle("/mcp", h)
	fmt.Printf("http://%s/mcp\n", ln.Addr())
	log.Fatal(http.Serve(ln, mux))
}
