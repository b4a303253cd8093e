package ha

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// freeSharedMemory removes the System V shared memory segment of a
// PostgreSQL that was killed. A postmaster removes its own when it
// stops; a killed one leaves it, and its postmaster.pid, behind. The
// segment is removed only if its key is still the one postmaster.pid
// names, so a segment that is not PostgreSQL's from pgdata is never
// touched. Removal waits for the last process to detach, so it is safe
// while killed processes are still going.
func freeSharedMemory(pgdata string) error {
	data, err := os.ReadFile(filepath.Join(pgdata, "postmaster.pid"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	// Line 7 is "key id", each padded.
	lines := strings.Split(string(data), "\n")
	if len(lines) < 7 {
		return nil
	}
	fields := strings.Fields(lines[6])
	if len(fields) != 2 {
		return nil
	}
	key, err1 := strconv.ParseInt(fields[0], 10, 64)
	id, err2 := strconv.Atoi(fields[1])
	if err1 != nil || err2 != nil {
		return nil
	}
	var desc unix.SysvShmDesc
	if _, err := unix.SysvShmCtl(id, unix.IPC_STAT, &desc); err != nil {
		return nil // gone already
	}
	if int64(desc.Perm.Key) != key {
		return nil
	}
	if _, err := unix.SysvShmCtl(id, unix.IPC_RMID, nil); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.EIDRM) {
		return fmt.Errorf("removing the shared memory of %s (id %d): %w", pgdata, id, err)
	}
	return nil
}
