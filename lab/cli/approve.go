package cli

import (
	"errors"
	"fmt"
	"strings"
	"time"
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
	fingerprint := fs.String("fingerprint", "", "decide only if the action still holds the payload you looked at: its fingerprint, `HEX` as `once show` prints it")
	since := fs.String("since", "", "decide only the wait you looked at: when it began, a `TIME` in RFC 3339 as `once show` prints it (a key whose action was purged and came back waits again, at the same attempt)")
	fs.require("by")
	if reject {
		fs.require("note")
	}
	return func(e env, args []string) error {
		dec := once.Approval{By: *by, Note: *note, Attempt: *attempt, Fingerprint: once.Fingerprint(*fingerprint), Via: "cli"}
		// Checked before the database is opened: a mistyped decision
		// costs no connection and no query.
		if err := checkApproval(dec, reject); err != nil {
			return err
		}
		if *since != "" {
			t, err := parseSince(*since)
			if err != nil {
				return err
			}
			dec.Since = t
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
	if fp := string(d.Fingerprint); fp != "" && (len(fp) != fingerprintLen || strings.Trim(fp, "0123456789abcdef") != "") {
		return usagef("--fingerprint %.80q is not a fingerprint: %d lowercase hex digits, as `once show` prints it", fp, fingerprintLen)
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

// fingerprintLen is the length of a payload's fingerprint: the hex of a
// SHA-256.
const fingerprintLen = 64

// maxSince bounds --since: RFC 3339 with nanoseconds and an offset is 35
// bytes.
const maxSince = 64

// parseSince reads --since, when the wait decided on began, as `once
// show` prints it (RFC 3339, with or without a fraction of a second).
// Only the exact instant fences: a time cut to the second does not name
// a wait that began within it.
func parseSince(v string) (time.Time, error) {
	if len(v) > maxSince {
		return time.Time{}, usagef("--since is %d bytes, over the limit of %d; give the time `once show` prints as since", len(v), maxSince)
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, usagef("--since %q is not a time in RFC 3339 (2006-01-02T15:04:05.999999999Z); give it as `once show` prints it as since", v)
	}
	return t, nil
}
