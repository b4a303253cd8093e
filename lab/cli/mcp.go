package cli

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/oncehq/once"
	"github.com/oncehq/once/mcpgate"
)

func defineMCP(fs *flagSet) func(env, []string) error {
	db := fs.db()
	policy := fs.String("policy", "", "the tool-policy `FILE` (JSON): the upstream's name, each tool's key arguments, recovery, verifier and approval (mcpgate/README.md)")
	upURL := fs.String("upstream", "", "front the MCP server at this Streamable HTTP `URL`, instead of a command after --")
	httpAddr := fs.String("http", "", "serve MCP over Streamable HTTP on `HOST:PORT` instead of stdio")
	token := fs.String("token", "", "with --http, the bearer `TOKEN` every request must carry; required when --http is not loopback (default $ONCE_TOKEN)")
	var allow hostList
	fs.Var(&allow, "allow-host", "with --http, also answer requests for the host `NAME`; repeatable")
	run := fs.String("run", "", "the `RUN` of a call whose caller names none in _meta or the Once-Run header (before the policy's scope)")
	consoleURL := fs.String("console", "", "the console's `URL` (once serve), given to the model with an action a person must approve or resolve")
	reapEvery := fs.Duration("reap-every", 30*time.Second, "recover the calls of a gateway that died every `INTERVAL`; zero turns the reaper off")
	progressEvery := fs.Duration("progress-every", 5*time.Second, "tell a caller that sent a progress token, every `INTERVAL`, that its call is still running or waiting, so its request timeout does not fire")
	drain := fs.Duration("drain", 5*time.Minute, "once the host leaves, wait up to `DURATION` for calls still running, so their outcomes are recorded")
	fs.require("policy")
	return func(e env, cmd []string) error {
		if (*upURL == "") == (len(cmd) == 0) {
			return usagef("give the upstream: a command after -- (once mcp --policy tools.json -- my-mcp-server --stdio) or --upstream URL, not both")
		}
		if *token == "" {
			*token = os.Getenv("ONCE_TOKEN")
		}
		if *httpAddr != "" {
			host, _, err := net.SplitHostPort(*httpAddr)
			if err != nil {
				return usagef("--http %q is not host:port (%v)", *httpAddr, err)
			}
			if !loopback(host) && len(*token) < minToken {
				return usagef("--http %s is reachable from other machines; set --token (or ONCE_TOKEN) of at least %d characters, or bind 127.0.0.1", *httpAddr, minToken)
			}
		} else if *token != "" && os.Getenv("ONCE_TOKEN") == "" {
			return usagef("--token is for --http; over stdio the host that starts once mcp is the only client")
		}
		if *progressEvery < 100*time.Millisecond {
			return usagef("--progress-every must be 100ms or more")
		}
		if *reapEvery < 0 || *reapEvery > 0 && *reapEvery < minReapEvery {
			return usagef("--reap-every must be 0 (off) or 1s or more")
		}
		f, err := os.Open(*policy)
		if err != nil {
			return err
		}
		pf, err := mcpgate.ParsePolicy(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", *policy, err)
		}
		// Over stdio, stdout is the protocol's: every line the command
		// writes goes to stderr.
		log := slog.New(slog.NewTextHandler(e.stderr, nil))
		d, err := open(e.ctx, dbURL(*db), once.Config{Logger: log})
		if err != nil {
			return err
		}
		defer d.Close()
		dial := func(context.Context) (mcp.Transport, error) {
			if *upURL != "" {
				return &mcp.StreamableClientTransport{Endpoint: *upURL}, nil
			}
			c := exec.Command(cmd[0], cmd[1:]...)
			c.Stderr = e.stderr
			diesWithGateway(c)
			return &mcp.CommandTransport{Command: c, TerminateDuration: 5 * time.Second}, nil
		}
		ctx, cancel := context.WithTimeout(e.ctx, openTimeout)
		gw, err := mcpgate.New(ctx, mcpgate.Options{
			Store: d.store, Policy: pf, Upstream: dial, Run: *run, ConsoleURL: *consoleURL,
			Logger: log, Progress: *progressEvery,
		})
		cancel()
		if err != nil {
			return err
		}
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), *drain)
			defer cancel()
			if err := gw.Close(ctx); err != nil {
				log.Warn("once mcp", "err", err)
			}
		}()
		if *reapEvery > 0 {
			r, err := once.NewReaper(gw.Client(), once.ReaperConfig{Interval: *reapEvery, Logger: log})
			if err != nil {
				return err
			}
			if err := r.Start(e.ctx); err != nil {
				return err
			}
			defer r.Stop()
		}
		if *httpAddr == "" {
			log.Info("once mcp: serving over stdio", "db", d.name, "server", pf.Server)
			err := gw.Server().Run(e.ctx, &mcp.StdioTransport{})
			if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, mcp.ErrConnectionClosed) && !strings.Contains(err.Error(), "EOF") {
				return err
			}
			return nil
		}
		return serveMCP(e, gw, *httpAddr, *token, allow, log)
	}
}

// serveMCP serves the gateway over Streamable HTTP: the SDK's DNS
// rebinding and cross-origin protection, a bearer token off loopback,
// and the hosts once serve answers.
func serveMCP(e env, gw *mcpgate.Gateway, addr, token string, allow []string, log *slog.Logger) error {
	host, _, _ := net.SplitHostPort(addr)
	// Stateless: the SDK serves protocol 2026-07-28 over HTTP only
	// without sessions, and 2025-11-25 either way. Nothing the gateway
	// keeps is per session; what it must not lose is in the store.
	hosts := allowedHosts(host, allow)
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return gw.Server() }, &mcp.StreamableHTTPOptions{
		Logger:    log,
		Stateless: true,
		// With a list of hosts the guard below answers a name not on it
		// 421, which is the SDK's DNS-rebinding protection and more: the
		// SDK's own would refuse every --allow-host name reaching a
		// loopback address (a proxy on this machine), and LOCALHOST.
		// Without a list (a wildcard bind, a token required) the SDK's
		// stays.
		DisableLocalhostProtection: len(hosts) > 0,
		// The guard's limit, not the SDK's smaller default under it.
		MaxRequestBodyBytes: maxMCPBody,
	})
	// A page in a browser must not call tools on the agent's behalf.
	cross := http.NewCrossOriginProtection().Handler(h)
	guard := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(hosts) > 0 && !hostAllowed(r.Host, hosts) {
			http.Error(w, "once mcp: this host name is not served; start once mcp with --allow-host "+hostOnly(r.Host), http.StatusMisdirectedRequest)
			return
		}
		if token != "" {
			// The scheme is case-insensitive (RFC 9110 §11.1).
			scheme, got, ok := strings.Cut(r.Header.Get("Authorization"), " ")
			if !ok || !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
				w.Header().Set("WWW-Authenticate", `Bearer realm="once mcp"`)
				http.Error(w, "once mcp: send Authorization: Bearer TOKEN, the token once mcp was started with", http.StatusUnauthorized)
				return
			}
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxMCPBody)
		cross.ServeHTTP(w, r)
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("cannot listen on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: guard, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
	fmt.Fprintf(e.stderr, "once mcp on http://%s/ ; Ctrl-C stops\n", ln.Addr())
	return serveUntil(e.ctx, srv, func() error { return srv.Serve(ln) })
}

// maxMCPBody bounds a request's body once mcp --http reads.
const maxMCPBody = 8 << 20

func hostOnly(h string) string {
	if host, _, err := net.SplitHostPort(h); err == nil {
		return host
	}
	return h
}

func hostAllowed(h string, hosts []string) bool {
	name := strings.ToLower(hostOnly(h))
	for _, a := range hosts {
		if strings.EqualFold(a, name) {
			return true
		}
	}
	return false
}
