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

// RedriveMsgID is the Nats-Msg-Id a re-drive of a's current attempt is
// published with: the action's key and attempt, "<key>/<attempt>".
//
// The job's original message id cannot serve: JetStream drops a message
// whose id it saw within the stream's duplicate window (two minutes by
// default), so the re-drive would be swallowed. A new attempt gets a new
// id and always goes through; the same attempt re-driven again within
// the window (the reaper trying again after a PubAck it did not get) is
// absorbed. After the window a second copy is stored, and its delivery
// replays or meets the claim like any duplicate.
func RedriveMsgID(a once.Action) string {
	return string(a.Key) + "/" + strconv.Itoa(a.Attempt)
}

// Redrive returns a once.KindPolicy.Redrive hook that publishes a
// released action's job again, on a stream of js, and waits for the
// stream to store it. build makes the job's message from the action
// (its Run is the job's id, its Payload the canonical payload); its
// Nats-Msg-Id header is set to RedriveMsgID, replacing any build set.
//
// A duplicate PubAck (this attempt was re-driven already, and the
// stream still holds the message) is success. Any other failure is
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
		// A duplicate PubAck means the stream holds this attempt's
		// re-drive already: nothing more to do.
		return nil
	}
}
