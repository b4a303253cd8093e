// Package riverjob runs once's effects from River jobs (River v0.51, the
// riverpgxv5 driver), on the same PostgreSQL as once's postgres store.
//
// River delivers a job at least once: a worker that dies, times out or
// is rescued hands the job to another, and two inserts of the same work
// are two jobs. A Worker absorbs both: its Intent turns the job's args
// into the intent, once.Do runs the effect at most once per intent, and
// Dispose maps what Do returned onto what River does with the job:
//
//	once.Dispose                 River
//	ack (done or replayed)       nil: completed
//	ack (failed for good)        river.JobCancel: cancelled, never retried
//	retry with After > 0         river.JobSnooze(After): back after After,
//	                             without using up an attempt
//	retry with After == 0        the error: retried with River's backoff,
//	                             counted against MaxAttempts
//	drop (a person decides)      river.JobCancel: cancelled
//
// Another attempt holding the claim (an *once.InFlightError) snoozes the
// job until the claim's lease runs out (the kind's Lease and a fifth, at
// most), even when that attempt finishes sooner: the snoozed job then
// replays. River v0.51 stores a snoozed job with its attempt number
// lowered by one, so a snooze never brings the job closer to being
// discarded; see river.JobSnooze.
//
// A job whose action awaits a person's approval
// (*once.AwaitingApprovalError) is not run. On a kind without a Redrive
// hook it is snoozed, a minute at a time (just past the wait's expiry
// when that comes sooner), until a person decides: the first run after
// an approval runs the effect, and the first after the wait expired
// cancels the job. A snooze uses no attempt, so MaxAttempts never ends
// the wait; the wait itself (ApprovalPolicy.Expiry, 24 hours by default)
// bounds it, at about one run a minute. On a kind with a Redrive hook the job is
// cancelled at once, and once the action is approved the reaper inserts
// a job for it (Redrive). A rejected action fails, and its jobs are
// cancelled.
//
// # Effects that are writes to the same database
//
// When the effect is a write to the database River and once live in,
// WorkerConfig.EffectTx (or DoTx in a worker of your own) runs it in one
// transaction with once's record and River's completion of the job
// (river.JobCompleteTx), so the three commit or roll back together: a
// failed effect leaves nothing behind and River retries the job, and a
// duplicate job replays the stored result without writing twice.
//
// # Re-drive
//
// A released action runs only when its job is delivered again. When
// River no longer will — a person chose Retry for an action whose job was
// cancelled for review, the job ran out of attempts, or its worker died
// and River's rescuer is an hour away — the reaper hands
// the action to its kind's Redrive hook. Redrive builds that hook: it
// inserts a job rebuilt from the action, marked with the action's key and
// attempt (embed Redriven in the args) so that River's unique options
// insert one job per released attempt however often the hook is called.
//
// The wiring is circular: the once client's Redrive hook needs a River
// client to insert with, and the River client's workers need the once
// client. Give Redrive a LateInserter and Set it once the River client
// is built (Example_wiring), or give it an insert-only River client of
// its own (Example). Start a once.Reaper too: without one, nothing calls
// the hook, and a person's Retry never runs.
//
// # Killed workers
//
// River's rescuer gives a running job to another worker only after
// river.Config.RescueStuckJobsAfter, one hour by default: the job of a
// worker killed mid-run waits that long, running for nobody. Set it a
// little above the longest run a Worker allows, the kinds' longest
// MaxExecution plus TimeoutMargin (with once's defaults, 5m30s: 7
// minutes is a fair setting). A rescue of a job still running elsewhere
// is harmless: its Do meets the claim and snoozes. The reaper with a
// Redrive hook covers what the rescuer does not (a job River discarded
// or cancelled).
//
// # Timeouts
//
// River cancels a job's context at its timeout (Config.JobTimeout, one
// minute by default, or Worker.Timeout); once cancels the effect at its
// kind's MaxExecution (five minutes by default). An effect cut off by
// either has an unknown outcome and goes to its kind's recovery, so the
// shorter of the two is the real limit. Keep River's the longer one, so
// that the kind's MaxExecution is what bounds an effect wherever it runs:
// a Worker whose WorkerConfig.Timeout is zero asks River for the kind's
// MaxExecution plus TimeoutMargin. River's rescuer leaves a running job
// alone for RescueStuckJobsAfter (one hour by default) and for as long as
// that timeout; with a Timeout of -1 it never rescues the job, and once's
// reaper with a Redrive hook is what runs a dead worker's effect again.
//
// The kind's Lease is shorter than both, and it is what notices a dead
// worker: once's reaper recovers its claim after the lease, long before
// River's rescuer gives the job to another worker. When the rescued job
// does run, it replays the result or meets the claim. Keep the kind's
// Retention longer than River may go on delivering a job (River's default
// 25 attempts with its backoff span about three weeks; once keeps an
// action 30 days by default), or a late delivery runs the effect again.
package riverjob
