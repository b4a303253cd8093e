package natsjs_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/brokertest/natstest"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/natsjs"
)

// order is a job with two effects: a charge, then an email.
type order struct {
	ID, Customer, Email string
	Amount              int
}

// TestRedriveJobWithSeveralEffects runs a two-effect job whose second
// effect is released on the consumer's only delivery. The reaper's
// re-drive must publish the job's own message again (its data and
// headers, from the stream), without either intent carrying the whole
// job: the charge replays, the email runs its second attempt.
func TestRedriveJobWithSeveralEffects(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t)
	s := natstest.Stream(t, js, jetstream.StreamConfig{})
	stream := s.CachedInfo().Config.Name
	prefix := stream + ".orders"
	redrive := natsjs.RedriveJob(js, stream, prefix)
	pol := once.KindPolicy{Recovery: once.RetryWithProviderKey, Redrive: redrive, RedriveAfter: 50 * time.Millisecond}
	client, _ := testdb.SQLiteClient(t, once.Config{Kinds: map[string]once.KindPolicy{"charge": pol, "send_email": pol}})
	ctx := context.Background()
	cons, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "worker", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 1})
	if err != nil {
		t.Fatal(err)
	}
	log := &record{}
	w := workerOn(t, js, natsjs.Config{}, log)
	var mu sync.Mutex
	var charges, emails []once.Attempt
	var tenants []string
	consume(t, w, cons, func(ctx context.Context, msg jetstream.Msg) error {
		var o order
		if err := json.Unmarshal(msg.Data(), &o); err != nil {
			return once.Permanent(err)
		}
		mu.Lock()
		tenants = append(tenants, msg.Headers().Get("Tenant"))
		mu.Unlock()
		charge := once.Intent{Run: o.ID, Step: 0, Kind: "charge", Target: o.Customer, Payload: o.Amount}
		if _, err := once.Do(ctx, client, charge, func(_ context.Context, a once.Attempt) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			charges = append(charges, a)
			return "ch_1", nil
		}); err != nil {
			return err
		}
		send := once.Intent{Run: o.ID, Step: 1, Kind: "send_email", Target: o.Email, Payload: "Thank you."}
		_, err := once.Do(ctx, client, send, func(_ context.Context, a once.Attempt) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			emails = append(emails, a)
			if a.Number == 1 {
				return "", errors.New("connection reset after the final dot")
			}
			return "250 queued", nil
		})
		return err
	})
	o := order{ID: "order 7/a.b", Customer: "cus_7", Email: "ada@example.com", Amount: 700} // not a subject token
	data, _ := json.Marshal(o)
	subject := natsjs.JobSubject(prefix, o.ID)
	if strings.ContainsAny(subject, " */>") || strings.Count(subject, ".") != strings.Count(prefix, ".")+2 {
		t.Fatalf("JobSubject(%q, %q) = %q: the run adds tokens", prefix, o.ID, subject)
	}
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: data, Header: nats.Header{"Tenant": {"acme"}, jetstream.MsgIDHeader: {"order-7"}}}); err != nil {
		t.Fatal(err)
	}
	first := log.waitSettle(t, "the first delivery settled", func(s settle) bool { return s.seq == 1 })
	if first.d.Action != once.JobDrop || !errors.Is(first.err, natsjs.ErrLastDelivery) {
		t.Fatalf("first delivery settled %v (%v); want the released email terminated on the last delivery", first.d.Action, first.err)
	}

	reaper, err := once.NewReaper(client, once.ReaperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, func() bool {
		rep, err := reaper.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return rep.Redriven == 1
	}, "the reaper to re-drive the released email")
	again := log.waitSettle(t, "the re-driven job settled", func(s settle) bool { return s.seq == 2 })
	if again.d.Action != once.JobAck || again.err != nil {
		t.Fatalf("the re-driven job settled %v (%v); want ack", again.d.Action, again.err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(charges) != 1 || len(emails) != 2 || emails[1].Number != 2 {
		t.Fatalf("%d charges and emails %+v; want one charge, and the email at attempts 1 and 2", len(charges), emails)
	}
	if len(tenants) != 2 || tenants[1] != "acme" {
		t.Fatalf("Tenant headers %q; want the job's own header on the re-drive", tenants)
	}
	raw, err := s.GetMsg(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	key, _, _ := once.KeyOf(once.Intent{Run: o.ID, Step: 1, Kind: "send_email", Target: o.Email, Payload: "Thank you."})
	if string(raw.Data) != string(data) || raw.Subject != subject || !strings.HasPrefix(raw.Header.Get(jetstream.MsgIDHeader), string(key)+"/1/") {
		t.Fatalf("re-drove %q on %q with Nats-Msg-Id %q; want the job's message on %q with the email's re-drive id", raw.Data, raw.Subject, raw.Header.Get(jetstream.MsgIDHeader), subject)
	}
}

// TestRedriveJobGone re-drives from a work-queue stream, which removed
// the job's message when it was acked: the hook must say so, and what
// to do, not publish anything.
func TestRedriveJobGone(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t)
	s := natstest.Stream(t, js, jetstream.StreamConfig{Retention: jetstream.WorkQueuePolicy})
	stream := s.CachedInfo().Config.Name
	err := natsjs.RedriveJob(js, stream, stream+".orders")(context.Background(), once.Action{Key: "k", Run: "order-1", Attempt: 1})
	if err == nil || !strings.Contains(err.Error(), "holds no message") || !strings.Contains(err.Error(), "WorkQueue") {
		t.Fatalf("RedriveJob of a removed job: %v; want an error that says the stream removed it", err)
	}
	err = natsjs.RedriveJob(js, stream, stream+".orders")(context.Background(), once.Action{Key: "k", Attempt: 1})
	if err == nil || !strings.Contains(err.Error(), "no Run") {
		t.Fatalf("RedriveJob of an action without a Run: %v; want it refused", err)
	}
}

func TestJobSubject(t *testing.T) {
	for run, want := range map[string]string{
		"order-7": "P.order-7", "a_b": "P.a_b", "b64": "P.b64.YjY0", "": "P.b64.",
		"a.b": "P.b64.YS5i", "*": "P.b64.Kg", ">": "P.b64.Pg", "a b": "P.b64.YSBi",
	} {
		if got := natsjs.JobSubject("P", run); got != want {
			t.Errorf("JobSubject(P, %q) = %q; want %q", run, got, want)
		}
	}
}
