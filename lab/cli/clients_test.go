package cli_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/oncehq/once/internal/npmlock"
)

// clientSuite runs a client's suite, cmd in dir, against `once serve`
// over each store, with the server's address, tokens and pinned kinds
// (clientKinds) in its environment.
func clientSuite(t *testing.T, dir string, name string, args ...string) {
	for store, newDB := range databases(t) {
		t.Run(store, func(t *testing.T) {
			db := newDB(t)
			mustRun(t, "migrate", "--db", db)
			const worker, operator = "client-worker-token-0123456789", "client-operator-token-0123456789"
			tokens := func(name, tok string) string {
				f := filepath.Join(t.TempDir(), name)
				if err := os.WriteFile(f, []byte(tok+"\n"), 0o600); err != nil {
					t.Fatal(err)
				}
				return f
			}
			kinds, kindsEnv := clientKinds(t)
			base, _, _, stop := startServe(t, "--addr", "127.0.0.1:0", "--reap-every", "0", "--db", db, "--kinds", kinds,
				"--worker-tokens-file", tokens("workers", worker), "--operator-tokens-file", tokens("operators", operator))
			cmd := exec.Command(name, args...)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "ONCE_URL="+base, "ONCE_TOKEN="+worker, "ONCE_OPERATOR_TOKEN="+operator, "PYTHONDONTWRITEBYTECODE=1")
			cmd.Env = append(cmd.Env, kindsEnv...)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s %v: %v\n%s", name, args, err, out)
			}
			t.Logf("%s", out)
			if code := stop(); code != 0 {
				t.Fatalf("serve exited %d", code)
			}
		})
	}
}

// need finds a program the test runs, failing under CI without it.
func need(t *testing.T, name string) string {
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not installed; the client cannot be tested", name)
		}
		t.Skipf("%s is not installed", name)
	}
	return p
}

// TestTypeScriptClient runs the TypeScript client's suite (node:test,
// clients/ts/test, compiled with the locked typescript) against `once
// serve` over each store.
func TestTypeScriptClient(t *testing.T) {
	npm := need(t, "npm")
	dir, err := filepath.Abs("../../clients/ts")
	if err != nil {
		t.Fatal(err)
	}
	npmCI(t, npm, dir)
	clientSuite(t, dir, npm, "test")
}

// TestPythonClient runs the Python client's suite (python3 -m unittest,
// clients/python/tests) against `once serve` over each store: a real
// server, a real Python process.
func TestPythonClient(t *testing.T) {
	py := need(t, "python3")
	dir, err := filepath.Abs("../../clients/python")
	if err != nil {
		t.Fatal(err)
	}
	clientSuite(t, dir, py, "-m", "unittest", "discover", "-v", "-s", "tests", "-t", ".")
}

// npmCI installs the npm project in dir from its lock file, and holds
// it for the rest of t (npmlock): npm ci empties node_modules first.
func npmCI(t *testing.T, npm, dir string) {
	t.Helper()
	npmlock.Hold(t, dir)
	ci := exec.Command(npm, "ci", "--no-audit", "--no-fund")
	ci.Dir = dir
	if out, err := ci.CombinedOutput(); err != nil {
		t.Fatalf("npm ci: %v\n%s", err, out)
	}
}
