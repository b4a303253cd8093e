package agentts_test

import (
	"fmt"
	"os"
	"os/exec"
	"testing"

	"go.uber.org/goleak"

	"github.com/oncehq/once/examples/internal/agentrun"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines leaked:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// TestAgent compiles src/agent.ts (with the client's source, by the
// locked typescript) and runs it, a real Node process, through every
// kill: at each step boundary and at each point inside each of its five
// tool calls, resumed until it finishes, over SQLite and PostgreSQL; each
// email arrives once and the card is charged once. Keyed by the model's
// tool-call id instead, the same kill sends three emails twice and
// charges twice.
func TestAgent(t *testing.T) {
	npm, node := agentrun.Need(t, "npm"), agentrun.Need(t, "node")
	for _, args := range [][]string{{"ci", "--no-audit", "--no-fund"}, {"run", "build"}} {
		cmd := exec.Command(npm, args...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm %v: %v\n%s", args, err, out)
		}
	}
	agentrun.Test(t, agentrun.Agent{
		Dir:     ".",
		Command: []string{node, "dist/examples/agent-ts/src/agent.js"},
		Kinds:   "kinds.json",
	})
}
