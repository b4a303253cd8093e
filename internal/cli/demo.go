package cli

import (
	"fmt"
	"text/tabwriter"

	"github.com/oncehq/once/internal/demo"
	"github.com/oncehq/once/internal/view"
)

func defineDemo(fs *flagSet) func(env, []string) error {
	db := fs.db()
	asJSON := fs.Bool("json", false, "print the result as one JSON object")
	smtpAddr := fs.String("smtp", "", "send through this SMTP server (`HOST:PORT`) instead of the demo's own; each intent goes to its own recipient")
	intents := fs.Int("intents", 200, "`N` emails per half")
	workers := fs.Int("workers", 4, "`N` worker processes")
	return func(e env, _ []string) error { return runDemo(e, *db, *asJSON, *smtpAddr, *intents, *workers) }
}

func runDemo(e env, db string, asJSON bool, smtpAddr string, intents, workers int) error {
	if intents < 1 || intents > 100000 {
		return usagef("--intents must be between 1 and 100000")
	}
	if workers < 1 || workers > 64 {
		return usagef("--workers must be between 1 and 64")
	}
	url := dbURL(db)
	bar := newBar(e.stderr, "", intents)
	rep, err := demo.Run(e.ctx, demo.Options{DB: url, SMTP: smtpAddr, Intents: intents, Workers: workers,
		Progress: func(half string, acked, total, kills int) {
			bar.update(half, acked, fmt.Sprintf("%d kills", kills))
		}})
	bar.finish()
	if err != nil {
		return err
	}
	if asJSON {
		return view.Encode(e.stdout, rep)
	}
	w := e.stdout
	fmt.Fprintf(w, "%d emails, sent twice over: once by \"check, then send\", once through once.\n", rep.Intents)
	fmt.Fprintf(w, "Worker processes (%d at a time) were killed with SIGKILL %d times, some right between the SMTP\n", workers, rep.Kills)
	fmt.Fprintf(w, "server's acceptance and the record; the queue redelivered every job they held. (%.1fs)\n\n", rep.Seconds)
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tintents\tdelivered\tduplicates\tfor review\tsilently lost\t")
	fmt.Fprintf(tw, "check, then send\t%d\t%d\t%d\t-\t%d\t\n", rep.Intents, rep.Naive.Delivered, rep.Naive.Duplicates, rep.Naive.Lost)
	fmt.Fprintf(tw, "once\t%d\t%d\t%d\t%d\t%d\t\n", rep.Intents, rep.Once.Delivered, rep.Once.Duplicates, rep.Once.Review, rep.Once.Lost)
	tw.Flush()
	fmt.Fprintf(w, "\nCounted by %s at %s.\n", rep.Counted, rep.SMTP)
	if rep.Once.Review > 0 {
		fmt.Fprintf(w, "The %d for review are sends whose worker died before it could record them: plain SMTP\n", rep.Once.Review)
		fmt.Fprintln(w, "cannot be asked whether it delivered, so once asks a person instead of sending twice.")
	}
	fmt.Fprintf(w, "Look at them: go run ./cmd/once serve%s   (run %s in %s)\n", dbFlag(db), rep.Run, rep.DB)
	return nil
}

func dbFlag(db string) string {
	if db == "" {
		return ""
	}
	return " --db " + db
}
