package cli_test

import (
	"os"
	"path/filepath"
	"testing"
)

// Kinds the clients' suites find pinned on the server they run against
// (clientSuite), named to them in ONCE_VERIFIED_KIND and
// ONCE_PINNED_KIND: one verified by a client verifier, whose dead
// claims a duplicate's claim recovers inline (the server's reaper is
// off), and one pinned with a lease of its own.
const (
	clientVerifiedKind = "client_verified_email"
	clientPinnedKind   = "client_pinned_charge"
)

const clientKindsFile = `{
  "kinds": {
    "client_verified_email": {"lease": "1s", "max_execution": "10s", "recovery": "verify_then_decide", "verifier": "client",
                              "verify_backoff": "1s", "max_verify_failures": 5},
    "client_pinned_charge": {"lease": "2s", "recovery": "retry_with_provider_key"}
  }
}`

// clientKinds writes the clients' kinds file and returns its path and
// the environment that names its kinds to a client's suite.
func clientKinds(t *testing.T) (file string, env []string) {
	t.Helper()
	file = filepath.Join(t.TempDir(), "kinds.json")
	if err := os.WriteFile(file, []byte(clientKindsFile), 0o600); err != nil {
		t.Fatal(err)
	}
	return file, []string{"ONCE_VERIFIED_KIND=" + clientVerifiedKind, "ONCE_PINNED_KIND=" + clientPinnedKind}
}
