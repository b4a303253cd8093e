package protocol_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/oncehq/once/internal/npmlock"

	"github.com/oncehq/once"
)

// clientServer is /v1 over SQLite with kind adv_short on a one-second
// lease that recovery takes over, for the clients' review tests.
func clientServer(t *testing.T) *server {
	return newServer(t, stores(t)["sqlite"](t), once.Config{Kinds: map[string]once.KindPolicy{
		"adv_short": {Lease: time.Second, Recovery: once.RetryWithProviderKey},
	}})
}

func runClientTests(t *testing.T, s *server, dir string, name string, args ...string) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "ONCE_URL="+s.url, "ONCE_TOKEN="+workerToken, "ONCE_OPERATOR_TOKEN="+operatorToken, "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("%s %v: %v", name, args, err)
	}
}

func lookPath(t *testing.T, name string) string {
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not installed; the client cannot be tested", name)
		}
		t.Skipf("%s is not installed", name)
	}
	return p
}

// TestPythonClientAdversary runs clients/python/tests/test_adversary.py
// against a real server.
func TestPythonClientAdversary(t *testing.T) {
	py := lookPath(t, "python3")
	dir, _ := filepath.Abs("../clients/python")
	runClientTests(t, clientServer(t), dir, py, "-m", "unittest", "-v", "tests.test_adversary")
}

// TestTypeScriptClientAdversary runs clients/ts/test/adversary.test.ts
// against a real server.
func TestTypeScriptClientAdversary(t *testing.T) {
	npm := lookPath(t, "npm")
	dir, _ := filepath.Abs("../clients/ts")
	npmlock.Hold(t, dir)
	for _, args := range [][]string{{"ci", "--no-audit", "--no-fund"}, {"run", "build"}} {
		cmd := exec.Command(npm, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm %v: %v\n%s", args, err, out)
		}
	}
	runClientTests(t, clientServer(t), dir, lookPath(t, "node"), "--test", "dist/test/adversary.test.js")
}
