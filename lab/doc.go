// Package lab names the module that holds the project's own harnesses and
// tools: the chaos harness and its failover cluster (chaos, chaos/ha),
// the benchmark (bench), the demo (demo), the linearizability checker
// (linearize), a loopback SMTP server (mailbox), a payment provider
// (provider), and the once command's package (cli).
//
// The lab is not a stable API: its packages serve the once command, the
// examples and the project's tests, and may change in any release. It is
// a module of its own, so that its dependencies (the broker clients and
// the history checker) stay out of the core module's graph.
package lab
