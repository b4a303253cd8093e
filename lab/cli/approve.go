package cli

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/oncehq/once"
)

func defineApprove(fs *flagSet) func(env, []string) error {
	return defineApproval(fs, false)
}

func defineReject(fs *flagSet) func(env, []string) error {
	return defineApproval(fs, true)
}

// defineApproval defines `once approve` and `once reject`, which differ
// only in the decision and in the note, which a rejection must give:
// every duplicate of the action is told it.
func defineApproval(fs *flagSet, reject bool) func(env, []string) error {
	db := fs.db()
	by := fs.String("by", "", "who decides: a `NAME`, recorded in the trail")
	noteUse := "a `TEXT` saying why, for the trail"
	if reject {
		noteUse = "a `TEXT` saying why: every duplicate of the action is told it"
	}
	note := fs.String("note", "", noteUse)
	attempt := fs.Int("attempt", 0, "decide only if the action is still at attempt `N`, the one you looked at (`once show` prints it); zero decides whatever attempt stands")
	fs.require("by")
	if reject {
		fs.require("note")
	}
	return func(e env, args []string) error {
		dec := once.Approval{By: *by, Note: *note, Attempt: *attempt, Via: "cli"}
		// Checked before the database is opened: a mistyped decision
		// costs no connection and no query.
		if err := checkApproval(dec, reject); err != nil {
			return err
		}
		d, err := open(e.ctx, dbURL(*db), once.Config{})
		if err != nil {
			return err
		}
		defer d.Close()
		a, err := findKey(e.ctx, d.client, args[0])
		if err != nil {
			return err
		}
		decide, verb := d.client.Approve, "approved"
		if reject {
			decide, verb = d.client.Reject, "rejected"
		}
		a, err = decide(e.ctx, a.Key, dec)
		if re, ok := errors.AsType[*once.ResolutionError](err); ok {
			// The engine's check, should it be stricter than ours.
			return usagef("--%s %s", strings.ToLower(re.Field), re.Reason)
		}
		if err != nil {
			return err
		}
		then := "its next delivery runs it, once"
		if reject {
			then = "it does not run, and every duplicate is told why"
		}
		fmt.Fprintf(e.stdout, "%s is now %s (%s by %s); %s\n", safe(string(a.Key)), safe(string(a.Status)), verb, safe(a.ResolvedBy), then)
		return nil
	}
}

// checkApproval refuses, before any I/O, a decision the engine would
// refuse, naming the flag and what to do.
func checkApproval(d once.Approval, reject bool) error {
	if d.Attempt < 0 {
		return usagef("--attempt %d is not an attempt; attempts are numbered from 1, and 0 decides whatever attempt stands", d.Attempt)
	}
	for _, f := range []struct {
		name, v, why string
		max          int
		required     bool
	}{
		{"by", d.By, "name who decides", once.MaxIDBytes, true},
		{"note", d.Note, "say why: every duplicate of the action is told it", once.MaxNoteBytes, reject},
	} {
		switch {
		case strings.TrimSpace(f.v) == "" && f.required:
			return usagef("--%s is empty; %s", f.name, f.why)
		case len(f.v) > f.max:
			return usagef("--%s is %d bytes, over the limit of %d", f.name, len(f.v), f.max)
		case !utf8.ValidString(f.v) || strings.IndexByte(f.v, 0) >= 0:
			return usagef("--%s is not text (invalid UTF-8 or NUL); give plain text", f.name)
		}
	}
	return nil
}
