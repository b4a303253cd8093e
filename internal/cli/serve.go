package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/console"
	"github.com/oncehq/once/metrics"
)

func runServe(e env, args []string) error {
	fs, db := flags(e, "serve")
	addr := fs.String("addr", "127.0.0.1:7070", "address to listen on")
	token := fs.String("token", os.Getenv("ONCE_TOKEN"), "access token, required when --addr is not loopback (default $ONCE_TOKEN)")
	reapEvery := fs.Duration("reap-every", 30*time.Second, "reaper interval; zero turns the reaper off")
	if _, err := e.parse(fs, args); err != nil {
		return err
	}
	host, _, err := net.SplitHostPort(*addr)
	if err != nil {
		return usagef("--addr %q is not host:port (%v)", *addr, err)
	}
	if !loopback(host) && *token == "" {
		return usagef("--addr %s is reachable from other machines; set --token (or ONCE_TOKEN) so requests must carry it, or bind 127.0.0.1", *addr)
	}
	if *reapEvery < 0 {
		return usagef("--reap-every must not be negative")
	}
	o, err := openStore(e.ctx, dbURL(*db), false)
	if err != nil {
		return err
	}
	defer o.Close()

	log := slog.New(slog.NewTextHandler(e.stderr, nil))
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m, err := metrics.New(reg, o.Store)
	if err != nil {
		return err
	}
	c, err := once.New(once.Config{Store: o.Store, Logger: log, Hooks: m.Hooks()})
	if err != nil {
		return err
	}

	var last struct {
		sync.Mutex
		rep once.ReapReport
	}
	var reaper *once.Reaper
	if *reapEvery > 0 {
		reaper, err = once.NewReaper(c, once.ReaperConfig{Interval: *reapEvery, Logger: log})
		if err != nil {
			return err
		}
	}
	h, err := console.New(console.Config{Client: c, Registry: reg, Token: *token, Logger: log, Reaper: func() once.ReapReport {
		last.Lock()
		defer last.Unlock()
		return last.rep
	}})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("cannot listen on %s: %w", *addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	if reaper != nil {
		go func() {
			t := time.NewTicker(*reapEvery)
			defer t.Stop()
			for {
				rep, err := reaper.RunOnce(e.ctx)
				if err != nil && e.ctx.Err() == nil {
					log.Warn("reaper pass failed", "err", err)
				}
				last.Lock()
				last.rep = rep
				last.Unlock()
				select {
				case <-e.ctx.Done():
					return
				case <-t.C:
				}
			}
		}()
	}
	url := "http://" + ln.Addr().String() + "/"
	fmt.Fprintf(e.stdout, "once console on %s (%s); Ctrl-C stops\n", url, o.Name)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-e.ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
