// Package npmlock serialises the tests that install and run one npm
// project. `npm ci` deletes node_modules before it installs, and go
// test runs packages in parallel: a test in one package running node
// from clients/ts while a test in another runs `npm ci` there fails for
// no fault of the code under test.
package npmlock

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// Hold takes the project in dir for the rest of t: it waits for any
// other test process holding it, and lets go when t ends. The lock is
// a file in the temporary directory named by dir's absolute path, so
// every checkout has its own.
func Hold(t testing.TB, dir string) {
	t.Helper()
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(abs))
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "once-npm-"+hex.EncodeToString(sum[:8])+".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		t.Fatalf("lock the npm project %s: %v", abs, err)
	}
	t.Cleanup(func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	})
}
