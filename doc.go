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
// # Outcomes
//
// What an effect in Do returns decides what is recorded:
//   - nil error: succeeded, the value is stored (it must encode as JSON);
//   - RetryLater(err): the effect did not happen; the claim is released
//     and the error returned, so the job goes back to its queue;
//   - Permanent(err): the effect did not happen and never will; stored as
//     failed, a *FailedError to this caller and every duplicate;
//   - any other error, a panic, or a timeout: the outcome is unknown, and
//     the kind's recovery decides (below). A panic goes on up the stack
//     once recorded; the third attempt of one action to panic is put up
//     for review under RetryWithProviderKey too, since another would most
//     likely panic again.
//
// A cancellation the effect returns as a plain error is an unknown
// outcome like any other: on a graceful shutdown, an effect that knows it
// sent nothing should return RetryLater(ctx.Err()), so the next delivery
// runs it.
//
// Do returns the effect's value together with an error when the effect
// ran but its outcome could not be stored as it happened. The value is
// real: act on it, but do not run the effect again.
//   - *RecordError (ErrNotRecorded): the database was unreachable for
//     Config.RecordTimeout; the claim stays in flight and recovery decides
//     when its lease runs out.
//   - *FencedError (ErrFenced): the attempt was superseded while it ran
//     (its lease lapsed and recovery moved on); the trail shows the late
//     outcome beside the decision.
//   - ErrResultTooLarge or ErrResultNotJSON: the effect happened but its
//     value cannot be stored; the action was put up for review.
//
// An attempt held by hand (Client.Claim, or Client.Attempt in a process
// that did not claim it) is settled with Succeed, Fail, Release or
// Unknown, which record the same outcomes through the same write.
//
// # Waiting
//
// With WaitFor(d), a caller that meets a live claim waits up to d for
// that attempt's outcome: its result replayed, its permanent failure, or,
// when it was released, a claim of the caller's own. Wait where someone
// waits for the answer itself and nobody will bring the job back: an HTTP
// handler (idemhttp.Config.Wait), an agent's tool call. A queue worker
// should rarely wait long: it holds a delivery (and the broker's ack
// timer runs) while a redelivery after the lease would serve as well; a
// short wait, well under its ack wait, spares a round trip through the
// queue when duplicates arrive together.
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
