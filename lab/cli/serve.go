package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/oncehq/once"
	"github.com/oncehq/once/console"
	"github.com/oncehq/once/internal/connlimit"
	"github.com/oncehq/once/metrics"
	"github.com/oncehq/once/protocol"
)

// protocolTokens are the bearer tokens of the protocol's two scopes.
type protocolTokens struct {
	workers, operators []string
	kinds              servedKinds
}

// servedKinds are the policies of a kinds file (--kinds), and the
// bridge to client verifiers when a kind names one.
type servedKinds struct {
	def       once.KindPolicy
	kinds     map[string]once.KindPolicy
	verifiers *protocol.Verifiers
}

// readKinds reads and checks the kinds file, before anything opens.
// served says the protocol is served, which a client verifier needs.
func readKinds(file string, served bool) (servedKinds, error) {
	if file == "" {
		return servedKinds{}, nil
	}
	f, err := os.Open(file)
	if err != nil {
		return servedKinds{}, usagef("--kinds: %v", err)
	}
	defer f.Close()
	v := protocol.NewVerifiers()
	def, kinds, err := protocol.ParseKinds(f, v)
	if err != nil {
		return servedKinds{}, usagef("--kinds %s: %v", file, err)
	}
	out := servedKinds{def: def, kinds: kinds}
	for _, p := range kinds {
		if p.Verifier != nil {
			if !served {
				return servedKinds{}, usagef("--kinds %s names a client verifier, which takes its questions over the protocol: give --worker-tokens-file too", file)
			}
			out.verifiers = v
		}
	}
	return out, nil
}

// readTokens reads the tokens of file, one a line; blank lines and
// lines starting with # are skipped. No file, no tokens.
func readTokens(e env, flag, file string) ([]string, error) {
	if file == "" {
		return nil, nil
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, usagef("--%s: %v", flag, err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Mode().Perm()&0o077 != 0 {
		fmt.Fprintf(e.stderr, "once serve: warning: %s may be read by other users (mode %v); chmod 600 it\n", file, fi.Mode().Perm())
	}
	b, err := io.ReadAll(io.LimitReader(f, 1<<20+1))
	if err != nil {
		return nil, usagef("--%s: %v", flag, err)
	}
	if len(b) > 1<<20 {
		return nil, usagef("--%s: %s is over 1 MiB; it holds tokens, one a line", flag, file)
	}
	var tokens []string
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if len(line) < minToken || strings.ContainsFunc(line, func(r rune) bool { return r <= ' ' || r > '~' }) {
			return nil, usagef("--%s: line %d of %s is %d bytes or not printable ASCII; a token is %d or more printable characters (openssl rand -hex 32 makes one)", flag, i+1, file, len(line), minToken)
		}
		tokens = append(tokens, line)
	}
	if len(tokens) == 0 {
		return nil, usagef("--%s: %s holds no token", flag, file)
	}
	return tokens, nil
}

func defineServe(fs *flagSet) func(env, []string) error {
	db := fs.db()
	addr := fs.String("addr", "127.0.0.1:7070", "the `HOST:PORT` to listen on")
	token := fs.String("token", "", "the access `TOKEN` every request but /healthz must carry; required when --addr is not loopback (default $ONCE_TOKEN)")
	reapEvery := fs.Duration("reap-every", 30*time.Second, "run a reaper pass every `INTERVAL`; zero turns the reaper off")
	var allow hostList
	fs.Var(&allow, "allow-host", "also answer requests for the host `NAME` (the name a browser or proxy uses for the console); repeatable. Other names get 421, except that --addr 0.0.0.0 with a token and no --allow-host answers any name")
	hookURL := fs.String("approval-webhook", "", "POST each action that starts to wait for approval to this `URL`, signed with the secret of $ONCE_WEBHOOK_SECRET or --approval-webhook-secret-file (docs/webhook.md)")
	secretFile := fs.String("approval-webhook-secret-file", "", "read the webhook's signing secret from `FILE`, not from $ONCE_WEBHOOK_SECRET; a secret is never a flag's value, which the process list shows")
	publicURL := fs.String("public-url", "", "the console's `URL` as people open it, such as https://ops.example.com, for the links the webhook sends (default http://ADDR when --addr names one host)")
	workerTokens := fs.String("worker-tokens-file", "", "serve the protocol (/v1, docs/protocol.md) to workers whose bearer token is a line of `FILE`")
	operatorTokens := fs.String("operator-tokens-file", "", "serve the protocol's operator routes (approve, reject) to bearer tokens that are lines of `FILE`")
	kindsFile := fs.String("kinds", "", "pin the kinds' policies (lease, recovery, approval, client verifiers) from the JSON `FILE` (docs/protocol.md#policies)")
	return func(e env, _ []string) error {
		if *token == "" {
			// Read here, not as the flag's default, so -h never prints it.
			*token = os.Getenv("ONCE_TOKEN")
		}
		hook, err := hookFlags(e, *hookURL, *secretFile, *publicURL)
		if err != nil {
			return err
		}
		var proto protocolTokens
		if proto.workers, err = readTokens(e, "worker-tokens-file", *workerTokens); err != nil {
			return err
		}
		if proto.operators, err = readTokens(e, "operator-tokens-file", *operatorTokens); err != nil {
			return err
		}
		if proto.kinds, err = readKinds(*kindsFile, len(proto.workers)+len(proto.operators) > 0); err != nil {
			return err
		}
		return serve(e, dbURL(*db), *addr, *token, allow, *reapEvery, hook, proto)
	}
}

// hookFlags checks the webhook's flags and reads its secret, before
// anything is opened.
func hookFlags(e env, hookURL, secretFile, publicURL string) (hookConfig, error) {
	if hookURL == "" {
		switch {
		case secretFile != "":
			return hookConfig{}, usagef("--approval-webhook-secret-file signs the webhook's requests; give --approval-webhook URL too")
		case publicURL != "":
			return hookConfig{}, usagef("--public-url is for the links the webhook sends; give --approval-webhook URL too")
		}
		return hookConfig{}, nil
	}
	u, err := parseHookURL("approval-webhook", hookURL, false)
	if err != nil {
		return hookConfig{}, err
	}
	if publicURL != "" {
		if _, err := parseHookURL("public-url", publicURL, true); err != nil {
			return hookConfig{}, err
		}
	}
	secret, err := readSecret(secretFile, func(warning string) { fmt.Fprintln(e.stderr, "once serve: warning: "+warning) })
	if err != nil {
		return hookConfig{}, err
	}
	if u.Scheme == "http" && !loopback(u.Hostname()) {
		// Signed, so it cannot be forged; but its payload preview is
		// readable on the way.
		fmt.Fprintln(e.stderr, "once serve: warning: --approval-webhook is plain http off this machine: anyone on the path reads what awaits approval; use https")
	}
	return hookConfig{url: hookURL, secret: secret, console: publicURL}, nil
}

// hostList is a repeatable flag's values.
type hostList []string

func (l *hostList) String() string { return strings.Join(*l, ",") }

func (l *hostList) Set(v string) error {
	v = strings.ToLower(strings.Trim(strings.TrimSpace(v), "[]"))
	if v == "" || strings.ContainsAny(v, "/ ") || net.ParseIP(v) == nil && strings.Contains(v, ":") {
		return fmt.Errorf("%q is not a host name; give a name or address without scheme or port, such as console.example.com", v)
	}
	*l = append(*l, v)
	return nil
}

// loopbackNames are the names a browser on this machine uses for a
// console bound to loopback.
var loopbackNames = []string{"127.0.0.1", "::1", "localhost"}

// allowedHosts is the console's Config.AllowedHosts for a server bound to
// host: the names a browser may use to reach it, so that a web page whose
// DNS name an attacker rebinds to this machine is answered 421, token or
// not.
//
// Bound to loopback, they are the loopback names; bound to one address or
// name, that one; bound to every interface (0.0.0.0, ::, or no host),
// the loopback names and whatever --allow-host adds. A wildcard bind
// without --allow-host returns nil, which answers any name: serve allows
// that only with a token, which a rebound page lacks (the browser keeps
// the token's cookie for the name it was set on, and the page cannot
// read it), so every request it makes gets 401.
func allowedHosts(host string, extra []string) []string {
	var hosts []string
	switch ip := net.ParseIP(host); {
	case host == "" || ip != nil && ip.IsUnspecified():
		if len(extra) == 0 {
			return nil
		}
		hosts = slices.Clone(loopbackNames)
	case loopback(host):
		hosts = slices.Clone(loopbackNames)
	}
	for _, h := range append([]string{strings.ToLower(host)}, extra...) {
		if ip := net.ParseIP(h); h == "" || ip != nil && ip.IsUnspecified() || slices.Contains(hosts, h) {
			continue
		}
		hosts = append(hosts, h)
	}
	return hosts
}

// serve runs the console package as an application would: the process's
// client (with the metrics' hooks), the library's reaper reporting each
// pass to the console, and the console at the root of its own server.
// minToken is the shortest token once serve takes off loopback.
const minToken = 16

func serve(e env, url, addr, token string, allow []string, reapEvery time.Duration, hook hookConfig, proto protocolTokens) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return usagef("--addr %q is not host:port (%v)", addr, err)
	}
	if !loopback(host) && token == "" {
		return usagef("--addr %s is reachable from other machines; set --token (or ONCE_TOKEN) so requests must carry it, or bind 127.0.0.1", addr)
	}
	if !loopback(host) && len(token) < minToken {
		// Ten guesses a minute per address find a short token in days.
		return usagef("--token is %d characters; off loopback it must be at least %d (openssl rand -hex 32 makes one)", len(token), minToken)
	}
	if reapEvery < 0 {
		return usagef("--reap-every must not be negative")
	}
	if reapEvery > 0 && reapEvery < minReapEvery {
		return usagef("--reap-every %v is under a second: each pass reads the store; give 1s or more, or 0 to turn the reaper off", reapEvery)
	}
	log := slog.New(slog.NewTextHandler(e.stderr, nil))
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// The client takes the metrics' hooks, so the gauges get the client
	// after it is made.
	m, err := metrics.New(reg, nil)
	if err != nil {
		return err
	}
	d, err := open(e.ctx, url, once.Config{Logger: log, Hooks: m.Hooks(), Default: proto.kinds.def, Kinds: proto.kinds.kinds})
	if err != nil {
		return err
	}
	defer d.Close()
	m.SetStats(d.client)

	var reaper *once.Reaper
	var status *console.ReaperStatus
	if reapEvery > 0 {
		status = new(console.ReaperStatus)
		reaper, err = once.NewReaper(d.client, once.ReaperConfig{Interval: reapEvery, Logger: log, OnPass: func(rep once.ReapReport, err error) {
			status.OnPass(rep, err)
			m.ObservePass(rep, err)
		}})
		if err != nil {
			return err
		}
	}
	h, err := console.New(console.Config{Client: d.client, Registry: reg, Token: token, Logger: log, Reaper: status, AllowedHosts: allowedHosts(host, allow)})
	if err != nil {
		return err
	}
	if len(proto.workers)+len(proto.operators) > 0 {
		// A claim's wait and a verifier's take end within the server's
		// write timeout, with room for the answer.
		p, err := protocol.New(protocol.Config{Client: d.client, Workers: proto.workers, Operators: proto.operators, Logger: log,
			Verifiers: proto.kinds.verifiers, MaxWait: limits.write - 10*time.Second})
		if err != nil {
			return err
		}
		// The protocol has tokens of its own, sent as bearer tokens a
		// page cannot attach; the console has the rest.
		mux := http.NewServeMux()
		mux.Handle("/v1/", p)
		mux.Handle("/", h)
		h = mux
		log.Info("once serve: the protocol on /v1", "workers", len(proto.workers), "operators", len(proto.operators))
	}
	inner, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("cannot listen on %s: %w", addr, err)
	}
	srv, ln := newServer(h, inner, limits)
	if reaper != nil {
		if err := reaper.Start(e.ctx); err != nil {
			ln.Close()
			return err
		}
		defer reaper.Stop()
	}
	if hook.url != "" {
		if hook.console == "" && !unspecified(host) {
			hook.console = "http://" + ln.Addr().String()
		}
		if hook.console == "" {
			log.Warn("once serve: the approval webhook sends no links to the console: --addr names every interface; set --public-url")
		}
		// Its own goroutine and context: it ends with the command, and
		// is waited for, so no request or retry outlives serve.
		hctx, stopHook := context.WithCancel(e.ctx)
		ah := newApprovalHook(d.client, hook, log)
		hookDone := make(chan struct{})
		go func() { defer close(hookDone); ah.run(hctx) }()
		defer func() { stopHook(); <-hookDone }()
		log.Info("once serve: approval webhook on", "receiver", ah.receiver(), "every", ah.timing.poll)
	}
	fmt.Fprintf(e.stdout, "once console on http://%s/ (%s); Ctrl-C stops\n", ln.Addr(), d.name)
	return serveUntil(e.ctx, srv, func() error { return ln.Serve(srv) })
}

// serveUntil runs serve until it fails or ctx ends, then shuts srv
// down, giving requests in progress five seconds to finish.
func serveUntil(ctx context.Context, srv *http.Server, serve func() error) error {
	errc := make(chan error, 1)
	go func() { errc <- serve() }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// unspecified reports whether host binds every interface.
func unspecified(host string) bool {
	ip := net.ParseIP(host)
	return host == "" || ip != nil && ip.IsUnspecified()
}

func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// serveLimits bound what a client can hold of the console's server: a
// connection that sends nothing, sends slowly, reads slowly or sits idle
// after a request is closed, and the listener (see connlimit) caps the
// connections open at once, those one address holds without the token,
// and keeps a reserve of the cap for connections that show it.
type serveLimits struct {
	readHeader, read, write, idle time.Duration
	conns                         connlimit.Limits
}

// limits are the server's. A console page is a few queries and a few
// hundred kilobytes at most, and a resolution's body is capped at 4 MiB,
// so half a minute to read one and a minute to write one are generous;
// an operator's browser reopens an idle connection it lost without
// notice. A connection without the token (a /healthz probe, a 401) has
// no reason to stay: it is closed after 5 s idle. Sixteen connections
// per address is more than a browser opens to one host (six); behind a
// proxy, connections count against the proxy's address only until they
// show the token.
var limits = serveLimits{
	readHeader: 5 * time.Second,
	read:       30 * time.Second,
	write:      time.Minute,
	idle:       2 * time.Minute,
	conns:      connlimit.Limits{Max: 256, Reserved: 32, PerAddr: 16, GuestIdle: 5 * time.Second},
}

// newServer makes the console's server and the listener it serves.
func newServer(h http.Handler, ln net.Listener, l serveLimits) (*http.Server, *connlimit.Listener) {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.readHeader,
		// A console request carries a cookie and a token: 64 KiB is
		// plenty (TestServeRefusesHugeHeaders).
		MaxHeaderBytes: 64 << 10,
		ReadTimeout:    l.read,
		WriteTimeout:   l.write,
		IdleTimeout:    l.idle,
	}
	return srv, connlimit.Listen(ln, l.conns)
}
