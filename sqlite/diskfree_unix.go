//go:build linux || darwin || freebsd

package sqlite

import "syscall"

// diskFree returns the bytes the file system holding dir has free for
// an unprivileged process, and whether it could tell.
func diskFree(dir string) (uint64, bool) {
	var fs syscall.Statfs_t
	if err := syscall.Statfs(dir, &fs); err != nil {
		return 0, false
	}
	return uint64(fs.Bavail) * uint64(fs.Bsize), true
}
