package once

import (
	"flag"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var updateDocs = flag.Bool("update-docs", false, "rewrite the state machine's table in docs/state_machine.md from transitions.go")

const (
	tableBegin = "<!-- moves: generated from transitions.go by TestStateMachineTable (go test -run TestStateMachineTable -update-docs .); do not edit -->"
	tableEnd   = "<!-- moves: end -->"
)

// movesTable renders the table of moves as the docs show it.
func movesTable() string {
	var b strings.Builder
	b.WriteString("| move | from | to | by | event | when |\n|---|---|---|---|---|---|\n")
	cell := func(ss []Status) string {
		if len(ss) == 0 {
			return "(no row)"
		}
		var out []string
		for _, s := range ss {
			out = append(out, "`"+string(s)+"`")
		}
		return strings.Join(out, ", ")
	}
	for _, m := range moves() {
		to := "(stays)"
		if m.to != "" {
			to = "`" + string(m.to) + "`"
		}
		if m.newAttempt {
			to += ", attempt + 1"
		}
		ev := "none"
		if m.event != "" {
			ev = "`" + string(m.event) + "`"
		}
		b.WriteString("| " + m.name + " | " + cell(m.from) + " | " + to + " | " + m.by + " | " + ev + " | " + m.why + " |\n")
	}
	return b.String()
}

// The docs' table of moves is the one in transitions.go, so the doc
// cannot drift from the code.
func TestStateMachineTable(t *testing.T) {
	path := filepath.Join("docs", "state_machine.md")
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	i, j := strings.Index(text, tableBegin), strings.Index(text, tableEnd)
	if i < 0 || j < i {
		t.Fatalf("%s has no table between %q and %q", path, tableBegin, tableEnd)
	}
	want := tableBegin + "\n" + movesTable() + tableEnd
	got := text[i : j+len(tableEnd)]
	if got == want {
		return
	}
	if *updateDocs {
		if err := os.WriteFile(path, []byte(text[:i]+want+text[j+len(tableEnd):]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("%s's table of moves differs from transitions.go; run go test -run TestStateMachineTable -update-docs . and read the diff.\ngot:\n%s\nwant:\n%s", path, got, want)
}

// Every Transition the engine writes is made by a move: no other file
// of the package builds one field by field.
func TestEveryTransitionIsAMove(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") || name == "transitions.go" {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.CompositeLit); ok {
				if id, ok := lit.Type.(*ast.Ident); ok && id.Name == "Transition" {
					t.Errorf("%s: a Transition built by hand; make it with a move in transitions.go", fset.Position(lit.Pos()))
				}
			}
			return true
		})
	}
}

// Every status is reached by some move and every event the trail holds
// is written by one, but for those written or seen otherwise.
func TestMovesCoverTheStatusesAndEvents(t *testing.T) {
	reached := map[Status]bool{}
	written := map[EventType]bool{}
	for _, m := range moves() {
		reached[m.to] = true
		written[m.event] = true
		for _, s := range m.from {
			if !s.Valid() {
				t.Errorf("move %q starts from %q, which is no status", m.name, s)
			}
		}
		if m.to != "" && !m.to.Valid() {
			t.Errorf("move %q goes to %q, which is no status", m.name, m.to)
		}
	}
	for _, s := range Statuses() {
		if !reached[s] {
			t.Errorf("no move reaches %s", s)
		}
	}
	// Hooks only, or appended on their own (a refusal changes no row).
	otherwise := []EventType{EventReplayed, EventLeaseExpired, EventRefused, EventConflict, EventFingerprintMismatch, EventClaimResent}
	for _, e := range []EventType{EventClaimed, EventReplayed, EventSucceeded, EventFailed, EventUnknown, EventReleased, EventReview, EventTakenOver,
		EventVerified, EventVerifyFailed, EventResolved, EventRefused, EventLeaseExpired, EventRedriven} {
		if !written[e] && !slices.Contains(otherwise, e) {
			t.Errorf("no move writes %s", e)
		}
	}
}
