package natsjs

import (
	"context"
	"errors"
	"fmt"
	"strconv"

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
