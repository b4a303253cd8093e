package cli

import (
	"os/exec"
	"syscall"
)

// diesWithGateway makes the upstream command die with the gateway. A
// gateway that is killed leaves its calls in flight for recovery to
// decide; an upstream that finished such a call after recovery had
// decided (its verifier found no trace, and the call was sent again)
// would land it twice. The kernel kills the child when the thread that
// started it ends; the Go runtime ends a thread only when a goroutine
// locked to it exits still locked, which nothing in once mcp does.
func diesWithGateway(c *exec.Cmd) {
	c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
