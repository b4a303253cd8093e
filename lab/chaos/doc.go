// Package chaos is the harness behind `once chaos`: it runs once over a
// real at-least-once queue, against real providers, in worker processes
// it kills, pauses and cuts off, and shows with numbers that no intent is
// applied twice and none is silently lost — and, with the naive "check,
// then send" worker in the same harness, that it can see a duplicate.
//
// # What runs
//
// Run starts, all on loopback:
//
//   - a broker of the run's own: a private nats-server with JetStream
//     (file storage, explicit acks, a 3s AckWait) or a private RabbitMQ
//     node (its own node name, ports, data and cookie), so a restart
//     never touches the machine's shared broker. One job per intent goes
//     through a stream or work queue with a unique name, through the
//     natsjs and rabbitmq adapters, and the reaper re-drives released
//     actions through their Redrive hooks.
//   - three providers that count what they really applied, per intent:
//     an SMTP server (the harness's lab/mailbox, or --smtp's)
//     behind a tap that reads the conversation; a payment provider that
//     honours Idempotency-Key as Stripe does; a post provider with no
//     idempotency that answers GET /v1/posts/{key}, "did it land?".
//     Each intent of the email kind has its own recipient.
//   - the ledger in a PostgreSQL schema of its own (once_chaos_…),
//     dropped at the end unless Keep, with a fault proxy in front of each
//     host for the workers.
//   - worker processes (this program again, see IsWorker and
//     WorkerMain), each running jobs through once.Do with one recovery
//     per kind: email AskPerson, charge RetryWithProviderKey (the
//     provider key in idemhttp.Transport), post VerifyThenDecide.
//   - a once.Reaper in the harness (it holds the verifier and the
//     re-drive hook), and, at the end, the operator.
//
// # Faults
//
// Drawn from the seed, so a run's faults are reproducible (the timing of
// real processes is not): which intents' first application is followed
// by a SIGKILL of the worker that made it, between the effect and its
// record, or by a reply withheld past the worker's timeout (the
// ambiguous case); and a schedule that fires, as the settled intents
// pass random points between 5% and 85%, random SIGKILLs, SIGSTOP/SIGCONT
// pauses of twice the lease (zombies whose messages are redelivered),
// pg_terminate_backend of one worker's or every worker's connections
// (found by application_name), cuts and black holes of every connection
// through the proxy, broker restarts (SIGKILL and start again), and with
// HA a kill of the database's primary. Each is counted when it happened.
//
// # The end, and the invariants
//
// When every intent is settled and the schedule has run, the faults
// stop, and the operator resolves each action in review as a person
// would: done when the provider's count shows it applied, retry when it
// does not (the re-drive then runs it). The run waits for every intent
// to succeed, stops the workers, and checks per kind: no intent applied
// twice, none lost (applied exactly once, or surfaced in review and
// then resolved), and the ledger agrees with the providers (succeeded
// means applied exactly once).
//
// It is part of the lab module (github.com/oncehq/once/lab): the project's
// harnesses and tools, not a stable API; it may change in any release.
package chaos
