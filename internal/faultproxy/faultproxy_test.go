package faultproxy_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncehq/once/internal/faultproxy"
	"github.com/oncehq/once/internal/testdb"
)

// proxied starts a proxy in front of the test database and returns a
// URL through it that sends every statement's text (so a marker is seen
// on every execution, not only the first).
func proxied(t *testing.T) (*faultproxy.Proxy, string) {
	t.Helper()
	cfg, err := pgx.ParseConfig(testdb.RequirePostgres(t))
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.Start(fmt.Sprintf("%s:%d", cfg.Host, cfg.Port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable&default_query_exec_mode=exec", cfg.User, p.Addr(), cfg.Database)
}

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// A cut loses the reply of a statement the server committed.
func TestCutAfterCommit(t *testing.T) {
	p, url := proxied(t)
	c := connect(t, url)
	direct := connect(t, testdb.PostgresURL())
	ctx := context.Background()
	table := pgx.Identifier{fmt.Sprintf("faultproxy_%d", time.Now().UnixNano())}.Sanitize()
	if _, err := direct.Exec(ctx, `CREATE TABLE `+table+` (v int)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { direct.Exec(context.Background(), `DROP TABLE `+table) })

	cut := p.CutAfter([]byte("/* mark */"), faultproxy.PostgresReady)
	_, err := c.Exec(ctx, `INSERT INTO `+table+` VALUES (1) /* mark */`)
	if err == nil {
		t.Fatal("the insert's reply arrived; want it lost")
	}
	select {
	case <-cut:
	case <-time.After(10 * time.Second):
		t.Fatal("the cut never happened")
	}
	var n int
	if err := direct.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil || n != 1 {
		t.Fatalf("rows committed = %d, %v; want the lost reply's insert committed", n, err)
	}
}

// A black hole makes a statement hang until its deadline, not fail.
func TestBlackout(t *testing.T) {
	p, url := proxied(t)
	c := connect(t, url)
	p.Blackout(true)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := c.QueryRow(ctx, `SELECT 1`).Scan(new(int))
	if err == nil || !errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		t.Fatalf("a query into a black hole = %v; want it to hang until its deadline", err)
	}
	p.Blackout(false)
	p.Reset()
	c2 := connect(t, url)
	if err := c2.QueryRow(context.Background(), `SELECT 1`).Scan(new(int)); err != nil {
		t.Fatalf("after the blackout: %v", err)
	}
}

// Refused connections fail at once; open ones go on.
func TestRefuse(t *testing.T) {
	p, url := proxied(t)
	open := connect(t, url)
	p.Refuse(true)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if c, err := pgx.Connect(ctx, url); err == nil {
		c.Close(ctx)
		t.Fatal("a new connection got through a refusing proxy")
	}
	if err := open.QueryRow(ctx, `SELECT 1`).Scan(new(int)); err != nil {
		t.Fatalf("an open connection stopped working: %v", err)
	}
}

// A cut armed while an earlier one waits for its reply is a cut of its
// own: each closes its own channel when its own reply is lost, where
// the earlier one closed the later one's (and the later one closed it
// again, a panic).
func TestCutArmedWhileAnotherWaits(t *testing.T) {
	p, url := proxied(t)
	slow, quick := connect(t, url), connect(t, url)
	first := p.CutAfter([]byte("/* first */"), faultproxy.PostgresReady)
	errs := make(chan error, 1)
	go func() {
		_, err := slow.Exec(context.Background(), `SELECT pg_sleep(0.5) /* first */`)
		errs <- err
	}()
	time.Sleep(100 * time.Millisecond) // the first is marked and sleeping
	second := p.CutAfter([]byte("/* second */"), faultproxy.PostgresReady)
	if _, err := quick.Exec(context.Background(), `SELECT 1 /* second */`); err == nil {
		t.Fatal("the second statement's reply arrived; want it lost")
	}
	select {
	case <-second:
	case <-time.After(5 * time.Second):
		t.Fatal("the second cut never reported")
	}
	select {
	case <-first:
		t.Fatal("the first cut reported before its reply came")
	default:
	}
	if err := <-errs; err == nil {
		t.Fatal("the first statement's reply arrived; want it lost")
	}
	select {
	case <-first:
	case <-time.After(5 * time.Second):
		t.Fatal("the first cut never reported")
	}
}

// A spared connection outlives Reset; the others are cut. Against a
// plain TCP server that answers each line with the line and keeps the
// connection open.
func TestSpareOutlivesReset(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go io.Copy(c, c)
		}
	}()
	p, err := faultproxy.Start(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.Spare(func(first []byte) bool { return bytes.HasPrefix(first, []byte("spare")) })
	dial := func(first string) net.Conn {
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		echo(t, c, first)
		return c
	}
	spared, cut := dial("spare me"), dial("not me")
	p.Reset()
	echo(t, spared, "still here")
	cut.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := cut.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("reading the connection Reset cut = %v; want it closed", err)
	}
}

// echo sends line and wants it back.
func echo(t *testing.T, c net.Conn, line string) {
	t.Helper()
	if _, err := io.WriteString(c, line); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got := make([]byte, len(line))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != line {
		t.Fatalf("echo of %q = %q, %v", line, got, err)
	}
}

// PostgresCancel knows a cancel request, and not a startup message.
func TestPostgresCancel(t *testing.T) {
	cancel := []byte{0, 0, 0, 16, 0x04, 0xd2, 0x16, 0x2e, 0, 0, 0, 1, 0, 0, 0, 2}
	startup := []byte{0, 0, 0, 41, 0, 3, 0, 0, 'u', 's', 'e', 'r', 0}
	if !faultproxy.PostgresCancel(cancel) || faultproxy.PostgresCancel(startup) || faultproxy.PostgresCancel(cancel[:4]) {
		t.Fatal("PostgresCancel does not tell a cancel request from the rest")
	}
}
