package once

// Attempt is what an effect function is told about the attempt it runs.
type Attempt struct {
	// Key is the action's key.
	Key Key
	// Number is the fencing number of this attempt: 1 for the first.
	Number int
	// ProviderKey is an idempotency key for the provider's API (Stripe's
	// Idempotency-Key header, say). It is the same on every attempt of the
	// action, so a provider that honours it absorbs a retried call.
	ProviderKey string
	// Intent is the intent being carried out.
	Intent Intent

	// noter writes Note for an attempt run by Do; nil otherwise.
	noter *noter
}

func attemptOf(a Action, in Intent) Attempt {
	return Attempt{Key: a.Key, Number: a.Attempt, ProviderKey: string(a.Key), Intent: in}
}
