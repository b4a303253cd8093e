//go:build linux

package childproc_test

import (
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/oncehq/once/internal/childproc"
)

// TestChildOutlivesTheThreadThatAskedForIt starts a child with a
// parent-death signal from a goroutine that then ends its thread (it
// returns locked to it, as any library may). Started with cmd.Start
// there, the child is killed with the thread: that is shown first, so
// the test fails if the kernel ever stops doing so. Started with
// childproc.Start, the child lives on.
func TestChildOutlivesTheThreadThatAskedForIt(t *testing.T) {
	from := func(start func(*exec.Cmd) (<-chan error, error)) (*exec.Cmd, <-chan error) {
		cmd := exec.Command("sleep", "60")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		type started struct {
			done <-chan error
			err  error
		}
		ch := make(chan started)
		var s started
		for s.done == nil && s.err == nil {
			go func() {
				runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
				if syscall.Gettid() == os.Getpid() {
					// The runtime keeps its main thread whatever
					// happens; another goroutine is tried.
					runtime.UnlockOSThread()
					ch <- started{}
					return
				}
				done, err := start(cmd)
				ch <- started{done, err}
			}()
			s = <-ch
		}
		if s.err != nil {
			t.Fatal(s.err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); <-s.done })
		return cmd, s.done
	}
	plain := func(cmd *exec.Cmd) (<-chan error, error) {
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait(); close(done) }()
		return done, nil
	}

	_, done := from(plain)
	select {
	case err := <-done:
		if ee, ok := err.(*exec.ExitError); !ok || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("the child started from an ending thread exited with %v; want SIGKILL", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a child started by cmd.Start from a thread that ended still runs: the kernel no longer sends the parent-death signal per thread; reconsider childproc")
	}

	cmd, done := from(childproc.Start)
	select {
	case err := <-done:
		t.Fatalf("the child started with childproc.Start from a thread that ended exited: %v", err)
	case <-time.After(time.Second):
	}
	if err := cmd.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the child is gone: %v", err)
	}
}
