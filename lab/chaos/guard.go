package chaos

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"syscall"
)

// A broker is started through a guard: this program again, with
// envGuard naming the broker's command. The guard leads a process group
// that the broker and everything it starts (RabbitMQ's shell script
// starts the Erlang VM as a child) belong to, so a restart kills the
// whole group at once. When the harness dies without closing it (killed,
// or a test binary's timeout), the kernel sends the guard SIGTERM, and
// the guard kills its group: no broker is left behind.
const envGuard = "ONCE_CHAOS_GUARD"

// guarded is cmd run through a guard in exe.
func guarded(exe string, cmd *exec.Cmd) *exec.Cmd {
	spec, _ := json.Marshal(append([]string{cmd.Path}, cmd.Args[1:]...))
	env := cmd.Env
	if env == nil {
		env = os.Environ()
	}
	g := exec.Command(exe)
	g.Env = append(slices.Clone(env), envGuard+"="+string(spec))
	g.SysProcAttr = guardAttr()
	return g
}

// guardMain runs the command envGuard names in the guard's own process
// group. SIGTERM (the harness died) kills the group; SIGUSR1 asks for a
// clean shutdown: every process of the group but the guard gets SIGTERM
// (the broker's own signal to shut down), and the guard waits.
func guardMain(stdout, stderr io.Writer) int {
	var argv []string
	if err := json.Unmarshal([]byte(os.Getenv(envGuard)), &argv); err != nil || len(argv) == 0 {
		fmt.Fprintln(stderr, "chaos guard: bad command in "+envGuard)
		return 2
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	clean := make(chan os.Signal, 1)
	signal.Notify(clean, syscall.SIGUSR1)
	cmd := exec.Command(argv[0], argv[1:]...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, envGuard+"=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(stderr, "chaos guard:", err)
		return 1
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			fmt.Fprintln(stderr, "chaos guard:", err)
			return 1
		}
		return 0
	case <-clean:
		// The guard stops listening for SIGTERM, sends it to its whole
		// group, and waits for the broker; the harness kills the group
		// if that takes too long.
		signal.Reset(syscall.SIGTERM)
		signal.Ignore(syscall.SIGTERM)
		syscall.Kill(0, syscall.SIGTERM)
		<-done
		return 0
	case <-stop:
		// The group is this process's: the broker, what it started, and
		// the guard itself.
		syscall.Kill(0, syscall.SIGKILL)
		return 1
	}
}
