package natsjs

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oncehq/once"
)

// RedriveMsgID is the Nats-Msg-Id a re-drive of a is published with: the
// action's key, its attempt and when it was last updated, in
// microseconds since the Unix epoch, "<key>/<attempt>/<updated>" (just
// "<key>/<attempt>" for an action with no UpdatedAt).
//
// The job's original message id cannot serve: JetStream drops a message
// whose id it saw within the stream's duplicate window (two minutes by
// default), so the re-drive would be swallowed. The reaper marks each
// re-drive that went through, which updates the action: a re-drive
// tried again after a failure (a PubAck it did not get, so no mark) has
// the same id, and the duplicate window absorbs it; the next re-drive
// after a marked one has a new id and reaches the stream even within
// the window, so a re-drive whose delivery never claimed the action (a
// worker without its database, MaxDeliver spent) is not swallowed while
// the reaper counts it re-driven. A new attempt always has a new id.
func RedriveMsgID(a once.Action) string {
	id := string(a.Key) + "/" + strconv.Itoa(a.Attempt)
	if !a.UpdatedAt.IsZero() {
		id += "/" + strconv.FormatInt(a.UpdatedAt.UnixMicro(), 10)
	}
	return id
}

// Redrive returns a once.KindPolicy.Redrive hook that publishes a
// released action's job again, on a stream of js, and waits for the
// stream to store it. build makes the job's message from the action
// (its Run is the job's id, its Payload the canonical payload); its
// Nats-Msg-Id header is set to RedriveMsgID, replacing any build set.
//
// A duplicate PubAck (this re-drive was published already by a try
// whose PubAck was lost) is success. Any other failure is
// returned to the reaper, which logs it, counts the action as waiting
// and tries again on a later pass.
func Redrive(js jetstream.JetStream, build func(once.Action) (*nats.Msg, error)) func(context.Context, once.Action) error {
	return func(ctx context.Context, a once.Action) error {
		switch {
		case js == nil:
			return errors.New("natsjs: Redrive was given a nil jetstream.JetStream; pass the one the jobs are published with")
		case build == nil:
			return errors.New("natsjs: Redrive was given a nil build function; pass one that makes the job's message from the action")
		}
		msg, err := build(a)
		if err != nil {
			return fmt.Errorf("natsjs: re-driving action %s: building its job message: %w", a.Key, err)
		}
		if msg == nil || msg.Subject == "" {
			return fmt.Errorf("natsjs: re-driving action %s: the build function returned no message or one without a subject; return a *nats.Msg with the job's subject and data", a.Key)
		}
		if msg.Header == nil {
			msg.Header = nats.Header{}
		}
		id := RedriveMsgID(a)
		msg.Header.Set(jetstream.MsgIDHeader, id)
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			return fmt.Errorf("natsjs: re-driving action %s: publishing to %q (Nats-Msg-Id %s): %w", a.Key, msg.Subject, id, err)
		}
		// A duplicate PubAck means the stream holds this re-drive
		// already (an earlier try whose PubAck was lost): nothing more
		// to do.
		return nil
	}
}

// JobSubject is the subject a job with several effects is published on,
// so that RedriveJob finds it again: prefix, a dot, and the job's id run
// (the Run of each of its intents). A run that is not a plain subject
// token (letters, digits, '-' and '_') is written as "b64." and its
// unpadded base64url form, so no run can add tokens or wildcards.
func JobSubject(prefix, run string) string {
	if run != "" && strings.Trim(run, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") == "" && run != "b64" {
		return prefix + "." + run
	}
	return prefix + ".b64." + base64.RawURLEncoding.EncodeToString([]byte(run))
}

// RedriveJob returns a once.KindPolicy.Redrive hook for a job with
// several effects. Each effect is an intent of its own, with the job's
// id as its Run; rebuilding one effect's job from its action alone would
// need the whole job in every intent's payload. Instead the job's own
// message is published again: the hook reads the last message on
// JobSubject(prefix, a.Run) from stream and publishes its data and
// headers once more, with the Nats-Msg-Id RedriveMsgID(a). The job runs
// again whole; the Do of each effect that finished replays its result,
// and the released one runs.
//
// The stream must keep the job's message after it was acked (retention
// jetstream.LimitsPolicy, the default, with a MaxAge longer than an
// action may wait for a person). A message that is gone (a WorkQueue or
// Interest stream, MaxAge, MaxMsgs) is an error the reaper logs, and the
// action waits: publish its job again by hand, or build it with
// Redrive. Headers the server reads on publish (Nats-*) are not copied.
func RedriveJob(js jetstream.JetStream, stream, prefix string) func(context.Context, once.Action) error {
	return func(ctx context.Context, a once.Action) error {
		switch {
		case js == nil:
			return errors.New("natsjs: RedriveJob was given a nil jetstream.JetStream; pass the one the jobs are published with")
		case stream == "" || prefix == "":
			return errors.New("natsjs: RedriveJob needs the jobs' stream and subject prefix; publish each job on natsjs.JobSubject(prefix, its id)")
		case a.Run == "":
			return fmt.Errorf("natsjs: re-driving action %s: it has no Run, so its job cannot be found; give each intent of a job the job's id as its Run", a.Key)
		}
		subject := JobSubject(prefix, a.Run)
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return fmt.Errorf("natsjs: re-driving action %s: looking up stream %q: %w", a.Key, stream, err)
		}
		stored, err := s.GetLastMsgForSubject(ctx, subject)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return fmt.Errorf("natsjs: re-driving action %s: stream %q holds no message on %q: the job was never published there, or the stream removed it (WorkQueue or Interest retention, MaxAge, MaxMsgs); keep the jobs' messages as long as an action may wait, or publish the job again by hand", a.Key, stream, subject)
		}
		if err != nil {
			return fmt.Errorf("natsjs: re-driving action %s: reading its job from stream %q on %q: %w", a.Key, stream, subject, err)
		}
		msg := &nats.Msg{Subject: subject, Data: stored.Data, Header: nats.Header{}}
		for k, v := range stored.Header {
			if !strings.HasPrefix(k, "Nats-") {
				msg.Header[k] = v
			}
		}
		return Redrive(js, func(once.Action) (*nats.Msg, error) { return msg, nil })(ctx, a)
	}
}
