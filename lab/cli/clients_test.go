package cli_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestPythonClient runs the Python client's suite (python3 -m unittest,
// clients/python/tests) against `once serve` over each store: a real
// server, a real Python process.
func TestPythonClient(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("python3 is not installed; the Python client cannot be tested")
		}
		t.Skip("python3 is not installed")
	}
	dir, err := filepath.Abs("../../clients/python")
	if err != nil {
		t.Fatal(err)
	}
	for name, newDB := range databases(t) {
		t.Run(name, func(t *testing.T) {
			db := newDB(t)
			mustRun(t, "migrate", "--db", db)
			const worker, operator = "python-worker-token-0123456789", "python-operator-token-0123456789"
			tokens := func(name, tok string) string {
				f := filepath.Join(t.TempDir(), name)
				if err := os.WriteFile(f, []byte(tok+"\n"), 0o600); err != nil {
					t.Fatal(err)
				}
				return f
			}
			base, _, _, stop := startServe(t, "--addr", "127.0.0.1:0", "--reap-every", "0", "--db", db,
				"--worker-tokens-file", tokens("workers", worker), "--operator-tokens-file", tokens("operators", operator))
			cmd := exec.Command(py, "-m", "unittest", "discover", "-v", "-s", "tests", "-t", ".")
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "ONCE_URL="+base, "ONCE_TOKEN="+worker, "ONCE_OPERATOR_TOKEN="+operator, "PYTHONDONTWRITEBYTECODE=1")
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("python3 -m unittest: %v\n%s", err, out)
			}
			t.Logf("%s", out)
			if code := stop(); code != 0 {
				t.Fatalf("serve exited %d", code)
			}
		})
	}
}
