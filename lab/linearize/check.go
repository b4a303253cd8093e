package linearize

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/oncehq/once"
)

// Verdict is what Check found.
type Verdict struct {
	// Result is porcupine's: Ok, Illegal, or Unknown when the check ran
	// out of time.
	Result porcupine.CheckResult
	// Ops and Keys count the history's operations and partitions.
	Ops, Keys int
	// Explanation, for an Illegal history, shows each key that has no
	// linearization: the longest sequence of its operations the model
	// accepts, the state it leads to, and the operations left over.
	Explanation string
	// Illegal are the keys with no linearization.
	Illegal []once.Key
	info    porcupine.LinearizationInfo
}

// Check checks a history against Model within timeout (zero: no limit).
func Check(history []porcupine.Operation, timeout time.Duration) Verdict {
	m := Model()
	res, info := porcupine.CheckOperationsVerbose(m, history, timeout)
	v := Verdict{Result: res, Ops: len(history), Keys: len(m.Partition(history)), info: info}
	if res == porcupine.Illegal {
		v.Explanation, v.Illegal = explain(m, history, info)
	}
	return v
}

// Visualize writes porcupine's HTML view of the history and its
// linearizations to a new file in the system's temporary directory and
// returns its path.
func (v Verdict) Visualize() (string, error) {
	f, err := os.CreateTemp("", "once-linearize-*.html")
	if err != nil {
		return "", err
	}
	defer f.Close()
	if err := porcupine.Visualize(Model(), v.info, f); err != nil {
		return "", err
	}
	return f.Name(), f.Close()
}

// explain describes the partitions with no full linearization.
func explain(m porcupine.Model, history []porcupine.Operation, info porcupine.LinearizationInfo) (string, []once.Key) {
	parts := m.Partition(history)
	partials := info.PartialLinearizationsOperations()
	var b strings.Builder
	var keys []once.Key
	for i, part := range parts {
		if i >= len(partials) {
			break
		}
		var longest []porcupine.Operation
		for _, p := range partials[i] {
			if len(p) > len(longest) {
				longest = p
			}
		}
		if len(longest) == len(part) {
			continue
		}
		key := part[0].Input.(Input).Key
		keys = append(keys, key)
		fmt.Fprintf(&b, "key %s (%s): no linearization of its %d operations; the longest the model accepts has %d:\n", key, part[0].Input.(Input).Recovery, len(part), len(longest))
		states := m.Init()
		done := map[porcupine.Operation]bool{}
		for i, op := range longest {
			_, states = m.Step(states, op.Input, op.Output)
			done[op] = true
			switch {
			case i < len(longest)-maxLines:
				if i == 0 {
					fmt.Fprintf(&b, "  … %d more\n", len(longest)-maxLines)
				}
			default:
				fmt.Fprintf(&b, "  %s  →  %s\n", line(op), m.DescribeState(states))
			}
		}
		var rest []porcupine.Operation
		for _, op := range part {
			if !done[op] {
				rest = append(rest, op)
			}
		}
		sort.Slice(rest, func(i, j int) bool { return rest[i].Call < rest[j].Call })
		fmt.Fprintf(&b, "  left over, none of which can come next:\n")
		for i, op := range rest {
			if i == maxLines {
				fmt.Fprintf(&b, "  … %d more\n", len(rest)-maxLines)
				break
			}
			fmt.Fprintf(&b, "  %s\n", line(op))
		}
	}
	return b.String(), keys
}

// maxLines bounds each list of operations in an explanation: the end of
// the longest linearization, and the start of what is left over, is
// where it broke.
const maxLines = 40

// line renders an operation with its times in milliseconds.
func line(op porcupine.Operation) string {
	ret := "∞"
	if op.Return != Never {
		ret = fmt.Sprintf("%.1f", float64(op.Return)/1e6)
	}
	s := fmt.Sprintf("[%9.1f, %9s] c%-3d %s", float64(op.Call)/1e6, ret, op.ClientId, describe(op.Input, op.Output))
	if op.Metadata != nil && op.Metadata != "ok" && op.Metadata != "get" && op.Metadata != "claimed" {
		note := fmt.Sprint(op.Metadata)
		if len(note) > 200 {
			note = note[:200] + "…"
		}
		s += "  (" + note + ")"
	}
	return s
}
