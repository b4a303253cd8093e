package tracing_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/sqlite"
	"github.com/oncehq/once/tracing"
)

type bundle struct {
	rec    *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	client *once.Client
	store  *sqlite.Store
}

func setup(t *testing.T) bundle {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	c, s := testdb.SQLiteClient(t, once.Config{Hooks: tracing.Hooks(tp)})
	return bundle{rec: rec, tp: tp, client: c, store: s}
}

func attr(s sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}

func spanNamed(t *testing.T, rec *tracetest.SpanRecorder, name string) []sdktrace.ReadOnlySpan {
	t.Helper()
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

var in = once.Intent{Run: "job-1", Kind: "send_email", Target: "ada@example.com", Payload: "hello"}

// The effect runs inside a span of its own that names the action, and its
// own calls nest under it; a duplicate adds a replay event to the
// caller's span instead of a second execution span.
func TestExecuteSpanAndReplayEvent(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	res, err := once.Do(ctx, b.client, in, func(ctx context.Context, a once.Attempt) (string, error) {
		_, child := b.tp.Tracer("provider").Start(ctx, "smtp.send")
		child.End()
		return "250 ok", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	spans := spanNamed(t, b.rec, "once.execute send_email")
	if len(spans) != 1 {
		t.Fatalf("%d execution spans, want 1", len(spans))
	}
	ex := spans[0]
	if attr(ex, "once.key") != string(res.Key) || attr(ex, "once.attempt") != "1" || attr(ex, "once.kind") != "send_email" || attr(ex, "once.outcome") != "succeeded" {
		t.Errorf("execution span attributes = %v", ex.Attributes())
	}
	if ex.Status().Code == codes.Error {
		t.Errorf("a success ended with status %v", ex.Status())
	}
	child := spanNamed(t, b.rec, "smtp.send")
	if len(child) != 1 || child[0].Parent().SpanID() != ex.SpanContext().SpanID() {
		t.Fatalf("the effect's own span is not a child of the execution span")
	}

	parentCtx, parent := b.tp.Tracer("worker").Start(ctx, "handle job")
	dup, err := once.Do(parentCtx, b.client, in, func(context.Context, once.Attempt) (string, error) {
		t.Error("a duplicate ran the effect")
		return "", nil
	})
	parent.End()
	if err != nil || !dup.Replayed {
		t.Fatalf("duplicate = %+v, %v", dup, err)
	}
	if n := len(spanNamed(t, b.rec, "once.execute send_email")); n != 1 {
		t.Errorf("a replay opened an execution span (%d in all)", n)
	}
	h := spanNamed(t, b.rec, "handle job")[0]
	if len(h.Events()) != 1 || h.Events()[0].Name != "once.replayed" {
		t.Fatalf("handler span events = %v, want one once.replayed", h.Events())
	}
}

// An unknown outcome ends the span with an error status and the status
// recovery chose; a panicking effect's span is ended too.
func TestFailedAndPanickingEffects(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	_, err := once.Do(ctx, b.client, in, func(context.Context, once.Attempt) (string, error) {
		return "", errors.New("connection reset after DATA")
	})
	if !errors.Is(err, once.ErrReview) {
		t.Fatalf("Do = %v, want review", err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the panic did not go on up the stack")
			}
		}()
		once.Do(ctx, b.client, once.Intent{Run: "job-2", Kind: "charge_card"}, func(context.Context, once.Attempt) (int, error) {
			panic("nil map")
		})
	}()
	for _, name := range []string{"once.execute send_email", "once.execute charge_card"} {
		spans := spanNamed(t, b.rec, name)
		if len(spans) != 1 {
			t.Fatalf("%s: %d ended spans, want 1", name, len(spans))
		}
		if s := spans[0]; s.Status().Code != codes.Error || attr(s, "once.outcome") != "review" {
			t.Errorf("%s ended with status %v, outcome %q; want an error and review", name, s.Status(), attr(s, "once.outcome"))
		}
	}
}

// DoTx's effect is traced as Do's is.
func TestDoTxSpan(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	tx, err := b.store.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var inner trace.SpanContext
	if _, err := once.DoTx(ctx, b.client, b.store, tx, in, func(ctx context.Context, _ *sql.Tx, a once.Attempt) (int, error) {
		inner = trace.SpanContextFromContext(ctx)
		return 1, nil
	}); err != nil {
		t.Fatal(err)
	}
	spans := spanNamed(t, b.rec, "once.execute send_email")
	if len(spans) != 1 || spans[0].SpanContext().SpanID() != inner.SpanID() || attr(spans[0], "once.outcome") != "succeeded" {
		t.Fatalf("DoTx spans = %v; the effect must run inside one, ended as succeeded", spans)
	}
}
