// Package natsjs runs once effects from NATS JetStream messages and
// settles each message by what once recorded, using the jetstream
// package of github.com/nats-io/nats.go.
//
// A JetStream consumer delivers at least once: a message whose ack does
// not arrive within the consumer's AckWait is delivered again, to this
// worker or another. once absorbs the duplicate (the claim, the stored
// result); this package does the broker's half. Worker.Handle runs the
// job function, which calls once.Do, and then:
//
//	once.Dispose says      the message gets                    why
//	---------------------  ----------------------------------  ---------------------------------------
//	JobAck                 DoubleAck (confirmed)               the outcome is recorded
//	JobRetry               NakWithDelay(max(After, backoff))   the action needs a later delivery
//	JobDrop                TermWithReason(reason) (*)          a person decides, or the job is wrong
//	failed for good        TermWithReason (not Dispose's ack)  given up: a dead-letter signal
//	(*once.FailedError,
//	or once.Permanent
//	from the job function)
//	superseded             NakWithDelay (not Dispose's ack)    an ack settles the message, and with it
//	(*once.FencedError)                                        the delivery a newer attempt runs on
//	a retry on the         Term, with ErrLastDelivery          JetStream would not deliver it again: the
//	consumer's last                                            log says so louder than a retry
//	delivery (MaxDeliver)
//	the job function       NakWithDelay (backoff); at the      a poison message: recovered (its stack
//	panicked               MaxPanics-th panic (3), counted     logged), it neither kills the worker nor
//	(*PanicError)          by the worker, TermWithReason       goes round for ever
//
// (*) A plain Term on servers before 2.10.4, which ignore a Term that
// carries a reason and would deliver the message again. The backoff is
// Config.RetryDelay doubled with every delivery of the message, so a job
// whose disposition names no wait (released, the database unreachable)
// does not spin.
//
// A job whose action awaits a person's approval (once.KindPolicy.Approval,
// *once.AwaitingApprovalError) is not run, and is no poison: on a kind
// without a Redrive hook it is handed back with NakWithDelay, a minute at
// most or just past the wait's expiry, so it is delivered about once a
// minute until a person decides, and the first delivery after an approval runs
// it; once the wait has expired it is terminated. Each of those
// deliveries counts against the consumer's MaxDeliver: one that runs out
// first terminates the job (ErrLastDelivery), and once approved its
// action waits, counted by the reaper (once.ReapReport.Waiting), until
// its job is published again. Give such a consumer no MaxDeliver (-1),
// or one above the wait in minutes; better, give the kind a Redrive
// hook: the job is then terminated at once, and once approved the reaper
// publishes it again, after the kind's RedriveAfter.
//
// While the job function runs, Handle sends InProgress every third of
// the consumer's AckWait (or every Config.Progress), so a long effect is
// not delivered again under it; it stops as soon as the function
// returns. A worker that dies stops
// sending it: the message comes back after AckWait, and the next Do
// meets the dead claim (once.ErrInFlight, retried when its lease runs
// out) and applies the kind's recovery.
//
// Acks are confirmed (DoubleAck, bounded by Config.AckTimeout) so the
// caller learns when one did not land; nothing is lost when one does
// not: the message comes back, and its next delivery replays the stored
// result and acks again. A Nak or Term that does not land is as
// harmless: the message comes back after AckWait and is settled the same
// way. Every settlement error is returned (as a *SettleError) for the
// log.
//
// When the worker's context ends (shutdown), a message not yet started
// is handed back with a Nak without running, and a job function that
// returns after it is never acked on that account: what once recorded
// decides, and a retry is a Nak without the backoff, so another worker
// takes the job at once. Worker.Consume wraps jetstream.Consumer.Consume
// with a bounded pool and that shutdown: stop taking messages, let the
// running jobs finish within Config.DrainTimeout, then cancel them.
//
// Redrive builds the once.KindPolicy.Redrive hook: the reaper calls it
// for a released action whose job no delivery will bring back (acked,
// terminated, or out of MaxDeliver), and it publishes the job again with
// a Nats-Msg-Id made of the action's key, attempt and last update, so
// JetStream's duplicate window absorbs a re-drive the reaper tries again
// after a lost PubAck, but never swallows the next re-drive of the same
// release or the re-drive of a new attempt.
//
// A job with several effects (charge, then email) is one message and
// several intents with the job's id as their Run. Publish it on
// JobSubject(prefix, id) to a stream that keeps acked messages, and
// give each of its kinds RedriveJob(js, stream, prefix): a re-drive
// publishes the job's own message again, the Do of each finished effect
// replays, and the released one runs. No intent's payload needs to hold
// the whole job.
package natsjs
