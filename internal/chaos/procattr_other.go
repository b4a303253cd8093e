//go:build !linux

package chaos

import "syscall"

// childAttr is how the harness starts a child: in a process group of its
// own when group is set. Only Linux can have the kernel kill the
// children of a harness that died; elsewhere they are ended by Close.
func childAttr(group bool) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: group}
}
