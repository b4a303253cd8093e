// Package childproc starts a child process whose parent-death signal
// means what it says: sent when this process dies, and not before.
//
// Linux sends a child's parent-death signal (SysProcAttr.Pdeathsig)
// when the thread that forked it ends, not the process. The Go runtime
// ends a thread when a goroutine locked to it returns, which any
// library may do; a child forked from an ordinary goroutine's thread
// can be killed at such a moment, hours into a run, while the parent
// is well. PgBouncer died that way in the middle of a test.
package childproc

import (
	"os/exec"
	"runtime"
)

// Start starts cmd on a thread that a goroutine holds until the child
// exits, so the thread that forked it lives as long as the child does.
// The child's exit (cmd.Wait's error) is sent on done, which is then
// closed; the caller must not call cmd.Wait itself. Each child holds
// one thread of its own while it runs.
func Start(cmd *exec.Cmd) (done <-chan error, err error) {
	started := make(chan error, 1)
	exited := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		exited <- cmd.Wait()
		close(exited)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return exited, nil
}
