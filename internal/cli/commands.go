package cli

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/dburl"
	"github.com/oncehq/once/internal/view"
)

func runMigrate(e env, args []string) error {
	fs, db := flags(e, "migrate")
	print := fs.Bool("print", false, "print the SQL for your own migration tool instead of running it")
	if _, err := e.parse(fs, args); err != nil {
		return err
	}
	o, err := openStore(e.ctx, dbURL(*db), true)
	if err != nil {
		return err
	}
	defer o.Close()
	if *print {
		sql, err := joinSQL(o.Migrations())
		if err != nil {
			return err
		}
		fmt.Fprint(e.stdout, sql)
		return nil
	}
	before, err := o.Version(e.ctx)
	if err != nil {
		return err
	}
	if err := o.Migrate(e.ctx); err != nil {
		return err
	}
	after, err := o.Version(e.ctx)
	if err != nil {
		return err
	}
	if before == after {
		fmt.Fprintf(e.stdout, "%s: schema already at version %d\n", o.Name, after)
	} else {
		fmt.Fprintf(e.stdout, "%s: schema migrated from version %d to %d\n", o.Name, before, after)
	}
	return nil
}

func runKey(e env, args []string) error {
	fs := newFlagSet(e, "key")
	run := fs.String("run", "", "run id (required)")
	step := fs.Int64("step", 0, "step number")
	kind := fs.String("kind", "", "kind of action (required)")
	target := fs.String("target", "", "target")
	payloadFile := fs.String("payload-file", "", "file holding the payload; '-' for standard input. JSON is canonicalised; use --raw to hash the bytes as they are")
	raw := fs.Bool("raw", false, "hash the payload file's bytes as they are (Go []byte payloads)")
	inKey := fs.Bool("payload-in-key", false, "fold the payload into the key (Intent.PayloadInKey)")
	asJSON := fs.Bool("json", false, "print JSON")
	if _, err := e.parse(fs, args); err != nil {
		return err
	}
	in := once.Intent{Run: *run, Step: *step, Kind: *kind, Target: *target, PayloadInKey: *inKey}
	if *payloadFile != "" {
		var b []byte
		var err error
		if *payloadFile == "-" {
			b, err = io.ReadAll(os.Stdin)
		} else {
			b, err = os.ReadFile(*payloadFile)
		}
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
			return usagef("--%s %s", strings.ToLower(ie.Field), ie.Reason)
		}
		return err
	}
	if *asJSON {
		return writeJSON(e.stdout, map[string]string{"key": string(key), "fingerprint": string(fp)})
	}
	fmt.Fprintf(e.stdout, "key          %s\nfingerprint  %s\n", key, fp)
	return nil
}

// newFlagSet is a flag set without --db, for commands that need none.
func newFlagSet(e env, name string) *flag.FlagSet {
	fs, _ := flags(e, name)
	return fs
}

func runLs(e env, args []string) error {
	fs, db := flags(e, "ls")
	status := fs.String("status", "", "only this status: "+statusList())
	kind := fs.String("kind", "", "only this kind")
	run := fs.String("run", "", "only this run")
	since := fs.Duration("since", 0, "only actions updated within this duration (e.g. 24h)")
	limit := fs.Int("limit", 50, "at most this many")
	asJSON := fs.Bool("json", false, "print JSON, one array")
	if _, err := e.parse(fs, args); err != nil {
		return err
	}
	if *status != "" && !once.Status(*status).Valid() {
		return usagef("--status %q is not a status; use one of %s", *status, statusList())
	}
	if *limit <= 0 || *since < 0 {
		return usagef("--limit must be positive and --since not negative")
	}
	o, err := openStore(e.ctx, dbURL(*db), false)
	if err != nil {
		return err
	}
	defer o.Close()
	f := once.Filter{Status: once.Status(*status), Kind: *kind, Run: *run, Limit: *limit}
	if *since > 0 {
		f.Since = time.Now().Add(-*since)
	}
	acts, err := o.List(e.ctx, f)
	if err != nil {
		return err
	}
	if *asJSON {
		out := make([]view.Action, 0, len(acts))
		for _, a := range acts {
			out = append(out, view.FromAction(a, nil))
		}
		return writeJSON(e.stdout, out)
	}
	if len(acts) == 0 {
		fmt.Fprintln(e.stdout, "no actions match")
		return nil
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tSTATUS\tKIND\tTARGET\tRUN\tSTEP\tATTEMPT\tUPDATED")
	for _, a := range acts {
		fmt.Fprintf(tw, "%.12s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", a.Key, a.Status, a.Kind, clip(a.Target, 30), clip(a.Run, 24), a.Step, a.Attempt, ago(a.UpdatedAt))
	}
	return tw.Flush()
}

func statusList() string {
	s := make([]string, len(once.Statuses()))
	for i, v := range once.Statuses() {
		s[i] = string(v)
	}
	return strings.Join(s, ", ")
}

func clip(s string, n int) string {
	if len([]rune(s)) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}

func ago(t time.Time) string {
	d := time.Since(t).Round(time.Second)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	}
	return t.UTC().Format("2006-01-02")
}

// findKey accepts a full key or an unambiguous prefix of at least 8
// characters, as `once ls` prints them.
func findKey(e env, o *dburl.Store, k string) (once.Action, error) {
	if len(k) == 64 {
		return o.Get(e.ctx, once.Key(k))
	}
	if len(k) < 8 || len(k) > 64 || strings.Trim(k, "0123456789abcdef") != "" {
		return once.Action{}, usagef("%q is not a key; give the key, or at least 8 of its first characters (lowercase hex)", k)
	}
	found, err := o.List(e.ctx, once.Filter{KeyPrefix: k, Limit: 2})
	if err != nil {
		return once.Action{}, err
	}
	switch len(found) {
	case 0:
		return once.Action{}, fmt.Errorf("%w: no key starts with %s", once.ErrNotFound, k)
	case 1:
		return found[0], nil
	}
	return once.Action{}, fmt.Errorf("more than one key starts with %s; give more of it", k)
}

func runShow(e env, args []string) error {
	fs, db := flags(e, "show")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("give one key")
	}
	o, err := openStore(e.ctx, dbURL(*db), false)
	if err != nil {
		return err
	}
	defer o.Close()
	a, err := findKey(e, o, pos[0])
	if err != nil {
		return err
	}
	evs, err := o.Events(e.ctx, a.Key)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(e.stdout, view.FromAction(a, evs))
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(tw, "%s\t%s\n", k, v)
		}
	}
	row("key", string(a.Key))
	row("status", string(a.Status))
	row("kind", a.Kind)
	row("target", a.Target)
	row("run", fmt.Sprintf("%s (step %d)", a.Run, a.Step))
	row("attempt", fmt.Sprint(a.Attempt))
	row("payload", clip(string(a.Payload), 200))
	row("result", string(a.Result))
	row("error", a.Error)
	row("claimed", stamp(a.ClaimedAt))
	row("lease until", stamp(a.LeaseUntil))
	row("completed", stamp(a.CompletedAt))
	if a.ResolvedBy != "" {
		row("resolved", fmt.Sprintf("by %s at %s: %s", a.ResolvedBy, stamp(a.ResolvedAt), a.ResolveNote))
	}
	tw.Flush()
	fmt.Fprintln(e.stdout)
	fmt.Fprintln(e.stdout, "trail:")
	tw = tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	for _, ev := range evs {
		move := string(ev.To)
		if ev.From != "" {
			move = string(ev.From) + " → " + move
		}
		fmt.Fprintf(tw, "  %s\t%s\t#%d\t%s\t%s\t%s\n", stamp(ev.At), ev.Type, ev.Attempt, move, ev.Actor, ev.Note)
	}
	return tw.Flush()
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}

func runResolve(e env, args []string) error {
	fs, db := flags(e, "resolve")
	done := fs.Bool("done", false, "the effect happened")
	retry := fs.Bool("retry", false, "the effect did not happen; run it again on the next delivery")
	abandon := fs.Bool("abandon", false, "do not do it at all")
	result := fs.String("result", "", "with --done: the result to store, as JSON")
	note := fs.String("note", "", "why (required)")
	by := fs.String("by", os.Getenv("USER"), "who decides")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("give one key")
	}
	var d once.Decision
	n := 0
	for _, c := range []struct {
		set bool
		d   once.Decision
	}{{*done, once.DecisionDone}, {*retry, once.DecisionRetry}, {*abandon, once.DecisionAbandon}} {
		if c.set {
			d, n = c.d, n+1
		}
	}
	if n != 1 {
		return usagef("give exactly one of --done, --retry, --abandon")
	}
	if strings.TrimSpace(*note) == "" {
		return usagef("--note is required: say why, for the next person who reads the trail")
	}
	if *by == "" {
		*by = "cli"
	}
	if *result != "" && !json.Valid([]byte(*result)) {
		return usagef("--result is not valid JSON")
	}
	o, err := openStore(e.ctx, dbURL(*db), false)
	if err != nil {
		return err
	}
	defer o.Close()
	a, err := findKey(e, o, pos[0])
	if err != nil {
		return err
	}
	c, err := client(o.Store)
	if err != nil {
		return err
	}
	r := once.Resolution{Decision: d, By: *by, Note: *note}
	if *result != "" {
		r.Result = json.RawMessage(*result)
	}
	a, err = c.Resolve(e.ctx, a.Key, r)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "%s is now %s (resolved by %s)\n", a.Key, a.Status, a.ResolvedBy)
	return nil
}

func runReap(e env, args []string) error {
	fs, db := flags(e, "reap")
	every := fs.Duration("every", 0, "run a pass at this interval until interrupted; zero runs one pass")
	asJSON := fs.Bool("json", false, "print each pass's report as a JSON line")
	if _, err := e.parse(fs, args); err != nil {
		return err
	}
	if *every < 0 {
		return usagef("--every must not be negative")
	}
	o, err := openStore(e.ctx, dbURL(*db), false)
	if err != nil {
		return err
	}
	defer o.Close()
	c, err := client(o.Store)
	if err != nil {
		return err
	}
	r, err := once.NewReaper(c, once.ReaperConfig{})
	if err != nil {
		return err
	}
	for {
		rep, err := r.RunOnce(e.ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			writeJSON(e.stdout, rep)
		} else {
			fmt.Fprintf(e.stdout, "%s examined %d: review %d, released %d, verified %d, deferred %d, moved on %d\n",
				time.Now().UTC().Format(time.TimeOnly), rep.Examined, rep.Review, rep.Released, rep.Verified, rep.Deferred, rep.Changed)
			for _, k := range sortedKeys(rep.ByKind) {
				fmt.Fprintf(e.stdout, "  %s: %d\n", k, rep.ByKind[k])
			}
		}
		if *every == 0 {
			return nil
		}
		select {
		case <-e.ctx.Done():
			return nil
		case <-time.After(*every):
		}
	}
}

func runPurge(e env, args []string) error {
	fs, db := flags(e, "purge")
	olderThan := fs.Duration("older-than", 0, "purge finished actions older than this, whatever their kind's retention; zero uses each kind's retention (default 720h)")
	dryRun := fs.Bool("dry-run", false, "count what would be purged, delete nothing")
	if _, err := e.parse(fs, args); err != nil {
		return err
	}
	if *olderThan < 0 {
		return usagef("--older-than must not be negative")
	}
	o, err := openStore(e.ctx, dbURL(*db), false)
	if err != nil {
		return err
	}
	defer o.Close()
	cfg := once.Config{Store: o.Store}
	if *olderThan > 0 {
		cfg.Default.Retention = *olderThan
	}
	c, err := once.New(cfg)
	if err != nil {
		return err
	}
	total, err := c.Purge(e.ctx, once.PurgeOptions{DryRun: true})
	if err != nil {
		return err
	}
	if *dryRun || total == 0 {
		fmt.Fprintf(e.stdout, "%d finished actions would be purged\n", total)
		return nil
	}
	bar := newBar(e.stderr, "purging", total)
	n, err := c.Purge(e.ctx, once.PurgeOptions{BatchSize: 500, Progress: bar.set})
	bar.finish()
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "purged %d finished actions\n", n)
	return nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
