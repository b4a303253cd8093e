// Package bench is the harness behind `once bench`: what once costs over
// the least a hand-written record of an effect needs, measured side by
// side in one run, on one PostgreSQL database through one pool.
//
// Each arm is a way of doing the same action, recording that an effect
// ran and its result, under a new key:
//
//   - raw: the seed's two statements by hand, on a table with only a
//     key, a status, a result and two times: INSERT … ON CONFLICT (key)
//     DO NOTHING, then UPDATE … SET status = 'succeeded'; two commits.
//   - raw_batched: the same for 64 keys at a time, in two statements over
//     arrays: two commits per 64 actions.
//   - do_unbatched and do: once.Do on the PostgreSQL store, with a no-op
//     effect returning a small result (see newOnceStore).
//   - replay_raw and replay_do: the same key again once it succeeded,
//     read by hand or answered by Do, over keys the run finished first.
//   - sqlite_raw, sqlite_do_unbatched and sqlite_do: raw, and Do on the
//     sqlite store with group commit off and as configured by default
//     (group commit), on SQLite files opened with the store's pragmas.
//   - protocol, replay_protocol and sqlite_protocol: do's, replay_do's
//     and sqlite_do's action over the protocol (/v1) instead of a call:
//     net/http's client posts claim (and, for a new key, outcome) to the
//     protocol's handler, served in the same process on a loopback port
//     over the client the Do arm uses. Their ratio over that arm is what
//     the HTTP hop costs.
//
// At each worker count the arms run in rounds, each for the same time
// with that many goroutines, in an order rotated by one every round, so
// none always runs first or last; comparisons are medians of per-round
// ratios, so a round in which the machine was busy for everyone weighs
// like any other. docs/bench.md describes the method and what each
// figure means.
//
// It is part of the lab module (github.com/oncehq/once/lab): the project's
// harnesses and tools, not a stable API; it may change in any release.
package bench
