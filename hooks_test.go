package once_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncehq/once"
)

type spanKey struct{}

// tracer is a Hooks pair that records what a tracer would see: the start
// of each effect, its end with the error Do returned, and every event
// with the span of the context it came with.
type tracer struct {
	mu     sync.Mutex
	n      int // spans opened so far
	starts []once.Observation
	ends   []traced
	events []string
}

type traced struct {
	obs  once.Observation
	err  error
	span string
}

func (tr *tracer) hooks() once.Hooks {
	return once.Hooks{
		OnExecute: func(ctx context.Context, o once.Observation) (context.Context, func(once.Observation, error)) {
			tr.mu.Lock()
			tr.starts = append(tr.starts, o)
			tr.n++
			span := fmt.Sprintf("span-%d", tr.n)
			tr.mu.Unlock()
			return context.WithValue(ctx, spanKey{}, span), func(o once.Observation, err error) {
				tr.mu.Lock()
				tr.ends = append(tr.ends, traced{o, err, span})
				tr.mu.Unlock()
			}
		},
		OnEvent: func(ctx context.Context, o once.Observation) {
			span, _ := ctx.Value(spanKey{}).(string)
			tr.mu.Lock()
			tr.events = append(tr.events, string(o.Type)+"@"+span)
			tr.mu.Unlock()
		},
	}
}

// take returns what was recorded since the last call and forgets it.
func (tr *tracer) take() (starts []once.Observation, ends []traced, events string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	starts, ends, events = tr.starts, tr.ends, strings.Join(tr.events, ",")
	tr.starts, tr.ends, tr.events = nil, nil, nil
	return
}

// OnExecute sees each won claim before its effect runs, gives the effect
// (and the outcome's hooks) its context, and its end func is called once,
// with the outcome's observation and exactly the error Do returns.
func TestOnExecute(t *testing.T) {
	tr := &tracer{}
	c, s := newClient(t, once.Config{Hooks: tr.hooks(), MaxResultBytes: 64, RecordTimeout: 100 * time.Millisecond,
		Kinds: map[string]once.KindPolicy{"charge": {Recovery: once.RetryWithProviderKey}}})
	ctx := context.Background()
	step := int64(0)
	next := func(kind string) once.Intent {
		step++
		return once.Intent{Run: "hooks", Step: step, Kind: kind}
	}
	spanOf := func(ctx context.Context) string { s, _ := ctx.Value(spanKey{}).(string); return s }

	for _, c2 := range []struct {
		name   string
		kind   string
		effect func(context.Context, once.Attempt) (string, error)
		// outcome is the event type the end func is told; events the
		// events OnEvent sees, all under the effect's span.
		outcome  once.EventType
		recovery once.Recovery
		events   string
	}{
		{"succeeded", "send_email", func(context.Context, once.Attempt) (string, error) {
			return "ok", nil
		}, once.EventSucceeded, once.AskPerson, "claimed@span-1,succeeded@span-1"},
		{"retry later", "send_email", func(context.Context, once.Attempt) (string, error) {
			return "", once.RetryLater(errors.New("429"))
		}, once.EventReleased, once.AskPerson, "claimed@span-2,released@span-2"},
		{"permanent", "send_email", func(context.Context, once.Attempt) (string, error) {
			return "", once.Permanent(errors.New("550"))
		}, once.EventFailed, once.AskPerson, "claimed@span-3,failed@span-3"},
		{"unknown", "send_email", func(context.Context, once.Attempt) (string, error) {
			return "", errors.New("EOF")
		}, once.EventReview, once.AskPerson, "claimed@span-4,review@span-4"},
		{"unknown, provider-idempotent", "charge", func(context.Context, once.Attempt) (string, error) {
			return "", errors.New("EOF")
		}, once.EventReleased, once.RetryWithProviderKey, "claimed@span-5,released@span-5"},
		{"result too large", "send_email", func(context.Context, once.Attempt) (string, error) {
			return strings.Repeat("x", 100), nil
		}, once.EventReview, once.AskPerson, "claimed@span-6,review@span-6"},
	} {
		in := next(c2.kind)
		var effectSpan string
		_, err := once.Do(ctx, c, in, func(ctx context.Context, a once.Attempt) (string, error) {
			effectSpan = spanOf(ctx)
			return c2.effect(ctx, a)
		})
		starts, ends, events := tr.take()
		if len(starts) != 1 || starts[0].Type != once.EventClaimed || starts[0].To != once.StatusInFlight || starts[0].Attempt != 1 ||
			starts[0].Kind != c2.kind || starts[0].Key != mustKey(t, in) || starts[0].Actor != once.ActorWorker {
			t.Fatalf("%s: OnExecute saw %+v; want one claimed observation", c2.name, starts)
		}
		if len(ends) != 1 {
			t.Fatalf("%s: end called %d times, want once", c2.name, len(ends))
		}
		e := ends[0]
		if e.err != err || e.obs.Type != c2.outcome || e.obs.Kind != c2.kind || e.obs.Recovery != c2.recovery || e.obs.Key != mustKey(t, in) || e.obs.Attempt != 1 {
			t.Errorf("%s: end(%+v, %v); Do returned %v, want the %s outcome and the same error", c2.name, e.obs, e.err, err, c2.outcome)
		}
		if effectSpan != e.span || events != c2.events {
			t.Errorf("%s: the effect ran under %q, events %s; want %q and %s", c2.name, effectSpan, events, e.span, c2.events)
		}
	}
	// A replay wins no claim: no OnExecute, and its event comes outside
	// any span.
	if _, err := once.Do(ctx, c, once.Intent{Run: "hooks", Step: 1, Kind: "send_email"}, func(context.Context, once.Attempt) (string, error) { return "", nil }); err != nil {
		t.Fatal(err)
	}
	starts, ends, events := tr.take()
	if len(starts) != 0 || len(ends) != 0 || events != "replayed@" {
		t.Fatalf("a replay: OnExecute %d, ends %d, events %s; want only a replayed event, outside any span", len(starts), len(ends), events)
	}

	t.Run("duration", func(t *testing.T) {
		in := next("send_email")
		once.Do(ctx, c, in, func(context.Context, once.Attempt) (string, error) {
			time.Sleep(5 * time.Millisecond)
			return "ok", nil
		})
		_, ends, _ := tr.take()
		if len(ends) != 1 || ends[0].obs.Duration < 5*time.Millisecond {
			t.Fatalf("ends %+v; want the effect's duration, at least its 5ms sleep", ends)
		}
	})

	t.Run("fenced", func(t *testing.T) {
		in := next("send_email")
		k := mustKey(t, in)
		_, err := once.Do(ctx, c, in, func(ctx context.Context, a once.Attempt) (string, error) {
			// Recovery takes the action over while the effect runs.
			if ok, err := s.Transition(ctx, once.Transition{Key: k, Attempt: 1, From: []once.Status{once.StatusInFlight}, To: once.StatusInFlight, NewAttempt: true, Lease: time.Hour}); !ok || err != nil {
				t.Errorf("takeover: %v %v", ok, err)
			}
			return "late", nil
		})
		_, ends, events := tr.take()
		var fe *once.FencedError
		if !errors.As(err, &fe) || len(ends) != 1 || ends[0].err != err || ends[0].obs.Type != once.EventRefused || !strings.HasSuffix(events, "refused@"+ends[0].span) {
			t.Fatalf("Do = %v; ends %+v, events %s; want the refusal reported to end and OnEvent", err, ends, events)
		}
	})

	t.Run("panic", func(t *testing.T) {
		in := next("send_email")
		func() {
			defer func() {
				if p := recover(); p != "boom" {
					t.Errorf("recovered %v, want the effect's panic", p)
				}
			}()
			once.Do(ctx, c, in, func(context.Context, once.Attempt) (string, error) { panic("boom") })
		}()
		_, ends, events := tr.take()
		if len(ends) != 1 || ends[0].obs.Type != once.EventReview || !errors.Is(ends[0].err, once.ErrOutcomeUnknown) || !strings.Contains(ends[0].err.Error(), "boom") {
			t.Fatalf("ends %+v, events %s; want one end with the panic as an unknown outcome", ends, events)
		}
	})

	t.Run("store gone", func(t *testing.T) {
		c, s := newClient(t, once.Config{Hooks: tr.hooks(), RecordTimeout: 100 * time.Millisecond})
		tr.take()
		_, err := once.Do(ctx, c, next("send_email"), func(context.Context, once.Attempt) (string, error) {
			s.Close()
			return "sent", nil
		})
		_, ends, _ := tr.take()
		if !errors.Is(err, once.ErrNotRecorded) || len(ends) != 1 || ends[0].err != err || ends[0].obs.Type != once.EventSucceeded {
			t.Fatalf("Do = %v, ends %+v; want the record error reported to end", err, ends)
		}
	})
}

// DoTx reports to the hooks as Do does: the claim, then the outcome with
// the error DoTx returns, once.
func TestOnExecuteDoTx(t *testing.T) {
	tr := &tracer{}
	c, s := newClient(t, once.Config{Hooks: tr.hooks(), MaxResultBytes: 64})
	ctx := context.Background()
	run := func(step int64, fn func(context.Context, *sql.Tx, once.Attempt) (string, error)) ([]traced, string, error) {
		t.Helper()
		tx, err := s.DB().BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		_, err = once.DoTx(ctx, c, s, tx, once.Intent{Run: "hooks-tx", Step: step, Kind: "write"}, fn)
		if err == nil {
			if cerr := tx.Commit(); cerr != nil {
				t.Fatal(cerr)
			}
		}
		starts, ends, events := tr.take()
		if len(starts) != 1 || starts[0].Type != once.EventClaimed {
			t.Fatalf("OnExecute saw %+v", starts)
		}
		return ends, events, err
	}

	var effectSpan string
	ends, events, err := run(0, func(ctx context.Context, _ *sql.Tx, _ once.Attempt) (string, error) {
		effectSpan, _ = ctx.Value(spanKey{}).(string)
		return "ok", nil
	})
	if err != nil || len(ends) != 1 || ends[0].err != nil || ends[0].obs.Type != once.EventSucceeded || effectSpan != ends[0].span || events != "claimed@span-1,succeeded@span-1" {
		t.Fatalf("DoTx = %v; ends %+v, events %s, effect span %q", err, ends, events, effectSpan)
	}
	cause := errors.New("constraint violated")
	ends, events, err = run(1, func(context.Context, *sql.Tx, once.Attempt) (string, error) { return "", cause })
	if !errors.Is(err, cause) || len(ends) != 1 || ends[0].err != err || events != "claimed@span-2" {
		t.Fatalf("DoTx = %v; ends %+v, events %s; want the effect's error reported to end, no outcome event", err, ends, events)
	}
	ends, _, err = run(2, func(context.Context, *sql.Tx, once.Attempt) (string, error) { return strings.Repeat("x", 100), nil })
	if !errors.Is(err, once.ErrResultTooLarge) || len(ends) != 1 || ends[0].err != err {
		t.Fatalf("DoTx = %v; ends %+v", err, ends)
	}

	// A nil store is refused like another client's.
	tx, err := s.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := once.DoTx[string, *sql.Tx](ctx, c, nil, tx, once.Intent{Run: "r", Kind: "k"}, func(context.Context, *sql.Tx, once.Attempt) (string, error) {
		t.Error("effect ran")
		return "", nil
	}); err == nil || !strings.Contains(err.Error(), "not the client's store") {
		t.Fatalf("DoTx with a nil store = %v", err)
	}
}

// JoinHooks calls each set in order, threads OnExecute's context from
// one to the next, and ends them in reverse, as deferred calls would.
func TestJoinHooks(t *testing.T) {
	var mu sync.Mutex
	var calls []string
	add := func(s string) {
		mu.Lock()
		calls = append(calls, s)
		mu.Unlock()
	}
	span := func(ctx context.Context) string { s, _ := ctx.Value(spanKey{}).(string); return s }
	full := func(name string) once.Hooks {
		return once.Hooks{
			OnEvent: func(ctx context.Context, o once.Observation) {
				add(name + ".event:" + string(o.Type) + "@" + span(ctx))
			},
			OnExecute: func(ctx context.Context, o once.Observation) (context.Context, func(once.Observation, error)) {
				add(name + ".execute@" + span(ctx))
				return context.WithValue(ctx, spanKey{}, span(ctx)+name), func(o once.Observation, err error) {
					add(fmt.Sprintf("%s.end:%s:%v", name, o.Type, err))
				}
			},
		}
	}
	eventsOnly := once.Hooks{OnEvent: func(ctx context.Context, o once.Observation) { add("c.event:" + string(o.Type) + "@" + span(ctx)) }}
	noEnd := once.Hooks{OnExecute: func(ctx context.Context, o once.Observation) (context.Context, func(once.Observation, error)) {
		add("d.execute@" + span(ctx))
		return ctx, nil
	}}
	c, _ := newClient(t, once.Config{Hooks: once.JoinHooks(full("a"), eventsOnly, full("b"), noEnd, once.Hooks{})})
	var effectSpan string
	if _, err := once.Do(context.Background(), c, once.Intent{Run: "join", Kind: "k"}, func(ctx context.Context, a once.Attempt) (int, error) {
		effectSpan = span(ctx)
		return 1, nil
	}); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"a.execute@", "b.execute@a", "d.execute@ab",
		"a.event:claimed@ab", "c.event:claimed@ab", "b.event:claimed@ab",
		"a.event:succeeded@ab", "c.event:succeeded@ab", "b.event:succeeded@ab",
		"b.end:succeeded:<nil>", "a.end:succeeded:<nil>",
	}
	if got := strings.Join(calls, " "); got != strings.Join(want, " ") || effectSpan != "ab" {
		t.Fatalf("calls:\n%s\nwant:\n%s\n(effect span %q)", got, strings.Join(want, " "), effectSpan)
	}

	// Nothing joined is no hooks at all.
	if h := once.JoinHooks(); h.OnEvent != nil || h.OnExecute != nil {
		t.Fatal("JoinHooks() set a hook")
	}
	c, _ = newClient(t, once.Config{Hooks: once.JoinHooks(once.Hooks{}, once.Hooks{})})
	if _, err := once.Do(context.Background(), c, once.Intent{Run: "join", Kind: "k"}, func(context.Context, once.Attempt) (int, error) { return 1, nil }); err != nil {
		t.Fatal(err)
	}
}

// A DoTx effect that panics has still begun an attempt the hooks were
// told of: its end func is called once, with an error, before the panic
// goes on up (as Do's is), so a tracer's span is closed.
func TestOnExecuteDoTxPanic(t *testing.T) {
	tr := &tracer{}
	c, s := newClient(t, once.Config{Hooks: tr.hooks()})
	ctx := context.Background()
	tx, err := s.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Errorf("recovered %v, want the effect's panic to go on up", p)
			}
		}()
		once.DoTx(ctx, c, s, tx, once.Intent{Run: "hooks-tx-panic", Kind: "write"}, func(context.Context, *sql.Tx, once.Attempt) (string, error) {
			panic("boom")
		})
	}()
	starts, ends, _ := tr.take()
	if len(starts) != 1 {
		t.Fatalf("OnExecute saw %d claims, want 1", len(starts))
	}
	if len(ends) != 1 || ends[0].err == nil || !strings.Contains(ends[0].err.Error(), "boom") {
		t.Fatalf("end called %d times (%+v) for a DoTx effect that panicked; want once, with an error naming the panic", len(ends), ends)
	}
}
