package cli

import (
	"fmt"

	"github.com/oncehq/once/internal/view"
	"github.com/oncehq/once/lab/demo"
)

func defineDemo(fs *flagSet) func(env, []string) error {
	db := fs.db()
	asJSON := fs.Bool("json", false, "print the result as one JSON object")
	smtpAddr := fs.String("smtp", "", "send through this SMTP server (`HOST:PORT`) instead of the demo's own; each intent goes to its own recipient, and the counts come from the workers' log of its replies")
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
	if err := rep.WriteText(w); err != nil {
		return err
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
