package chaos

import "syscall"

// childAttr is how the harness starts a child: in a process group of its
// own when group is set (a broker and whatever it starts), and killed by
// the kernel if the harness dies first, so no worker or broker outlives
// a harness that was killed.
func childAttr(group bool) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: group, Pdeathsig: syscall.SIGKILL}
}
