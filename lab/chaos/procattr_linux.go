package chaos

import "syscall"

// childAttr is how the harness starts a worker: killed by the kernel if
// the harness dies first, so no worker outlives a harness that was
// killed.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// guardAttr is how the harness starts a guard (see guardMain): in a
// process group of its own, which the broker it starts shares, and told
// by SIGTERM when the harness dies, so it can kill that group.
func guardAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
