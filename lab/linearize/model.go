// Package linearize checks that once's ledger is linearizable: that the
// answers concurrent callers got from Do, Client.Resolve and Client.Get,
// with faults between them and the database, could have come from one
// action log changing one step at a time.
//
// A Recorder wraps those calls and writes down, with a monotonic clock,
// when each was made, when it returned and what it returned. Check runs
// the history through porcupine against Model, a sequential
// specification of one action, partitioned by key:
//
//   - the first claim wins: attempt n is claimed once, from no row
//     (n = 1), from a released attempt n−1, or (RetryWithProviderKey
//     only) by taking over attempt n−1 in flight;
//   - every other caller sees the claim in flight, or the stored
//     outcome: a replay returns exactly the result stored, with the
//     attempt that stored it;
//   - fencing: an attempt's outcome is recorded only while the action is
//     at that attempt (a success or a permanent failure also over a
//     decision taken about that attempt meanwhile), never over a newer
//     attempt's claim;
//   - a person's decision applies only to the attempt it names, and
//     only while that attempt is in review or failed.
//
// A Do is two operations in the history. Its claim is linearized between
// the call and the moment the effect is handed the claim (Hooks.OnExecute,
// which names the attempt); the outcome between the effect's return and
// Do's. A Do that ran nothing is one operation: what it saw. Recovery of a
// claim whose lease lapsed depends on the database's clock, which the
// model does not keep, so it may happen at any moment the claim is in
// flight: put up for review under AskPerson, released (by a reaper) under
// RetryWithProviderKey. A call whose effect on the database is unknown (an
// error from the connection, an outcome that could not be recorded) may
// take effect at any time after its call, as porcupine treats an operation
// that never returned.
//
// The Recorder also counts the effect's runs per attempt (at most one
// each) and claims per attempt; the provider-side counts are the test's.
//
// It is part of the lab module (github.com/oncehq/once/lab): the project's
// harnesses and tools, not a stable API; it may change in any release.
package linearize

import (
	"fmt"
	"hash/fnv"
	"slices"
	"strings"

	"github.com/anishathalye/porcupine"

	"github.com/oncehq/once"
)

// OpKind names what an operation of the history is.
type OpKind int

const (
	// OpClaim: a Do won attempt Input.Attempt (its effect was handed the
	// claim).
	OpClaim OpKind = iota + 1
	// OpOutcome: the attempt a Do claimed ended, and its outcome
	// (Input.Outcome) was recorded, refused, or may have been.
	OpOutcome
	// OpAnswer: a Do that ran nothing: what it saw, or an error.
	OpAnswer
	// OpResolve: a person's decision about one attempt.
	OpResolve
	// OpRead: Client.Get.
	OpRead
)

func (k OpKind) String() string {
	switch k {
	case OpClaim:
		return "claim"
	case OpOutcome:
		return "outcome"
	case OpAnswer:
		return "do"
	case OpResolve:
		return "resolve"
	case OpRead:
		return "get"
	}
	return fmt.Sprintf("OpKind(%d)", int(k))
}

// Input is what an operation asked.
type Input struct {
	Key once.Key
	Op  OpKind
	// Recovery is the key's kind's recovery: AskPerson or
	// RetryWithProviderKey. It decides which steps recovery may take.
	Recovery once.Recovery
	// Attempt is the attempt claimed (OpClaim), that ended (OpOutcome),
	// or that a person decided on (OpResolve).
	Attempt int
	// Outcome is, for OpOutcome, the status the effect's outcome
	// records: succeeded, failed, released, or review.
	Outcome once.Status
	// Value is the JSON of the effect's value (OpOutcome, succeeded) or
	// of a person's result (OpResolve, done).
	Value string
	// Decision is the person's decision (OpResolve).
	Decision once.Decision
}

// Result says how an operation ended.
type Result int

const (
	// Applied: a write took effect (an outcome recorded, a decision
	// accepted, a claim won).
	Applied Result = iota + 1
	// Refused: a write was fenced out (an outcome, a decision).
	Refused
	// Unsure: the call failed in a way that leaves its write unknown:
	// it may have taken effect, then or later.
	Unsure
	// Nothing: the call wrote nothing (an attempt that could not renew
	// its lease before the effect, and ran nothing).
	Nothing
	// Saw: a read; Output.Status, Attempt and Value say what.
	Saw
)

func (r Result) String() string {
	switch r {
	case Applied:
		return "applied"
	case Refused:
		return "refused"
	case Unsure:
		return "unsure"
	case Nothing:
		return "nothing"
	case Saw:
		return "saw"
	}
	return fmt.Sprintf("Result(%d)", int(r))
}

// Output is what an operation returned.
type Output struct {
	Result Result
	// Status, Attempt and Value are what a read saw (Result Saw): the
	// status ("" for no row), the attempt (0 when the answer did not say
	// which: an action found released) and the stored result's JSON.
	Status  once.Status
	Attempt int
	Value   string
}

// State is the model's view of one action: its status ("" while no row
// exists), its attempt, and the JSON of its stored result.
type State struct {
	Status  once.Status
	Attempt int
	Value   string
}

func (s State) String() string {
	if s.Status == "" {
		return "none"
	}
	if s.Status == once.StatusSucceeded {
		return fmt.Sprintf("%s#%d=%s", s.Status, s.Attempt, s.Value)
	}
	return fmt.Sprintf("%s#%d", s.Status, s.Attempt)
}

// lateFrom are the statuses a success or a permanent failure of the
// standing attempt is recorded from: its claim, or a decision taken
// about it while it was cut off.
var lateFrom = []once.Status{once.StatusInFlight, once.StatusReview, once.StatusReleased, once.StatusFailed}

// resolvable are the statuses a person's decision applies to (the model
// has no StatusUnknown: VerifyThenDecide is not modelled).
var resolvable = []once.Status{once.StatusReview, once.StatusFailed}

// silent returns s and what recovery may make of it at any moment: a
// claim in flight put up for review (AskPerson) or released by a reaper
// (RetryWithProviderKey). Nothing else changes without an operation.
func silent(s State, rec once.Recovery) []State {
	if s.Status != once.StatusInFlight {
		return []State{s}
	}
	switch rec {
	case once.AskPerson:
		return []State{s, {Status: once.StatusReview, Attempt: s.Attempt}}
	case once.RetryWithProviderKey:
		return []State{s, {Status: once.StatusReleased, Attempt: s.Attempt}}
	}
	return []State{s}
}

// claimed returns the claim of attempt n from s, if the ledger allows it.
func claimed(s State, rec once.Recovery, n int) (State, bool) {
	next := State{Status: once.StatusInFlight, Attempt: n}
	switch {
	case s.Status == "" && n == 1:
	case s.Status == once.StatusReleased && s.Attempt == n-1:
	case s.Status == once.StatusInFlight && s.Attempt == n-1 && rec == once.RetryWithProviderKey:
		// A takeover of a claim whose lease lapsed: never under
		// AskPerson, which does not re-execute.
	default:
		return State{}, false
	}
	return next, true
}

// anyClaim returns every claim a caller could have won from s without
// saying so.
func anyClaim(s State, rec once.Recovery) []State {
	switch s.Status {
	case "":
		return []State{{Status: once.StatusInFlight, Attempt: 1}}
	case once.StatusReleased, once.StatusInFlight:
		if next, ok := claimed(s, rec, s.Attempt+1); ok {
			return []State{next}
		}
	}
	return nil
}

// recordable reports whether the outcome of attempt n may be recorded
// over s, and returns what it makes of it.
func recordable(s State, in Input) (State, bool) {
	from := []once.Status{once.StatusInFlight}
	if in.Outcome == once.StatusSucceeded || in.Outcome == once.StatusFailed {
		from = lateFrom
	}
	if s.Attempt != in.Attempt || !slices.Contains(from, s.Status) {
		return State{}, false
	}
	next := State{Status: in.Outcome, Attempt: in.Attempt}
	if in.Outcome == once.StatusSucceeded {
		next.Value = in.Value
	}
	return next, true
}

// resolved returns what a person's decision makes of s, if it applies.
func resolved(s State, in Input) (State, bool) {
	if s.Attempt != in.Attempt || !slices.Contains(resolvable, s.Status) {
		return State{}, false
	}
	switch in.Decision {
	case once.DecisionDone:
		v := in.Value
		if v == "" {
			v = "null"
		}
		return State{Status: once.StatusSucceeded, Attempt: s.Attempt, Value: v}, true
	case once.DecisionRetry:
		return State{Status: once.StatusReleased, Attempt: s.Attempt}, true
	case once.DecisionAbandon:
		return State{Status: once.StatusFailed, Attempt: s.Attempt}, true
	}
	return State{}, false
}

// step is the sequential specification: every state the action may be
// in after the operation, from s; none if the operation could not have
// returned what it did.
func step(s State, in Input, out Output) []State {
	var next []State
	for _, c := range silent(s, in.Recovery) {
		next = append(next, stepFrom(c, in, out)...)
	}
	return next
}

func stepFrom(s State, in Input, out Output) []State {
	switch in.Op {
	case OpClaim:
		if next, ok := claimed(s, in.Recovery, in.Attempt); ok && out.Result == Applied {
			return []State{next}
		}
	case OpOutcome:
		next, ok := recordable(s, in)
		switch out.Result {
		case Applied:
			if ok {
				return []State{next}
			}
		case Refused:
			if !ok {
				return []State{s}
			}
		case Unsure:
			if ok {
				return []State{s, next}
			}
			return []State{s}
		case Nothing:
			return []State{s}
		}
	case OpAnswer:
		switch out.Result {
		case Saw:
			if saw(s, out) {
				return []State{s}
			}
		case Unsure:
			// The claim may have been won, and its reply lost; nobody
			// runs its effect.
			return append([]State{s}, anyClaim(s, in.Recovery)...)
		}
	case OpResolve:
		next, ok := resolved(s, in)
		switch out.Result {
		case Applied:
			if ok {
				return []State{next}
			}
		case Refused:
			// A decision is refused when the action changed between
			// the person's read and the write, which is no single
			// moment: a refusal is always a safe answer.
			return []State{s}
		case Unsure:
			if ok {
				return []State{s, next}
			}
			return []State{s}
		}
	case OpRead:
		if out.Result == Saw && s.Status == out.Status && s.Attempt == out.Attempt && s.Value == out.Value {
			return []State{s}
		}
	}
	return nil
}

// saw reports whether a Do that ran nothing could have answered out
// from s.
func saw(s State, out Output) bool {
	if s.Status != out.Status {
		return false
	}
	switch s.Status {
	case once.StatusSucceeded:
		return s.Attempt == out.Attempt && s.Value == out.Value
	case once.StatusReleased:
		// The answer does not name the attempt.
		return out.Attempt == 0 || s.Attempt == out.Attempt
	case once.StatusInFlight, once.StatusFailed, once.StatusReview:
		return s.Attempt == out.Attempt
	}
	return false
}

// Model is the ledger's sequential specification for porcupine,
// partitioned by key, with Input and Output as operations' values.
func Model() porcupine.Model {
	m := porcupine.NondeterministicModel{
		Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
			byKey := map[once.Key][]porcupine.Operation{}
			var keys []once.Key
			for _, op := range h {
				k := op.Input.(Input).Key
				if _, ok := byKey[k]; !ok {
					keys = append(keys, k)
				}
				byKey[k] = append(byKey[k], op)
			}
			parts := make([][]porcupine.Operation, 0, len(keys))
			for _, k := range keys {
				parts = append(parts, byKey[k])
			}
			return parts
		},
		Init: func() []any { return []any{State{}} },
		Step: func(state, input, output any) []any {
			next := step(state.(State), input.(Input), output.(Output))
			out := make([]any, len(next))
			for i, s := range next {
				out[i] = s
			}
			return out
		},
		Hash: func(state any) uint64 {
			s := state.(State)
			h := fnv.New64a()
			fmt.Fprintf(h, "%s\x00%d\x00%s", s.Status, s.Attempt, s.Value)
			return h.Sum64()
		},
		DescribeOperation: describe,
		DescribeState:     func(state any) string { return state.(State).String() },
	}
	return m.ToModel()
}

// describe renders an operation for the visualization and for failure
// messages.
func describe(input, output any) string {
	in, out := input.(Input), output.(Output)
	var b strings.Builder
	fmt.Fprintf(&b, "%s", in.Op)
	switch in.Op {
	case OpClaim:
		fmt.Fprintf(&b, " #%d", in.Attempt)
	case OpOutcome:
		fmt.Fprintf(&b, " #%d %s", in.Attempt, in.Outcome)
		if in.Outcome == once.StatusSucceeded {
			fmt.Fprintf(&b, "=%s", in.Value)
		}
	case OpResolve:
		fmt.Fprintf(&b, " %s #%d", in.Decision, in.Attempt)
		if in.Decision == once.DecisionDone {
			fmt.Fprintf(&b, "=%s", in.Value)
		}
	}
	fmt.Fprintf(&b, " → %s", out.Result)
	if out.Result == Saw {
		fmt.Fprintf(&b, " %s", State{Status: out.Status, Attempt: out.Attempt, Value: out.Value})
	}
	return b.String()
}
