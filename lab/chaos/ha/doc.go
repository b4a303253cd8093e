// Package ha runs a PostgreSQL cluster that fails over, on loopback, for
// the chaos harness's --ha mode: a pg_auto_failover monitor and two nodes,
// a primary and a standby, that the harness can kill and bring back.
//
// Start sets it up in a run directory of its own; URL is a multi-host URL
// with target_session_attrs=read-write, so a client (pgx) reconnects to
// whichever node is primary now; KillPrimary kills the primary's whole
// process group with SIGKILL, as a crashed machine would stop, and returns
// once a write commits through URL on the promoted standby; RestartNode
// brings the killed node back as the new standby; Close stops everything
// and removes the run directory.
//
// # What the guarantee needs from the database
//
// once's claim is a row the database committed. A claim the database
// acknowledged and then lost is a claim nobody holds: the job is
// redelivered, a second worker claims the same key, wins, and runs the
// effect again, a duplicate the ledger cannot see. Across a failover a
// committed row survives only if the standby that is promoted had it
// before the commit was acknowledged, so the primary must run with
//
//   - synchronous_standby_names naming the standby that can be promoted.
//     pg_auto_failover sets it with ALTER SYSTEM, "ANY 1
//     (pgautofailover_standby_2)", for a standby registered with
//     replication-quorum true (the default, and Config.Sync), and empties
//     it for one registered with false.
//   - synchronous_commit = on (or remote_apply): a commit is acknowledged
//     only once the standby has flushed it. It is the server's default,
//     and pg_auto_failover writes it into postgresql-auto-failover.conf,
//     which a later line of postgresql.conf can still override.
//     remote_write waits only for the standby's operating system, not its
//     disk: it survives a killed process, not a lost machine. local and
//     off do not wait for the standby at all and void the guarantee, and
//     so does a session or transaction that sets synchronous_commit lower
//     for itself: the store must not.
//
// With an asynchronous standby (Config.Sync false: replication-quorum
// false, synchronous_standby_names empty) a commit is acknowledged as soon
// as the primary has it. When the primary dies, the last commits it
// acknowledged may not have reached the standby, which is promoted without
// them: a claim, a recorded success, a person's decision can be gone. The
// package's test writes through a failover both ways, four writers on
// loopback: with the synchronous standby no acknowledged row was ever
// lost; with the asynchronous one, runs on a loaded two-core machine lost
// 16 and 51 of about 650 acknowledged rows, the ones committed in the
// standby's lag before the kill. How many depends on that lag at that
// moment, so the test reports the number and asserts nothing about it.
//
// Two things pg_auto_failover does on its own are consistent with the
// guarantee. When the standby is down, the primary goes to wait_primary
// and stops waiting for it (writes go on, on one node); a standby that has
// not caught up is not promoted, so what was acknowledged meanwhile is not
// lost by a failover, which waits for the standby to rejoin instead. And
// a commit whose reply is lost in the failover (the client sees an error)
// may or may not have been written: the ambiguity once treats as an
// unknown outcome.
//
// # What it needs from the machine
//
// Debian's postgresql-15-auto-failover package (pg_autoctl, at
// /usr/bin/pg_autoctl), which scripts/ha-setup.sh installs when it is
// missing, and PostgreSQL's initdb and pg_ctl. pg_autoctl refuses to run
// as root, so a root process runs it, and PostgreSQL, as Config.RunAs
// (the postgres user). Everything else stays in the run directory:
// pg_autoctl's configuration and state (XDG_CONFIG_HOME, XDG_DATA_HOME,
// XDG_RUNTIME_DIR), the data directories, the Unix sockets, each
// process's log. The servers listen on 127.0.0.1 only, on free ports
// below 32768 (never 5432), with trust authentication: a test fixture,
// not a deployment.
//
// The monitor is tuned to fail over fast: it checks each node's health
// every second and considers a node unhealthy, and a primary that does
// not answer demoted, after 3 s (pg_auto_failover's defaults, 20 s and
// 30 s, make a failover take about 50 s). Writes through URL resume 6 to
// 8 s after the primary's node is killed (5 to 7 s on an idle machine,
// up to 10 s on a loaded one): about 1 s to see the node fail, 3 s
// giving the old primary time to demote itself (it could be alive and
// only cut off: two primaries would split the ledger), the promotion,
// and the clients' reconnection.
//
// A process that exits without Close leaves the cluster running: its
// processes are in process groups of their own, not the caller's, and
// their command lines name the run directory (Cluster.Dir).
//
// It is part of the lab module (github.com/oncehq/once/lab): the project's
// harnesses and tools, not a stable API; it may change in any release.
package ha
