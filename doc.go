// Package once makes external side effects — an email, a charge, a posted
// message — happen exactly once on top of queues that deliver at least
// once.
//
// A worker that performs an effect and dies before recording it is handed
// the same job again, and does the effect again. "Check, then send"
// cannot fix that: two workers pass the check, and one worker can die
// between the send and the record. once absorbs the duplicate instead:
//
//  1. The caller describes the effect as an Intent (run, step, kind,
//     target, payload). Its Key is a pure function of the intent, so the
//     redelivered job computes the same key.
//  2. Do claims the key with one atomic insert that the database
//     arbitrates: exactly one caller wins, across goroutines, processes
//     and machines.
//  3. The winner runs the effect and stores its result; every duplicate
//     gets the stored result back (Result.Replayed) without running it.
//     One that comes while the effect still runs gets *InFlightError,
//     or, made with WaitFor, waits for the result.
//  4. A claim whose worker died stays in flight: it is never re-executed
//     by guesswork. Its lease, kept alive by a heartbeat while the effect
//     runs and measured by the database's clock, tells recovery when the
//     worker is gone. The lease is written a fifth longer than the kind's
//     Lease, and a worker that cannot renew it stops its effect a fifth
//     short of it, so two attempts never overlap.
//
// Every write after the claim is fenced by the attempt number, so a
// worker presumed dead can never overwrite a newer attempt, and carries a
// random token, so a writer whose reply was lost reads the row back and
// knows whether its write applied. Dispose tells a worker, for every
// error Do returns, whether to ack its job, retry it, or drop it.
//
// # When the outcome is unknown
//
// A claim whose lease lapsed, or an effect that returned an unclassified
// error (or panicked), has an unknown outcome. Each kind of action names
// its recovery in its KindPolicy: AskPerson (the default: put it up for
// review and never re-execute, the honest answer for plain SMTP),
// RetryWithProviderKey (release it, and re-execute with the same
// Attempt.ProviderKey; the provider absorbs the duplicate), or
// VerifyThenDecide (a Verifier asks the provider whether it landed). Do
// applies it inline when it meets a lapsed claim; a Reaper applies it to
// the ones nobody comes back for, and hands released actions that no
// delivery claimed to the kind's Redrive hook. Each action records its
// kind's recovery and retention when it is claimed, so every process that
// recovers or purges it applies what the application configured; only a
// process that holds a kind's verifier decides its VerifyThenDecide
// actions. A person's decision is recorded with Client.Resolve (fenced to
// the attempt the person looked at, Resolution.Attempt), and every
// transition is appended to the action's trail (Client.Events). A slow
// worker's success or permanent failure is still recorded after recovery
// or a person decided, as long as no newer attempt claimed the action.
//
// # Statuses
//
// An action is in_flight while an attempt holds its claim, then
// succeeded, failed (never retried) or released (the next attempt may
// claim it); review when a person must decide. StatusUnknown occurs only
// under VerifyThenDecide: an unclassified error waits there for the
// verifier, where the other recoveries record review or released at
// once. docs/state_machine.md in the repository lists every transition,
// who makes it and what it writes to the trail.
//
// # Keys
//
// The key is the lowercase hex SHA-256 of the fields "once.key.v2", Run,
// Step (in decimal), Kind, Target and either the payload fingerprint (with
// PayloadInKey) or an empty field, each written as an 8-byte big-endian
// length followed by its bytes. The fingerprint is the SHA-256 of
// "once.payload.v2", the payload's tag ("raw" or "json") and the canonical
// payload, encoded the same way. The canonical payload is a []byte as
// given, or else JSON in the canonical form of RFC 8785. KEYS.md in the
// repository specifies it all, with test vectors; `once key` prints both,
// so programs in other languages can check theirs.
//
// # Stores
//
// A Store is only SQL; the rules live here. The postgres package is the
// store for many machines, the sqlite package the embedded default, and
// storetest the conformance suite both pass.
package once
