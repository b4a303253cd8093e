// Package tracing traces once with OpenTelemetry.
//
//	h := tracing.Hooks(otel.GetTracerProvider())
//	client, err := once.New(once.Config{Store: store, Hooks: once.JoinHooks(m.Hooks(), h)})
//
// Every effect that runs gets a span of its own, opened when the claim is
// won and ended when its outcome is settled, so the effect's own calls
// (an HTTP request to the provider, an SMTP session) nest under it. The
// span says which action and attempt it was and how it ended. Everything
// else once does — a replay, an in-flight conflict, a refused payload, a
// recovery — is added as an event to the span already in the context:
// the job handler's, so a trace shows why a redelivered job did nothing.
package tracing

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/oncehq/once"
)

// ScopeName is the instrumentation scope of the tracer.
const ScopeName = "github.com/oncehq/once/tracing"

// Attribute keys set on spans and events.
const (
	KeyAction   = attribute.Key("once.key")
	KeyKind     = attribute.Key("once.kind")
	KeyAttempt  = attribute.Key("once.attempt")
	KeyOutcome  = attribute.Key("once.outcome")
	KeyFrom     = attribute.Key("once.from")
	KeyActor    = attribute.Key("once.actor")
	KeyRecovery = attribute.Key("once.recovery")
)

// Hooks returns once hooks that trace with tp. A nil tp records nothing.
func Hooks(tp trace.TracerProvider) once.Hooks {
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	tr := tp.Tracer(ScopeName)
	return once.Hooks{
		OnExecute: func(ctx context.Context, o once.Observation) (context.Context, func(once.Observation, error)) {
			ctx, span := tr.Start(ctx, "once.execute "+o.Kind, trace.WithSpanKind(trace.SpanKindInternal),
				trace.WithAttributes(KeyAction.String(string(o.Key)), KeyKind.String(o.Kind), KeyAttempt.Int(o.Attempt)))
			return ctx, func(o once.Observation, err error) {
				if o.To != "" {
					span.SetAttributes(KeyOutcome.String(string(o.To)))
				}
				if o.Type == once.EventRefused {
					span.SetAttributes(KeyOutcome.String("refused"))
				}
				if err != nil && !errors.Is(err, once.ErrRetryLater) {
					// A release is the effect saying "not now", not a
					// failure of the span's work.
					span.RecordError(err)
					span.SetStatus(codes.Error, err.Error())
				}
				span.End()
			}
		},
		OnEvent: func(ctx context.Context, o once.Observation) {
			span := trace.SpanFromContext(ctx)
			if !span.IsRecording() {
				return
			}
			attrs := []attribute.KeyValue{KeyAction.String(string(o.Key)), KeyKind.String(o.Kind), KeyAttempt.Int(o.Attempt)}
			if o.From != "" {
				attrs = append(attrs, KeyFrom.String(string(o.From)))
			}
			if o.To != "" {
				attrs = append(attrs, KeyOutcome.String(string(o.To)))
			}
			if o.Actor != "" {
				attrs = append(attrs, KeyActor.String(o.Actor))
			}
			if o.Recovery != once.RecoveryDefault {
				attrs = append(attrs, KeyRecovery.String(o.Recovery.String()))
			}
			span.AddEvent("once."+string(o.Type), trace.WithAttributes(attrs...))
		},
	}
}
