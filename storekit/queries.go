package storekit

import (
	"fmt"
	"io/fs"
	"regexp"
	"strings"
)

var queryNameRE = regexp.MustCompile(`^--\s*name:\s*([a-z][a-z0-9_]*)\s*$`)

// nameLineRE is any line that means to start a statement: one that
// queryNameRE does not take is refused, not read as a comment.
var nameLineRE = regexp.MustCompile(`(?i)^--\s*name\s*:`)

// LoadQueries reads a file of named SQL statements, so that a store
// keeps its queries as SQL, not in Go strings. Each statement follows a
// line "-- name: claim" and runs up to the next such line. Other lines
// that start with "--" are comments, left out of the statement: a
// fault harness matches a statement by its text, and a comment must not
// hold what it looks for. The statements keep the store's own
// placeholders ($T, ?1), for the store to substitute. A name is
// lowercase letters, digits and underscores; a line that starts as a
// name line but spells its name otherwise is an error.
func LoadQueries(fsys fs.FS, name string) (map[string]string, error) {
	raw, err := fs.ReadFile(fsys, name)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	var cur string
	var body strings.Builder
	flush := func() error {
		if cur == "" {
			return nil
		}
		q := strings.TrimSpace(body.String())
		if q == "" {
			return fmt.Errorf("%s: query %s is empty", name, cur)
		}
		out[cur] = q
		body.Reset()
		return nil
	}
	for i, line := range strings.Split(string(raw), "\n") {
		if m := queryNameRE.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
			if err := flush(); err != nil {
				return nil, err
			}
			if _, dup := out[m[1]]; dup {
				return nil, fmt.Errorf("%s:%d: query %s is named twice", name, i+1, m[1])
			}
			cur = m[1]
			continue
		}
		if nameLineRE.MatchString(strings.TrimSpace(line)) {
			return nil, fmt.Errorf("%s:%d: %q names no query: a name is lowercase letters, digits and underscores, starting with a letter", name, i+1, strings.TrimSpace(line))
		}
		if strings.HasPrefix(strings.TrimSpace(line), "--") {
			continue
		}
		if cur == "" {
			if strings.TrimSpace(line) != "" {
				return nil, fmt.Errorf("%s:%d: SQL before the first \"-- name:\" line", name, i+1)
			}
			continue
		}
		body.WriteString(line)
		body.WriteString("\n")
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return out, nil
}
