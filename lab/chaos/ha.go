package chaos

import "context"

// Failover is a PostgreSQL whose primary can be killed mid-run, with a
// standby that takes over: what --ha runs the ledger on. The harness
// reaches it only through URL, a multi-host URL with
// target_session_attrs=read-write, so workers and the harness find the
// new primary the way an application would.
type Failover interface {
	// URL is the cluster's multi-host connection URL.
	URL() string
	// KillPrimary kills the primary's node (its whole process group) so
	// the standby is promoted. It may return before the promotion.
	KillPrimary(ctx context.Context) error
	// Close stops the cluster and removes what it made.
	Close() error
}

// StartFailover starts a Failover cluster with its state under dir (the
// run's directory). Options.HA takes one; the command's --ha is wired to
// the implementation the build includes.
type StartFailover func(ctx context.Context, dir string) (Failover, error)
