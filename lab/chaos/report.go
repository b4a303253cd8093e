package chaos

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// Faults counts the faults that happened, by type.
type Faults struct {
	// Kill counts SIGKILLs of workers: at random, and right after a
	// provider applied an effect, before the worker could record it.
	Kill int `json:"kill"`
	// Stop counts SIGSTOP/SIGCONT pauses longer than a lease: zombies.
	Stop int `json:"stop"`
	// Conn counts pg_terminate_backend of workers' connections.
	Conn int `json:"conn"`
	// Proxy counts cuts and black holes of every connection between the
	// workers and the database.
	Proxy int `json:"proxy"`
	// ProviderTimeout counts replies a provider withheld after applying
	// the effect, until the worker gave up: the ambiguous case.
	ProviderTimeout int `json:"provider_timeout"`
	// Broker counts restarts (SIGKILL, then start) of the run's own
	// queue broker.
	Broker int `json:"broker"`
	// Failover counts kills of the database's primary (--ha).
	Failover int `json:"failover"`
}

// Kind is what happened to one kind of effect.
type Kind struct {
	// Recovery is the kind's recovery policy.
	Recovery string `json:"recovery"`
	Intents  int    `json:"intents"`
	// Applied counts the effects the provider really applied, copies
	// included.
	Applied int `json:"applied"`
	// Duplicates counts applications beyond the first, per intent.
	Duplicates int `json:"duplicates"`
	// Lost counts intents the provider never applied.
	Lost int `json:"lost"`
	// Review counts intents surfaced for a person before the operator
	// step.
	Review int `json:"review"`
	// Succeeded counts intents the ledger records as done.
	Succeeded int `json:"succeeded"`
	// Disagree counts intents the ledger records as succeeded that the
	// provider did not apply exactly once (once only).
	Disagree int `json:"ledger_disagrees"`
}

// Report is a run's outcome. Its JSON is what `once chaos --json`
// prints; the fields without a JSON name go to the text report.
type Report struct {
	Queue      string          `json:"queue"`
	Intents    int             `json:"intents"`
	Faults     Faults          `json:"faults"`
	Duplicates int             `json:"duplicates"`
	Lost       int             `json:"lost"`
	Review     int             `json:"review"`
	PerKind    map[string]Kind `json:"per_kind"`

	// Naive is true for a run of the naive "check, then send" workers.
	Naive bool `json:"-"`
	// Seed reproduces the run's draws of faults (--seed).
	Seed uint64 `json:"-"`
	// Run names the run: its schema, stream or queue, and recipients
	// carry it.
	Run string `json:"-"`
	// Schema is the ledger's PostgreSQL schema (dropped unless kept).
	Schema string `json:"-"`
	// Broker says how the broker was run and restarted.
	Broker string `json:"-"`
	// SMTP says where the email went.
	SMTP string `json:"-"`
	// Database says where the ledger was.
	Database string `json:"-"`
	// Workers is the number of worker processes; Starts counts their
	// starts, first ones included.
	Workers, Starts int `json:"-"`
	// Resolved counts the operator's decisions: done (the provider had
	// applied it) and retry (it had not).
	ResolvedDone, ResolvedRetry int `json:"-"`
	// Work is how long the workload took under faults, Converge how long
	// the operator step and the runs it released took, Total the whole.
	Work, Converge, Total time.Duration `json:"-"`
	// Failures lists the invariants that failed; empty when all held.
	Failures []string `json:"-"`
	// Dir is the run's directory (logs), when it was kept.
	Dir string `json:"-"`
}

// OK reports whether every invariant held.
func (r Report) OK() bool { return len(r.Failures) == 0 }

// WriteText writes the report for people.
func (r Report) WriteText(w io.Writer) error {
	mode := "once"
	if r.Naive {
		mode = "naive check-then-send (no claim)"
	}
	fmt.Fprintf(w, "once chaos: %d intents over %s, %d workers (%d starts), %s; seed %d\n", r.Intents, r.Queue, r.Workers, r.Starts, mode, r.Seed)
	fmt.Fprintf(w, "  run %s, schema %s on %s\n  broker: %s\n  smtp: %s\n", r.Run, r.Schema, r.Database, r.Broker, r.SMTP)
	f := r.Faults
	fmt.Fprintf(w, "  faults: kill %d, stop %d, conn %d, proxy %d, provider_timeout %d, broker %d, failover %d\n",
		f.Kill, f.Stop, f.Conn, f.Proxy, f.ProviderTimeout, f.Broker, f.Failover)
	fmt.Fprintf(w, "  took %v (work under faults %v, convergence %v)", r.Total.Round(time.Millisecond), r.Work.Round(time.Millisecond), r.Converge.Round(time.Millisecond))
	if !r.Naive {
		fmt.Fprintf(w, "; operator resolved %d as done, %d for retry", r.ResolvedDone, r.ResolvedRetry)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "kind\trecovery\tintents\tapplied\tduplicates\tlost\treview\tsucceeded\tledger disagrees\t")
	for _, k := range kinds {
		s := r.PerKind[k]
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", k, s.Recovery, s.Intents, s.Applied, s.Duplicates, s.Lost, s.Review, s.Succeeded, s.Disagree)
	}
	fmt.Fprintf(tw, "total\t\t%d\t\t%d\t%d\t%d\t\t\t\n", r.Intents, r.Duplicates, r.Lost, r.Review)
	tw.Flush()
	if r.OK() {
		fmt.Fprintln(w, "every invariant held: no intent applied twice, none lost, the ledger agrees with the providers")
	} else {
		fmt.Fprintln(w, "INVARIANTS FAILED:")
		for _, f := range r.Failures {
			fmt.Fprintln(w, "  - "+f)
		}
		if r.Naive {
			fmt.Fprintln(w, "  (as expected of check-then-send: this is what once is for)")
		}
	}
	if r.Dir != "" {
		fmt.Fprintln(w, "  logs kept in "+r.Dir)
	}
	return nil
}

// Progress is a snapshot for the progress line.
type Progress struct {
	// Phase is "work" (the workload under faults) or "converge" (the
	// operator step and what it released).
	Phase string
	// Settled counts intents the ledger (or the naive table) has
	// settled; Total is the intents.
	Settled, Total int
	// Review counts actions waiting for the operator.
	Review int
	Faults Faults
}

// Line is the progress line's text after the bar.
func (p Progress) Line() string {
	f := p.Faults
	parts := []string{fmt.Sprintf("kill %d", f.Kill), fmt.Sprintf("stop %d", f.Stop), fmt.Sprintf("conn %d", f.Conn), fmt.Sprintf("proxy %d", f.Proxy),
		fmt.Sprintf("timeout %d", f.ProviderTimeout), fmt.Sprintf("broker %d", f.Broker)}
	if f.Failover > 0 {
		parts = append(parts, fmt.Sprintf("failover %d", f.Failover))
	}
	s := strings.Join(parts, " ")
	if p.Review > 0 {
		s += fmt.Sprintf("; %d in review", p.Review)
	}
	return s
}
