package cli_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/oncehq/once"
)

// hostile is stored text that drives a terminal: it sets the window's
// title (OSC 0), clears the screen, returns the carriage over what was
// printed, and reverses what follows (U+202E), so "exe.pdf" reads as
// "fdp.exe".
const hostile = "\x1b]0;pwned\x07\x1b[2J\rcharge\u202efdp.exe\u2066\u200f"

// unsafeRune reports a rune of out that a terminal would act on, or -1:
// a control character other than the line break, or a bidi control.
func unsafeRune(out string) rune {
	for _, r := range out {
		if r != '\n' && unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) {
			return r
		}
	}
	return -1
}

// TestTerminalOutputIsSafe: what `once reap`, `ls`, `show` and `resolve`
// print of stored text (a kind, a target, an error, a note) reaches the
// terminal with its control and bidi characters written as escapes. reap
// printed kind names as they were stored, and bidi controls passed
// through ls and show.
func TestTerminalOutputIsSafe(t *testing.T) {
	db := filepath.Join(t.TempDir(), "once.db")
	mustRun(t, "migrate", "--db", db)
	var dead, failed, done once.Key
	withClient(t, db, once.Config{}, func(c *once.Client, s once.Store) {
		ctx := context.Background()
		in := once.Intent{Run: "run" + hostile, Kind: hostile, Target: "ada" + hostile}
		k, fp, _ := once.KeyOf(in)
		dead = k
		if _, err := s.Claim(ctx, once.ClaimRequest{Key: k, Fingerprint: fp, Run: in.Run, Kind: in.Kind, Target: in.Target,
			Lease: time.Millisecond, Token: "t", Recovery: once.AskPerson, Retention: time.Hour}); err != nil {
			t.Fatal(err)
		}
		in.Step = 1
		failed, _, _ = once.KeyOf(in)
		once.Do(ctx, c, in, func(context.Context, once.Attempt) (int, error) { return 0, errors.New("550 " + hostile) })
		in.Step = 2
		done, _, _ = once.KeyOf(in)
		once.Do(ctx, c, in, func(context.Context, once.Attempt) (int, error) { return 0, nil })
	})
	time.Sleep(20 * time.Millisecond) // past the lease: the worker is dead

	outputs := map[string]string{}
	outputs["reap"] = mustRun(t, "reap", "--db", db)
	outputs["ls"] = mustRun(t, "ls", "--db", db)
	for _, k := range []once.Key{dead, failed} {
		outputs["show "+string(k[:8])] = mustRun(t, "show", string(k), "--db", db)
	}
	outputs["resolve"] = mustRun(t, "resolve", string(failed), "--retry", "--note", "checked "+hostile, "--by", "ada"+hostile, "--db", db)
	outputs["show after resolve"] = mustRun(t, "show", string(failed), "--db", db)
	_, _, outputs["resolve a succeeded action"] = run(t, "resolve", string(done), "--done", "--note", "n", "--by", "ada"+hostile, "--db", db)
	for name, out := range outputs {
		if r := unsafeRune(out); r >= 0 {
			t.Errorf("once %s wrote %U to the terminal:\n%q", name, r, out)
		}
	}
	// Escaped, not dropped: the text is still there to read.
	if !strings.Contains(outputs["reap"], `\x1b]0;pwned\a\x1b[2J\rcharge\u202efdp.exe`) {
		t.Errorf("once reap does not show the kind escaped:\n%s", outputs["reap"])
	}
}

// TestKeyPayloadFileBounded: `once key --payload-file` reads at most the
// payload limit and refuses a longer file, saying so; it read
// /dev/zero until memory ran out.
func TestKeyPayloadFileBounded(t *testing.T) {
	long := filepath.Join(t.TempDir(), "long.json")
	if err := os.WriteFile(long, []byte(`"`+strings.Repeat("x", once.DefaultMaxPayloadBytes)+`"`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{"/dev/zero", long} {
		for _, raw := range []bool{false, true} {
			args := []string{"key", "--run", "r", "--kind", "k", "--payload-file", file}
			if raw {
				args = append(args, "--raw")
			}
			done := make(chan struct{})
			var code int
			var stderr string
			go func() {
				defer close(done)
				code, _, stderr = run(t, args...)
			}()
			select {
			case <-done:
			case <-time.After(2 * time.Minute):
				t.Fatalf("once %s still reading after 2 minutes", strings.Join(args, " "))
			}
			want := fmt.Sprintf("over the limit of %d bytes", once.DefaultMaxPayloadBytes)
			if code != 1 || !strings.Contains(stderr, want) {
				t.Errorf("once %s: exit %d, %q; want it refused, saying %q", strings.Join(args, " "), code, stderr, want)
			}
		}
	}
}

// TestTerminalShowsInvisibleCharacters: a kind that differs from
// another only by a character a terminal draws as nothing (a zero-width
// space, a word joiner, a byte-order mark, a soft hyphen, a tag
// character) must not print as its twin in `once reap` and `once ls`:
// an operator would read two kinds as one, or a forged kind as a real
// one. Before, only control and bidi characters were escaped.
func TestTerminalShowsInvisibleCharacters(t *testing.T) {
	db := filepath.Join(t.TempDir(), "once.db")
	mustRun(t, "migrate", "--db", db)
	kinds := []string{"charge", "charge\u200b", "charge\u2060", "charge\ufeff", "char\u00adge", "charge\U000e0041"}
	withClient(t, db, once.Config{}, func(_ *once.Client, s once.Store) {
		for i, kind := range kinds {
			in := once.Intent{Run: fmt.Sprint("run-", i), Kind: kind, Target: "t" + kind}
			k, fp, _ := once.KeyOf(in)
			if _, err := s.Claim(context.Background(), once.ClaimRequest{Key: k, Fingerprint: fp, Run: in.Run, Kind: in.Kind, Target: in.Target,
				Lease: time.Millisecond, Token: "t", Recovery: once.AskPerson, Retention: time.Hour}); err != nil {
				t.Fatal(err)
			}
		}
	})
	time.Sleep(20 * time.Millisecond) // past the lease: the worker is dead
	for name, out := range map[string]string{"reap": mustRun(t, "reap", "--db", db), "ls": mustRun(t, "ls", "--db", db)} {
		for _, r := range out {
			if unicode.Is(unicode.Cf, r) {
				t.Errorf("once %s wrote the invisible %U to the terminal:\n%q", name, r, out)
				break
			}
		}
	}
}
