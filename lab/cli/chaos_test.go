package cli_test

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestChaosRefusesWhatItCannotRun: a run the harness cannot carry out
// is one line saying why, before anything starts. (The runs themselves
// are tested in lab/chaos.)
func TestChaosRefusesWhatItCannotRun(t *testing.T) {
	sqlite := filepath.Join(t.TempDir(), "once.db")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"chaos"}, "--queue is required"},
		{[]string{"chaos", "--queue", "kafka", "--db", "postgres://u@127.0.0.1/db"}, `--queue must be nats or rabbitmq, not "kafka"`},
		{[]string{"chaos", "--queue", "nats", "--db", sqlite}, "the database must be PostgreSQL"},
		{[]string{"chaos", "--queue", "nats", "--db", "postgres://u@127.0.0.1/db", "--intents", "2"}, "intents must be between 3 and"},
		{[]string{"chaos", "--queue", "nats", "--db", "postgres://u@127.0.0.1/db?once_schema=mine"}, "leave once_schema and once_prefix out"},
		{[]string{"chaos", "--queue", "rabbitmq", "--db", "postgres://u@127.0.0.1/db", "--smtp", "nowhere"}, `the SMTP server "nowhere" is not HOST:PORT`},
		{[]string{"chaos", "--queue", "nats", "--db", "postgres://u@127.0.0.1/db", "--faults", "broker"}, `"broker" is not TYPE=N (for example broker=300)`},
		{[]string{"chaos", "--queue", "nats", "--db", "postgres://u@127.0.0.1/db", "--faults", "reboot=3"}, `no fault type "reboot"; the types are kill, stop, conn, proxy, provider_timeout, broker, failover`},
		{[]string{"chaos", "--queue", "nats", "--db", "postgres://u@127.0.0.1/db", "--faults", "stop=-1"}, "the count of stop faults must be between 0 and 100000, not -1"},
		{[]string{"chaos", "--queue", "nats", "--db", "postgres://u@127.0.0.1/db", "--faults", "failover=2"}, "failovers need the HA cluster (--ha)"},
		{[]string{"chaos", "--queue", "nats", "--ha", "--ha-async"}, "--ha and --ha-async are two clusters; choose one"},
		{[]string{"chaos", "--queue", "nats", "--db", "postgres://u@127.0.0.1/db", "--fault-scale", "101"}, "the fault scale must be between 0 and 100, not 101"},
		{[]string{"chaos", "--queue", "nats", "--db", "postgres://u@127.0.0.1/db", "--fault-scale", "NaN"}, "the fault scale must be between 0 and 100, not NaN"},
		{[]string{"chaos", "--queue", "nats", "--db", "postgres://u@127.0.0.1/db", "--fault-scale", "Inf"}, "the fault scale must be between 0 and 100, not +Inf"},
		{[]string{"chaos", "--queue", "nats", "--db", "postgres://u@127.0.0.1/db", "--fault-scale", "-Inf"}, "the fault scale must be between 0 and 100, not -Inf"},
	} {
		code, _, stderr := run(t, tc.args...)
		if code == 0 || !strings.Contains(stderr, tc.want) || strings.Count(strings.TrimSpace(stderr), "\n") > 1 {
			t.Errorf("once %s: exit %d, stderr %q; want a failure saying %q in a line or two", strings.Join(tc.args, " "), code, stderr, tc.want)
		}
		if strings.Contains(stderr, "chaos: chaos:") {
			t.Errorf("once %s: %q repeats the command's name", strings.Join(tc.args, " "), stderr)
		}
	}
}
