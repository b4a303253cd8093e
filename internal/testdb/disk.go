package testdb

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// The disk-full tests fill a real file system: a small tmpfs of their
// own, mounted for the test, which a filler file beside the database
// fills to the last byte and frees again.

// SmallDisk mounts a tmpfs of size (as mount's size option: "1M") for t
// and returns its directory, unmounted at t's end, when whatever held
// it open (a server's processes) has let go. It skips t when it is not
// root or cannot mount.
func SmallDisk(t testing.TB, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("not root: the disk-full tests mount a small tmpfs to fill a real file system")
	}
	dir, err := os.MkdirTemp("", "once-df-")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		os.Remove(dir)
		t.Skipf("cannot mount a tmpfs at %s, which the disk-full tests fill: %v: %s", dir, err, out)
	}
	t.Cleanup(func() {
		var out []byte
		var err error
		for range 50 {
			if out, err = exec.Command("umount", dir).CombinedOutput(); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
			return
		}
		os.Remove(dir)
	})
	return dir
}

// FillDisk appends to the file at path until its file system is full,
// to the last byte.
func FillDisk(t testing.TB, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<16)
	for _, n := range []int{1 << 16, 4096, 1} {
		for {
			if _, err := f.Write(buf[:n]); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatal(err)
				}
				break
			}
		}
	}
}

// FreeBytes is what the file system holding dir has free.
func FreeBytes(t testing.TB, dir string) uint64 {
	t.Helper()
	var fs syscall.Statfs_t
	if err := syscall.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	return fs.Bavail * uint64(fs.Bsize)
}
