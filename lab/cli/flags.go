package cli

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
)

// flagSet is a command's flags: the standard flag set, plus which flags
// must be given and which are alternatives. What the synopsis shows and
// what the command checks come from the same place, so they cannot
// disagree.
type flagSet struct {
	*flag.FlagSet
	required []string
	oneOf    [][]string
}

func newFlagSet(name string) *flagSet {
	fs := flag.NewFlagSet("once "+name, flag.ContinueOnError)
	// Errors are reported by Run, in one line; -h prints the command's
	// help, made from the flags.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return &flagSet{FlagSet: fs}
}

// require marks flags that must be given.
func (fs *flagSet) require(names ...string) { fs.required = append(fs.required, names...) }

// exactlyOne marks flags of which exactly one must be given.
func (fs *flagSet) exactlyOne(names ...string) { fs.oneOf = append(fs.oneOf, names) }

// db defines the --db flag of every command that opens the database.
func (fs *flagSet) db() *string {
	return fs.String("db", "", "the database `URL`: postgres://… or a SQLite file path (default $ONCE_DATABASE_URL or ./"+DefaultDatabase+")")
}

// check enforces require and exactlyOne after parsing.
func (fs *flagSet) check() error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, group := range fs.oneOf {
		n := 0
		for _, name := range group {
			if given[name] {
				n++
			}
		}
		if n != 1 {
			return usagef("give exactly one of %s", strings.Join(dashed(group), ", "))
		}
	}
	for _, name := range fs.required {
		if !given[name] {
			_, use := flag.UnquoteUsage(fs.Lookup(name))
			return usagef("--%s is required: %s", name, use)
		}
	}
	return nil
}

func dashed(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = "--" + n
	}
	return out
}

// placeholder is what a flag's value is called in the synopsis: the word
// in backquotes in its usage ("the database `URL`"), or its type's name;
// "" for a boolean flag.
func placeholder(f *flag.Flag) string {
	if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
		return ""
	}
	name, _ := flag.UnquoteUsage(f)
	return strings.ToUpper(name)
}

// flagWord is "--name VALUE", or "--name" for a boolean flag.
func flagWord(f *flag.Flag) string {
	if p := placeholder(f); p != "" {
		return "--" + f.Name + " " + p
	}
	return "--" + f.Name
}

// synopsis is the command line the command takes, made from its flags:
// positional arguments, then the alternatives, then the required flags,
// then the optional ones in brackets, by name.
func (c command) synopsis() string {
	fs := newFlagSet(c.name)
	c.define(fs)
	words := append([]string{"once", c.name}, c.args...)
	placed := map[string]bool{}
	for _, group := range fs.oneOf {
		alts := make([]string, len(group))
		for i, name := range group {
			alts[i] = flagWord(fs.Lookup(name))
			placed[name] = true
		}
		words = append(words, "("+strings.Join(alts, " | ")+")")
	}
	for _, name := range fs.required {
		words = append(words, flagWord(fs.Lookup(name)))
		placed[name] = true
	}
	fs.VisitAll(func(f *flag.Flag) {
		if !placed[f.Name] {
			words = append(words, "["+flagWord(f)+"]")
		}
	})
	if c.rest {
		words = append(words, "[-- COMMAND ARGS...]")
	}
	return strings.Join(words, " ")
}

// printHelp prints the command's synopsis, what it does, and each flag
// with its meaning and default: `once COMMAND -h`.
func (c command) printHelp(w io.Writer) {
	fs := newFlagSet(c.name)
	c.define(fs)
	fmt.Fprintf(w, "usage: %s\n\n%s\n", c.synopsis(), c.help)
	var rows []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) { rows = append(rows, f) })
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w)
	for _, f := range rows {
		_, use := flag.UnquoteUsage(f)
		if !slices.Contains([]string{"", "0", "false", "0s"}, f.DefValue) {
			use += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintf(w, "  %s\n        %s\n", flagWord(f), use)
	}
}
