package natsjs_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/natsjs"
)

// A DoTx effect that fails for good is terminated with a reason that says
// what happened (the effect failed inside the transaction, nothing was
// recorded), not that the job was refused before any effect ran.
func TestDoTxPermanentReason(t *testing.T) {
	t.Parallel()
	b := setup(t, jetstream.ConsumerConfig{}, once.Config{})
	client, store := testdb.SQLiteClient(t, once.Config{})
	b.publish(t, job{ID: "order-tx", Customer: "cus_tx", Amount: 5})
	msg, err := b.cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	w := b.worker(t, natsjs.Config{})
	d, err := w.Handle(context.Background(), msg, func(ctx context.Context, msg jetstream.Msg) error {
		var j job
		if err := json.Unmarshal(msg.Data(), &j); err != nil {
			return once.Permanent(err)
		}
		tx, err := store.DB().BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		_, err = once.DoTx(ctx, client, store, tx, j.intent(), func(context.Context, *sql.Tx, once.Attempt) (string, error) {
			return "", once.Permanent(errors.New("account closed"))
		})
		if err != nil {
			return err
		}
		return tx.Commit()
	})
	if d.Action != once.JobDrop || !errors.Is(err, once.ErrPermanent) {
		t.Fatalf("settled %v (%v); want drop", d.Action, err)
	}
	if strings.Contains(d.Reason, "before any effect") || !strings.Contains(d.Reason, "account closed") {
		t.Errorf("reason %q; want the effect's own error (account closed), not a refusal before any effect", d.Reason)
	}
}
