package once

import (
	"strings"
	"testing"
)

// A result nests at most MaxResultDepth deep; brackets inside strings,
// escaped quotes included, do not count.
func TestResultDepth(t *testing.T) {
	nest := func(n int, inner string) string {
		return strings.Repeat(`{"a":[`, n/2) + strings.Repeat("[", n%2) + inner + strings.Repeat("]", n%2) + strings.Repeat("]}", n/2)
	}
	for _, tc := range []struct {
		raw  string
		deep bool
	}{
		{nest(MaxResultDepth, "1"), false},
		{nest(MaxResultDepth+1, "1"), true},
		{nest(MaxResultDepth, `"[[{{\"[{"`), false},
		{`["` + strings.Repeat("[", 2*MaxResultDepth) + `"]`, false},
		{`"\\"`, false},
		{`[1,[2,[3]],{"k":{"j":[]}}]`, false},
	} {
		why := resultProblem([]byte(tc.raw))
		if deep := strings.Contains(why, "nests deeper"); deep != tc.deep || !deep && why != "" {
			t.Errorf("resultProblem(%.40s…) = %q, want deep %v", tc.raw, why, tc.deep)
		}
	}
}
