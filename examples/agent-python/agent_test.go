package agentpython_test

import (
	"fmt"
	"os"
	"path/filepath"
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

// TestAgent runs agent.py, a real Python process, through every kill:
// at each step boundary and at each point inside each of its five tool
// calls, resumed until it finishes, over SQLite and PostgreSQL; each
// email arrives once and the card is charged once. Keyed by the model's
// tool-call id instead, the same kill sends three emails twice and
// charges twice.
func TestAgent(t *testing.T) {
	py := agentrun.Need(t, "python3")
	client, err := filepath.Abs("../../clients/python")
	if err != nil {
		t.Fatal(err)
	}
	agentrun.Test(t, agentrun.Agent{
		Dir:     ".",
		Command: []string{py, "agent.py"},
		Env:     []string{"PYTHONPATH=" + client, "PYTHONDONTWRITEBYTECODE=1"},
		Kinds:   "kinds.json",
	})
}
