//go:build !(linux || darwin || freebsd)

package sqlite

// diskFree cannot tell on this system.
func diskFree(string) (uint64, bool) { return 0, false }
