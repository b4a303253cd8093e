//go:build !linux

package chaos

import "syscall"

// childAttr is how the harness starts a worker. Only Linux can have the
// kernel end the children of a harness that died; elsewhere they are
// ended by the harness as it closes.
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }

// guardAttr is how the harness starts a guard: in a process group of its
// own, which the broker it starts shares.
func guardAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
