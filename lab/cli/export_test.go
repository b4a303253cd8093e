package cli

import (
	"time"

	"github.com/oncehq/once/internal/connlimit"
)

// SetServeLimits lowers `once serve`'s connection cap to maxConns and
// every timeout of its server to timeout, with no reserve and no
// per-address cap, until restore.
func SetServeLimits(maxConns int, timeout time.Duration) (restore func()) {
	old := limits
	limits = serveLimits{readHeader: timeout, read: timeout, write: timeout, idle: timeout,
		conns: connlimit.Limits{Max: maxConns, GuestIdle: timeout}}
	return func() { limits = old }
}

// ServeGuestsPerAddr is how many connections one address may hold of
// `once serve` before they show the token.
func ServeGuestsPerAddr() int { return limits.conns.PerAddr }

// ServeGuestSlots is how many of `once serve`'s connection slots
// connections without the token may fill.
func ServeGuestSlots() int { return limits.conns.Max - limits.conns.Reserved }

// SetWebhookTiming makes `once serve`'s approval webhook poll every
// poll, give a request timeout, back off from backoff and stop after
// attempts tries, until restore.
func SetWebhookTiming(poll, timeout, backoff time.Duration, attempts int) (restore func()) {
	old := webhookTiming
	webhookTiming.poll, webhookTiming.timeout, webhookTiming.backoff, webhookTiming.attempts = poll, timeout, backoff, attempts
	return func() { webhookTiming = old }
}
