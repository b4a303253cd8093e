package protocol

import (
	"encoding/json"
	"time"
)

// The bodies of /v1, as JSON. Durations are whole milliseconds, counted
// by the client from when it sent the request: no wall clock crosses
// the wire, so a client's clock may be wrong by any amount.

// Intent is once.Intent on the wire. Payload is any JSON value, null
// included, hashed in RFC 8785's canonical form; PayloadBase64 is raw
// bytes. At most one of the two is set; neither is no payload (the
// empty raw payload, as a Go intent's nil Payload).
type Intent struct {
	Run           string          `json:"run"`
	Step          int64           `json:"step"`
	Kind          string          `json:"kind"`
	Target        string          `json:"target,omitempty"`
	Payload       json.RawMessage `json:"payload,omitempty"`
	PayloadBase64 *string         `json:"payload_base64,omitempty"`
	PayloadInKey  bool            `json:"payload_in_key,omitempty"`
}

// KeysRequest asks for an intent's key and fingerprint. Key and
// Fingerprint, when set, are the client's own: they must match.
type KeysRequest struct {
	Intent      Intent `json:"intent"`
	Key         string `json:"key,omitempty"`
	Fingerprint string `json:"fingerprint,omitempty"`
}

// KeysAnswer is an intent's key and fingerprint (KEYS.md).
type KeysAnswer struct {
	Key         string `json:"key"`
	Fingerprint string `json:"fingerprint"`
}

// ClaimRequest claims an intent. Write is the client's token for this
// claim: the same request sent again (its reply lost) carries the same
// one and is answered with the attempt the first won. A new claim
// needs a new one.
type ClaimRequest struct {
	Intent      Intent `json:"intent"`
	Key         string `json:"key,omitempty"`
	Fingerprint string `json:"fingerprint,omitempty"`
	Write       string `json:"write"`
	// WaitMS waits up to this long for another attempt's outcome
	// (once.WaitFor); at most MaxWait.
	WaitMS int64 `json:"wait_ms,omitempty"`
	// Policy is the client's policy for the intent's kind, as a Go
	// worker's Config holds it; a kind the server pins refuses a
	// different one.
	Policy *Policy `json:"policy,omitempty"`
}

// Policy is a kind's policy as a client carries it (once.Client.Carrying):
// what a worker may choose for a kind the server does not pin. Zero
// fields are the server's default.
type Policy struct {
	LeaseMS        int64  `json:"lease_ms,omitempty"`
	MaxExecutionMS int64  `json:"max_execution_ms,omitempty"`
	RetentionMS    int64  `json:"retention_ms,omitempty"`
	Recovery       string `json:"recovery,omitempty"`
}

// Answers of a claim that is not a problem.
const (
	AnswerClaimed  = "claimed"
	AnswerReplayed = "replayed"
	AnswerFailed   = "failed"
)

// ClaimAnswer is a claim's answer: claimed (run the effect), replayed
// (it succeeded: here is its result), or failed (it failed for good).
type ClaimAnswer struct {
	Answer      string `json:"answer"`
	Key         string `json:"key"`
	Fingerprint string `json:"fingerprint"`
	Attempt     int    `json:"attempt"`
	// Claimed: the attempt's token (a secret of its holder), the
	// provider's idempotency key, when to stop unless a heartbeat
	// renews the claim, how often to heartbeat, and the most the effect
	// may take whatever heartbeats do.
	Token            string `json:"token,omitempty"`
	ProviderKey      string `json:"provider_key,omitempty"`
	StopAfterMS      int64  `json:"stop_after_ms,omitempty"`
	HeartbeatEveryMS int64  `json:"heartbeat_every_ms,omitempty"`
	MaxExecutionMS   int64  `json:"max_execution_ms,omitempty"`
	// Replayed: the stored result.
	Result json.RawMessage `json:"result,omitempty"`
	// Failed: what the attempt that failed said, or who rejected the
	// action and why.
	Message    string `json:"message,omitempty"`
	RejectedBy string `json:"rejected_by,omitempty"`
	Reason     string `json:"reason,omitempty"`
}

// AttemptRef names a claimed attempt: what heartbeats and outcomes
// carry.
type AttemptRef struct {
	Key     string `json:"key"`
	Attempt int    `json:"attempt"`
	Token   string `json:"token"`
	// Policy is the one the claim carried, if it carried one: a
	// heartbeat renews the lease it says.
	Policy *Policy `json:"policy,omitempty"`
}

// HeartbeatAnswer says how long the claim holds now.
type HeartbeatAnswer struct {
	StopAfterMS int64 `json:"stop_after_ms"`
}

// The outcomes an attempt records.
const (
	OutcomeSucceeded  = "succeeded"
	OutcomePermanent  = "permanent"
	OutcomeRetryLater = "retry_later"
	OutcomeUnknown    = "unknown"
)

// OutcomeRequest records an attempt's outcome. Sent again, it gets the
// same answer and records nothing more.
type OutcomeRequest struct {
	AttemptRef
	Write   string          `json:"write"`
	Outcome string          `json:"outcome"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   string          `json:"error,omitempty"`
}

// OutcomeAnswer is the status the outcome left the action in: an
// unknown outcome becomes what the kind's recovery makes of it.
type OutcomeAnswer struct {
	Status string `json:"status"`
}

// Action is an action as GET /v1/actions/{key} shows it.
type Action struct {
	Key         string          `json:"key"`
	Fingerprint string          `json:"fingerprint"`
	Run         string          `json:"run"`
	Step        int64           `json:"step"`
	Kind        string          `json:"kind"`
	Target      string          `json:"target,omitempty"`
	Status      string          `json:"status"`
	Attempt     int             `json:"attempt"`
	Result      json.RawMessage `json:"result,omitempty"`
	Error       string          `json:"error,omitempty"`
	// LeaseLeftMS: how long the claim or the wait for approval holds;
	// zero when none does. It is the database's deadline less the
	// server's clock, so it is off by any skew between the two: a
	// reader that must know (a test waiting for a lease to lapse) asks
	// again until it is zero. The claim's own answer is exact.
	LeaseLeftMS int64 `json:"lease_left_ms,omitempty"`
}

// DecisionRequest approves or rejects an action awaiting approval
// (operators only). Attempt and Fingerprint, when set, are what the
// person looked at: the decision applies only while the action stands
// there.
type DecisionRequest struct {
	By          string `json:"by"`
	Note        string `json:"note,omitempty"`
	Attempt     int    `json:"attempt,omitempty"`
	Fingerprint string `json:"fingerprint,omitempty"`
}

// Problem is an error answer (RFC 9457, application/problem+json). Code
// is what programs match; the other fields say more where the code
// has more to say.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Code   string `json:"code"`
	// Field and Reason: the intent's field that was wrong, and why.
	Field  string `json:"field,omitempty"`
	Reason string `json:"reason,omitempty"`
	// Key and Attempt: the action the problem is about.
	Key     string `json:"key,omitempty"`
	Attempt int    `json:"attempt,omitempty"`
	// RetryAfterMS: when to ask again (in flight, unknown, awaiting
	// approval, the store unavailable).
	RetryAfterMS int64 `json:"retry_after_ms,omitempty"`
	// Status of the action, for fenced and conflict.
	ActionStatus string `json:"action_status,omitempty"`
}

// ms is d in whole milliseconds, rounded down, never negative.
func ms(d time.Duration) int64 {
	if d < 0 {
		return 0
	}
	return d.Milliseconds()
}
