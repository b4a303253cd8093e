package once

import (
	"context"
	"time"
)

// Events that reach hooks but are not written to an action's trail:
// writing them would turn every duplicate, a read, into a write.
const (
	EventConflict            EventType = "in_flight_conflict"
	EventFingerprintMismatch EventType = "fingerprint_mismatch"
)

// Observation is what a hook is told: an event, the action's kind, and,
// for an effect's outcome, how long the effect ran.
type Observation struct {
	Event
	Kind string
	// Recovery is the kind's recovery mode, set on recovery events.
	Recovery Recovery
	// Duration is the effect's run time on outcome events, the
	// verifier's on verification events.
	Duration time.Duration
}

// Hooks let a program watch every transition: for metrics (the metrics
// package), tracing or alerts. They run synchronously on the goroutine
// that made the transition, so they must be quick and must not block.
type Hooks struct {
	OnEvent func(context.Context, Observation)
}

func (c *Client) emit(ctx context.Context, o Observation) {
	if c.hooks.OnEvent != nil {
		c.hooks.OnEvent(ctx, o)
	}
}
