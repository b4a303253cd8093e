// Command once is the operator's tool for the once library: the demo, the
// schema, keys, the action log, review and resolution, the reaper, purge,
// and the web console. `once help` lists the commands.
package main

import (
	"os"

	"github.com/oncehq/once/lab/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
