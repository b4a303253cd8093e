package chaos_test

import (
	"context"
	"fmt"
	"os"

	"github.com/oncehq/once/lab/chaos"
)

// A run of the harness from a program of one's own: it must hand control
// to WorkerMain first, since the workers are the program started again.
// It needs PostgreSQL and nats-server on the machine, so it is not run
// as a test.
func ExampleRun() {
	if chaos.IsWorker() {
		os.Exit(chaos.WorkerMain(os.Stderr))
	}
	rep, err := chaos.Run(context.Background(), chaos.Options{
		DB:      "postgres://postgres@127.0.0.1:5432/test",
		Queue:   chaos.QueueNATS,
		Intents: 300,
	})
	if err != nil {
		fmt.Println("the run could not be carried out:", err)
		return
	}
	rep.WriteText(os.Stdout)
	if !rep.OK() {
		os.Exit(1)
	}
}
