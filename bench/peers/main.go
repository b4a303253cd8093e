// Command peers measures once's Do beside its peers on one PostgreSQL
// server: a DBOS Transact workflow of one step, and River's Insert and
// InsertMany. Each does its least, so what is compared is the database
// work a library spends to make an action durable, not the action.
//
//	cd bench/peers && go run . --db postgres://postgres@127.0.0.1:5432/test
//
// Each contender gets a database of its own on the server, made and
// dropped by the run, so its commits can be counted apart. The arms take
// turns in rounds, in an order rotated every round, so that whatever
// else the machine does falls on all of them alike; a ratio is the
// median over rounds of the ratio of the same round. README.md beside
// this file says what each arm does.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	if err := mainErr(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		os.Exit(1)
	}
}

func mainErr(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("peers", flag.ContinueOnError)
	fs.SetOutput(stderr)
	db := fs.String("db", "", "PostgreSQL URL to connect to (postgres://user@host:5432/dbname); the role must be allowed to create databases")
	workers := fs.String("workers", "1,16,64", "goroutine counts to measure at, comma-separated")
	rounds := fs.Int("rounds", 5, "turns of each arm at each worker count")
	duration := fs.Duration("duration", 2*time.Second, "length of one turn")
	arms := fs.String("arms", strings.Join(allArms, ","), "arms to measure, comma-separated")
	asJSON := fs.Bool("json", false, "print the result as JSON instead of a table")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q; every setting is a flag (see -h)", fs.Arg(0))
	}
	ws, err := parseWorkers(*workers)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := run(ctx, options{
		db:       *db,
		workers:  ws,
		rounds:   *rounds,
		duration: *duration,
		arms:     splitList(*arms),
		progress: stderr,
	})
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("interrupted before the end; nothing is reported (%w)", err)
		}
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return printTable(stdout, rep, ws)
}

func splitList(s string) []string {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func parseWorkers(s string) ([]int, error) {
	var ws []int
	for _, f := range splitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("--workers has %q; expected positive integers separated by commas, e.g. 1,16,64", f)
		}
		ws = append(ws, n)
	}
	return ws, nil
}

// printTable writes the report for a person: one line per arm and
// worker count, then the ratios.
func printTable(w io.Writer, rep report, workers []int) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "%-18s %7s %11s %9s %9s %14s %16s\n",
		"arm", "workers", "actions/s", "p50 µs", "p99 µs", "commits/action", "WAL bytes/action")
	for _, a := range rep.Arms {
		fmt.Fprintf(bw, "%-18s %7d %11.0f %9.0f %9.0f %14.2f %16.0f\n",
			a.Name, a.Workers, a.ActionsPerS, a.P50us, a.P99us, a.CommitsPerAction, a.WALBytesPerAction)
	}
	if len(rep.Ratios) > 0 {
		fmt.Fprintln(bw, "\ndo's actions/s over each peer's (median of the rounds' ratios):")
		for _, n := range workers {
			for _, a := range allArms {
				key := fmt.Sprintf("do/%s@%d", a, n)
				if r, ok := rep.Ratios[key]; ok {
					fmt.Fprintf(bw, "  %-24s %6.2f\n", key, r)
				}
			}
		}
	}
	return bw.Flush()
}
