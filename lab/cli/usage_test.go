package cli_test

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// synopses returns each command's synopsis as `once help` prints it, by
// command name.
func synopses(t *testing.T) (names []string, byName map[string]string) {
	t.Helper()
	byName = map[string]string{}
	for _, line := range strings.Split(mustRun(t, "help"), "\n") {
		if rest, ok := strings.CutPrefix(line, "  once "); ok {
			name, _, _ := strings.Cut(rest, " ")
			names = append(names, name)
			byName[name] = "once " + rest
		}
	}
	if len(names) < 9 {
		t.Fatalf("once help lists %d commands: %v", len(names), names)
	}
	return names, byName
}

var flagLine = regexp.MustCompile(`(?m)^  (--[a-z-]+)(?: ([A-Z:]+))?$`)

// TestUsageFromFlags: `once help`, `once CMD -h`, `once help CMD` and the
// usage line after a mistake print the same synopsis, and it names every
// flag the command has, with the same value placeholder.
func TestUsageFromFlags(t *testing.T) {
	names, byName := synopses(t)
	for _, name := range names {
		syn := byName[name]
		code, help, _ := run(t, name, "-h")
		if code != 0 || !strings.HasPrefix(help, "usage: "+syn+"\n") {
			t.Errorf("once %s -h: exit %d, does not start with the synopsis of once help (%q):\n%s", name, code, syn, help)
		}
		if again := mustRun(t, "help", name); again != help {
			t.Errorf("once help %s differs from once %s -h:\n%s\n%s", name, name, again, help)
		}
		flags := flagLine.FindAllStringSubmatch(help, -1)
		if len(flags) == 0 {
			t.Errorf("once %s -h lists no flags:\n%s", name, help)
		}
		for _, f := range flags {
			word := strings.TrimSpace(f[1] + " " + f[2])
			if !regexp.MustCompile(`[\[( ]` + regexp.QuoteMeta(word) + `[\]) ]|` + regexp.QuoteMeta(word) + `$`).MatchString(syn) {
				t.Errorf("once %s: the synopsis %q lacks %q, which -h lists", name, syn, word)
			}
		}
		// A bare "--" (once mcp's upstream command after it) is no flag.
		if n := len(regexp.MustCompile(`--[a-z]`).FindAllString(syn, -1)); n != len(flags) {
			t.Errorf("once %s: the synopsis names %d flags, -h lists %d", name, n, len(flags))
		}
		code, _, errOut := run(t, name, "--no-such-flag")
		if code == 0 || !strings.Contains(errOut, "\nusage: "+syn+"\n") {
			t.Errorf("once %s --no-such-flag: exit %d, the usage line is not the synopsis:\n%s", name, code, errOut)
		}
	}
	// The environment's values are read after parsing, never shown as a
	// flag's default: -h must not print a secret.
	t.Setenv("ONCE_TOKEN", "do-not-print-me")
	if _, help, _ := run(t, "serve", "-h"); strings.Contains(help, "do-not-print-me") {
		t.Errorf("once serve -h prints $ONCE_TOKEN:\n%s", help)
	}
}

// TestREADMECommandTable holds the README's command table to the
// synopses the flags make: a flag added, renamed or dropped without the
// README following fails here.
func TestREADMECommandTable(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## The command\n")
	if !ok {
		t.Fatal(`README.md has no "## The command" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var rows []string
	cell := regexp.MustCompile("^\\| `(once (?:[^`]|\\\\\\|)+)` \\|")
	for _, line := range strings.Split(section, "\n") {
		if m := cell.FindStringSubmatch(line); m != nil {
			rows = append(rows, strings.ReplaceAll(m[1], `\|`, "|"))
		}
	}
	names, byName := synopses(t)
	var want []string
	for _, name := range names {
		want = append(want, byName[name])
	}
	if !slices.Equal(rows, want) {
		t.Errorf("README.md's command table does not match once help; the table's first column should read, row by row:\n%s\n\nit reads:\n%s",
			strings.Join(want, "\n"), strings.Join(rows, "\n"))
	}
}
