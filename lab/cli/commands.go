package cli

import (
	"bytes"
	"cmp"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/dburl"
	"github.com/oncehq/once/internal/view"
	"github.com/oncehq/once/storekit"
)

func defineMigrate(fs *flagSet) func(env, []string) error {
	db := fs.db()
	print := fs.Bool("print", false, "print the SQL, for the URL's schema and prefix, for your own migration tool instead of running it; connects to nothing")
	return func(e env, _ []string) error {
		if *print {
			// Rendered for the URL's schema and prefix; the database is
			// not needed, nor touched.
			ms, err := dburl.Migrations(dbURL(*db))
			if err != nil {
				return err
			}
			for _, m := range ms {
				fmt.Fprintf(e.stdout, "-- %03d_%s\n%s\n", m.Version, m.Name, strings.TrimSpace(m.SQL))
			}
			return nil
		}
		ctx, cancel := context.WithTimeout(e.ctx, openTimeout)
		s, err := dburl.Open(ctx, dbURL(*db))
		cancel()
		if err != nil {
			return err
		}
		defer s.Close()
		// Migrate refuses these too, under its lock; checked first, the
		// refusal is one plain line.
		ms, err := s.Migrations()
		if err != nil {
			return err
		}
		vs, err := s.Versions(e.ctx)
		if err != nil {
			return err
		}
		if err := storekit.CheckVersions(vs, len(ms)); err != nil {
			return fmt.Errorf("%s: %w", s.Name, err)
		}
		// What this run applied is known only under the migration lock:
		// a version read before it may be stale by the time it is taken.
		ran, err := s.MigrateApplied(e.ctx)
		if err != nil {
			return err
		}
		after := ms[len(ms)-1].Version
		if len(ran) == 0 {
			fmt.Fprintf(e.stdout, "%s: schema already at version %d\n", s.Name, after)
		} else {
			fmt.Fprintf(e.stdout, "%s: schema migrated from version %d to %d\n", s.Name, ran[0].Version-1, ran[len(ran)-1].Version)
		}
		return nil
	}
}

func defineKey(fs *flagSet) func(env, []string) error {
	run := fs.String("run", "", "the `RUN` id")
	step := fs.Int64("step", 0, "the step `N` within the run")
	kind := fs.String("kind", "", "the `KIND` of action")
	target := fs.String("target", "", "the `TARGET`")
	payloadFile := fs.String("payload-file", "", "`FILE` holding the payload; '-' for standard input. JSON is canonicalised; use --raw to hash the bytes as they are")
	raw := fs.Bool("raw", false, "hash the payload file's bytes as they are (Go []byte payloads)")
	inKey := fs.Bool("payload-in-key", false, "fold the payload into the key (Intent.PayloadInKey)")
	asJSON := fs.Bool("json", false, "print JSON")
	fs.require("run", "kind")
	return func(e env, _ []string) error {
		in := once.Intent{Run: *run, Step: *step, Kind: *kind, Target: *target, PayloadInKey: *inKey}
		if *payloadFile != "" {
			b, err := readPayload(*payloadFile)
			if err != nil {
				return err
			}
			if *raw {
				in.Payload = b
			} else {
				in.Payload = json.RawMessage(b)
			}
		}
		key, fp, err := once.KeyOf(in)
		if err != nil {
			var ie *once.IntentError
			if errors.As(err, &ie) {
				if ie.Field == "Payload" {
					// The payload comes from --payload-file.
					hint := ""
					if !*raw {
						hint = "; or pass --raw to hash the file's bytes as they are"
					}
					return usagef("--payload-file %s%s", ie.Reason, hint)
				}
				return usagef("--%s %s", strings.ToLower(ie.Field), ie.Reason)
			}
			return err
		}
		if *asJSON {
			return view.Encode(e.stdout, map[string]string{"key": string(key), "fingerprint": string(fp)})
		}
		fmt.Fprintf(e.stdout, "key          %s\nfingerprint  %s\n", key, fp)
		return nil
	}
}

// readPayload reads the payload file ("-" for standard input), at most
// the payload limit: a file longer than any payload once takes (or one
// without end, /dev/zero) is refused when the limit is passed.
func readPayload(name string) ([]byte, error) {
	r := io.Reader(os.Stdin)
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	const max = once.DefaultMaxPayloadBytes
	b, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		return nil, err
	}
	if len(b) > max {
		return nil, usagef("--payload-file %s is longer than %d bytes, over the limit of %d bytes for a payload (Config.MaxPayloadBytes' default); store large content elsewhere and key a reference to it", name, max, max)
	}
	return b, nil
}

func defineLs(fs *flagSet) func(env, []string) error {
	db := fs.db()
	status := fs.String("status", "", "only actions in this `STATUS`: "+view.StatusList())
	kind := fs.String("kind", "", "only actions of this `KIND`")
	run := fs.String("run", "", "only actions of this `RUN`")
	since := fs.Duration("since", 0, "only actions updated within this `DURATION` (e.g. 24h)")
	limit := fs.Int("limit", 50, "at most `N` actions (at most 1000)")
	asJSON := fs.Bool("json", false, "print JSON, one array")
	return func(e env, _ []string) error {
		if *status != "" && !once.Status(*status).Valid() {
			return usagef("--status %q is not a status; use one of %s", *status, view.StatusList())
		}
		if *limit <= 0 || *since < 0 {
			return usagef("--limit must be positive and --since not negative")
		}
		if *limit > maxList {
			return usagef("--limit %d is over %d, the most one list prints; narrow it with --status, --kind, --run or --since", *limit, maxList)
		}
		for name, v := range map[string]string{"--kind": *kind, "--run": *run} {
			if !utf8.ValidString(v) || strings.ContainsRune(v, 0) {
				return usagef("%s is not text (invalid UTF-8 or NUL); no action has such a %s", name, strings.TrimPrefix(name, "--"))
			}
		}
		d, err := openReadOnly(e.ctx, dbURL(*db), once.Config{})
		if err != nil {
			return err
		}
		defer d.Close()
		f := once.Filter{Status: once.Status(*status), Kind: *kind, Run: *run, Limit: *limit}
		if *since > 0 {
			f.Since = time.Now().Add(-*since)
		}
		acts, err := d.client.List(e.ctx, f)
		if err != nil {
			return err
		}
		if *asJSON {
			return view.Encode(e.stdout, view.Actions(acts))
		}
		if len(acts) == 0 {
			fmt.Fprintln(e.stdout, "no actions match")
			return nil
		}
		tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
		// REASON, the action's error, is last: it is the longest, and
		// `once show` prints it whole.
		fmt.Fprintln(tw, "KEY\tSTATUS\tKIND\tTARGET\tRUN\tSTEP\tATTEMPT\tUPDATED\tREASON")
		for _, a := range acts {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", safe(view.ShortKey(a.Key)), safe(string(a.Status)), safe(a.Kind), clip(a.Target, 30), clip(a.Run, 24), a.Step, a.Attempt, view.Ago(a.UpdatedAt), clip(reason(a, time.Now()), 60))
		}
		return tw.Flush()
	}
}

// reason is what ls shows in REASON: the action's error, or for an
// action gated by approval what it waits for. An awaiting row's expiry
// is by the database's clock; now, this machine's, only words it.
func reason(a once.Action, now time.Time) string {
	switch {
	case a.Status == once.StatusAwaitingApproval && a.LeaseUntil.After(now):
		return fmt.Sprintf("awaits approval until %s UTC (%s)", view.Time(a.LeaseUntil), view.Ago(a.LeaseUntil))
	case a.Status == once.StatusAwaitingApproval:
		return fmt.Sprintf("approval wait expired at %s UTC; the reaper records it %s", view.Time(a.LeaseUntil), cmp.Or(a.OnExpiry, once.StatusFailed))
	case a.Status == once.StatusApproved && a.ResolvedBy != "":
		return "approved by " + a.ResolvedBy + "; runs at its next delivery"
	}
	return a.Error
}

// clip shortens s to n runes, made safe for a terminal.
func clip(s string, n int) string {
	s = safe(s)
	if len([]rune(s)) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}

// safe makes stored text fit for a terminal line (view.Terminal): every
// stored string a command prints goes through it; the JSON output is
// untouched.
func safe(s string) string { return view.Terminal(s) }

// findKey accepts a full key or an unambiguous prefix of at least 8
// characters, as `once ls` prints them.
func findKey(ctx context.Context, c *once.Client, k string) (once.Action, error) {
	a, err := c.Find(ctx, k)
	if errors.Is(err, once.ErrNotAKey) {
		return a, usagef("%q is not a key; give the key, or at least 8 of its first characters (hex)", k)
	}
	return a, err
}

// maxShowEvents bounds --events: a page of a trail that a terminal, or
// a script reading --json, takes in one go.
const maxShowEvents = 1000

// maxList is the most actions one `once ls` prints: each is read whole,
// payload and result, as the console's lists are bounded too.
const maxList = 1000

// minReapEvery is the shortest interval between the command's reaper
// passes: each reads the store, and a lease is seconds long.
const minReapEvery = time.Second

func defineShow(fs *flagSet) func(env, []string) error {
	db := fs.db()
	asJSON := fs.Bool("json", false, "print JSON")
	limit := fs.Int("events", 100, "print `N` events of the trail (at most 1000); the rest come a page at a time")
	after := fs.Int64("events-after", 0, "print the trail after the event numbered `ID`: the next page, as the page before says")
	newest := fs.Bool("newest", false, "print the trail newest first")
	payload := fs.Bool("payload", false, "print the whole payload and nothing else, to read before deciding: JSON indented, text with control characters escaped, other bytes in hex (--json has it exactly)")
	return func(e env, args []string) error {
		if *limit < 1 || *limit > maxShowEvents {
			return usagef("--events %d must be from 1 to %d", *limit, maxShowEvents)
		}
		if *after < 0 {
			return usagef("--events-after %d is not an event's number", *after)
		}
		if *payload && *asJSON {
			return usagef("give --payload or --json, not both: --json prints the payload too, exactly")
		}
		d, err := openReadOnly(e.ctx, dbURL(*db), once.Config{})
		if err != nil {
			return err
		}
		defer d.Close()
		a, err := findKey(e.ctx, d.client, args[0])
		if err != nil {
			return err
		}
		if *payload {
			_, err := e.stdout.Write(readablePayload(a.Payload))
			return err
		}
		page, err := d.client.EventPage(e.ctx, once.EventQuery{Key: a.Key, Newest: *newest, After: *after, Limit: *limit})
		if err != nil {
			return err
		}
		evs := page.Events
		if *asJSON {
			return view.Encode(e.stdout, view.FromActionPage(a, page))
		}
		tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
		row := func(k, v string) {
			if v != "" {
				fmt.Fprintf(tw, "%s\t%s\n", k, safe(v))
			}
		}
		row("key", string(a.Key))
		row("status", string(a.Status))
		row("kind", a.Kind)
		row("target", a.Target)
		row("run", fmt.Sprintf("%s (step %d)", a.Run, a.Step))
		row("attempt", fmt.Sprint(a.Attempt))
		row("fingerprint", string(a.Fingerprint))
		if p := clip(string(a.Payload), 200); p != safe(string(a.Payload)) {
			row("payload", fmt.Sprintf("%s  (%d bytes; once show %s --payload prints it whole)", p, len(a.Payload), a.Key))
		} else {
			row("payload", p)
		}
		row("result", string(a.Result))
		row("error", a.Error)
		row("claimed", view.Time(a.ClaimedAt))
		if a.Status == once.StatusAwaitingApproval {
			// An awaiting row holds no lease: LeaseUntil is when its
			// wait expires.
			// Since, to the nanosecond, with the attempt and the
			// fingerprint, names the wait a decision is for: a key
			// whose action was purged and came back waits again.
			since := a.CreatedAt.UTC().Format(time.RFC3339Nano)
			row("since", fmt.Sprintf("%s (%s)", since, view.Ago(a.CreatedAt)))
			row("expires", fmt.Sprintf("%s (%s); unanswered, it becomes %s", view.Time(a.LeaseUntil), view.Ago(a.LeaseUntil), cmp.Or(a.OnExpiry, once.StatusFailed)))
			row("decide", fmt.Sprintf("once approve %s --by NAME --attempt %d --fingerprint %s --since %s (or once reject …, with --note)", a.Key, a.Attempt, a.Fingerprint, since))
		} else {
			row("lease until", view.Time(a.LeaseUntil))
		}
		row("completed", view.Time(a.CompletedAt))
		if a.ResolvedBy != "" {
			by := fmt.Sprintf("by %s at %s", a.ResolvedBy, view.Time(a.ResolvedAt))
			if a.ResolveNote != "" {
				by += ": " + a.ResolveNote
			}
			row("resolved", by)
		}
		tw.Flush()
		fmt.Fprintln(e.stdout)
		fmt.Fprintln(e.stdout, "trail (UTC):")
		tw = tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
		for _, ev := range evs {
			move := string(ev.To)
			if ev.From != "" {
				move = string(ev.From) + " → " + move
			}
			actor := safe(ev.Actor)
			if ev.Origin != "" {
				actor += "@" + safe(ev.Origin)
			}
			fmt.Fprintf(tw, "  %s\t%s\t#%d\t%s\t%s\t%s\n", view.Time(ev.At), safe(string(ev.Type)), ev.Attempt, safe(move), actor, safe(ev.Note))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if page.Next == 0 && *after == 0 {
			return nil
		}
		order := ""
		if *newest {
			order = " --newest"
		}
		fmt.Fprintf(e.stdout, "(%d events in all; %d printed)\n", page.Total, len(evs))
		if page.Next != 0 {
			fmt.Fprintf(e.stdout, "next page: once show %s%s --events-after %d\n", a.Key, order, page.Next)
		}
		return nil
	}
}

// readablePayload is a payload as `once show --payload` prints it, for
// a person to read whole: JSON indented, UTF-8 text as it is, anything
// else as a hex dump; what would act on a terminal (escape sequences,
// bidi controls) written as its Go escape, line breaks and tabs kept.
func readablePayload(p []byte) []byte {
	var out bytes.Buffer
	switch {
	case len(p) == 0:
		return nil
	case json.Valid(p):
		json.Indent(&out, p, "", "  ") // valid JSON indents
	case utf8.Valid(p):
		out.Write(p)
	default:
		out.WriteString(hex.Dump(p))
	}
	if b := out.Bytes(); b[len(b)-1] != '\n' {
		out.WriteByte('\n')
	}
	return view.EscapeControls(out.Bytes())
}

func defineResolve(fs *flagSet) func(env, []string) error {
	db := fs.db()
	done := fs.Bool("done", false, "the effect happened")
	retry := fs.Bool("retry", false, "the effect did not happen; run it again on the next delivery")
	abandon := fs.Bool("abandon", false, "do not do it at all")
	result := fs.String("result", "", "with --done: the result to store, as `JSON`")
	note := fs.String("note", "", "a `TEXT` saying why: what you checked, for the next person who reads the trail")
	by := fs.String("by", "", "who decides: a `NAME` (default $USER, or cli)")
	attempt := fs.Int("attempt", 0, "decide only if the action is still at attempt `N`, the one you looked at (`once show` prints it); zero decides whatever attempt stands")
	fs.exactlyOne("done", "retry", "abandon")
	fs.require("note")
	return func(e env, args []string) error {
		r := once.Resolution{Note: *note, By: *by, Attempt: *attempt}
		switch {
		case *done:
			r.Decision = once.DecisionDone
		case *retry:
			r.Decision = once.DecisionRetry
		case *abandon:
			r.Decision = once.DecisionAbandon
		}
		if r.By == "" {
			r.By = cmp.Or(os.Getenv("USER"), "cli")
		}
		if *result != "" {
			r.Result = json.RawMessage(*result)
		}
		d, err := open(e.ctx, dbURL(*db), once.Config{})
		if err != nil {
			return err
		}
		defer d.Close()
		// Checked by the client before the action is looked up, so a
		// mistyped decision costs no query.
		if err := d.client.ValidateResolution(r); err != nil {
			if re, ok := errors.AsType[*once.ResolutionError](err); ok {
				return usagef("--%s %s", strings.ToLower(re.Field), re.Reason)
			}
			return err
		}
		a, err := findKey(e.ctx, d.client, args[0])
		if err != nil {
			return err
		}
		a, err = d.client.Resolve(e.ctx, a.Key, r)
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "%s is now %s (resolved by %s)\n", safe(string(a.Key)), safe(string(a.Status)), safe(a.ResolvedBy))
		return nil
	}
}

func defineReap(fs *flagSet) func(env, []string) error {
	db := fs.db()
	every := fs.Duration("every", 0, "run a pass every `INTERVAL` until interrupted; zero runs one pass")
	asJSON := fs.Bool("json", false, "print each pass's report as a JSON line")
	return func(e env, _ []string) error {
		if *every < 0 {
			return usagef("--every must not be negative")
		}
		if *every > 0 && *every < minReapEvery {
			return usagef("--every %v is under a second: each pass reads the store; give 1s or more, or 0 for one pass", *every)
		}
		d, err := open(e.ctx, dbURL(*db), once.Config{})
		if err != nil {
			return err
		}
		defer d.Close()
		report := func(rep once.ReapReport) {
			if *asJSON {
				view.Encode(e.stdout, rep)
				return
			}
			fmt.Fprintf(e.stdout, "%s examined %d: review %d, released %d, verified %d, deferred %d, moved on %d; re-driven %d, waiting %d\n",
				time.Now().UTC().Format(time.TimeOnly), rep.Examined, rep.Review, rep.Released, rep.Verified, rep.Deferred, rep.Changed, rep.Redriven, rep.Waiting)
			for _, k := range slices.Sorted(maps.Keys(rep.ByKind)) {
				fmt.Fprintf(e.stdout, "  %s: %d\n", safe(k), rep.ByKind[k])
			}
			if rep.Waiting > 0 {
				fmt.Fprintf(e.stdout, "  %d released actions wait for a delivery nobody will make (this command has no Redrive hooks, nor did their application): publish their jobs again, or run a reaper in the application; `once ls --status released` lists them\n", rep.Waiting)
			}
			if rep.AwaitingVerifier > 0 {
				fmt.Fprintf(e.stdout, "  %d actions due for recovery under verify_then_decide were left alone: only a process that holds their kind's verifier decides them; run a reaper in the application\n", rep.AwaitingVerifier)
			}
		}
		if *every == 0 {
			r, err := once.NewReaper(d.client, once.ReaperConfig{})
			if err != nil {
				return err
			}
			rep, err := r.RunOnce(e.ctx)
			if err != nil {
				return err
			}
			report(rep)
			return nil
		}
		// The library's loop: a failed pass is said and the next one
		// comes at the interval, as in any long-running reaper.
		r, err := once.NewReaper(d.client, once.ReaperConfig{Interval: *every, OnPass: func(rep once.ReapReport, err error) {
			if err != nil {
				fmt.Fprintf(e.stderr, "once reap: pass failed: %s\n", safe(dburl.Redact(strings.Join(strings.Fields(err.Error()), " "))))
				return
			}
			report(rep)
		}})
		if err != nil {
			return err
		}
		if err := r.Start(e.ctx); err != nil {
			return err
		}
		<-e.ctx.Done()
		r.Stop()
		return nil
	}
}

func definePurge(fs *flagSet) func(env, []string) error {
	db := fs.db()
	olderThan := fs.Duration("older-than", 0, "purge finished actions not updated for this `DURATION`, whatever retention their kind recorded; zero keeps to each action's own deadline")
	dryRun := fs.Bool("dry-run", false, "count what would be purged, delete nothing")
	return func(e env, _ []string) error {
		if *olderThan < 0 {
			return usagef("--older-than must not be negative")
		}
		d, err := open(e.ctx, dbURL(*db), once.Config{})
		if err != nil {
			return err
		}
		defer d.Close()
		total, err := d.client.Purge(e.ctx, once.PurgeOptions{DryRun: true, OlderThan: *olderThan})
		if err != nil {
			return err
		}
		if *dryRun || total == 0 {
			fmt.Fprintf(e.stdout, "%d finished actions would be purged\n", total)
			return nil
		}
		bar := newBar(e.stderr, "purging", total)
		n, err := d.client.Purge(e.ctx, once.PurgeOptions{BatchSize: 500, OlderThan: *olderThan, Progress: bar.set})
		bar.finish()
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "purged %d finished actions\n", n)
		return nil
	}
}
