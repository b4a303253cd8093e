package storekit

import (
	"math"
	"slices"

	"github.com/oncehq/once"
)

// TrailInfo is what a store reads of an action's written trail, beside
// one page of it, to tell the events it never wrote (WithHappyPath).
type TrailInfo struct {
	// Written is how many events the trail holds.
	Written int64
	// Claimed says a claim of attempt 1 is written; ClaimOrigin is the
	// first one's origin.
	Claimed     bool
	ClaimOrigin string
	// Decided says an event of attempt 1 other than a refusal took the
	// row where it stands.
	Decided bool
	// FirstAfter is the ID of the first written event later than the
	// row's completed_at, zero if none: the unwritten outcome goes
	// before it.
	FirstAfter int64
}

// PageCursor is where q's page starts, the ID a store reads events
// after (oldest first) or before (q.Newest), and the most written events
// it holds: limit+1 are read, to tell whether more follow.
func PageCursor(q once.EventQuery) (after int64, limit int) {
	limit = q.Limit
	if limit <= 0 {
		limit = 100
	}
	after = max(q.After, 0)
	if q.Newest && after == 0 {
		after = math.MaxInt64
	}
	return after, limit
}

// Page makes one page of an action's trail: rows are up to limit+1
// written events in the order q asks, after its cursor; a is the row
// (found false if there is none), origin its first claimer's. The
// events the stores never write come in the page where
// WithHappyPath would put them: the first claim in the oldest page, the
// first attempt's outcome in the page of the first written event after
// it (the newest page if none). Page reorders rows, which it owns. A
// limit below one is taken as the query's own, as PageCursor reads it.
func Page(a once.Action, found bool, origin string, info TrailInfo, rows []once.Event, q once.EventQuery, limit int) once.EventPage {
	if limit <= 0 {
		_, limit = PageCursor(q)
	}
	p := once.EventPage{Total: info.Written}
	more := len(rows) > limit
	if more {
		rows = rows[:limit]
		p.Next = rows[len(rows)-1].ID
	}
	asc := rows // read no more: reversed in place
	if q.Newest {
		slices.Reverse(asc)
	}
	addClaim, addOutcome := false, false
	if found {
		if origin == "" {
			origin = info.ClaimOrigin
		}
		claim := !info.Claimed
		outcome := a.Attempt == 1 && !info.Decided && (a.Status == once.StatusSucceeded || a.Status == once.StatusFailed)
		oldest := q.Newest && !more || !q.Newest && q.After <= 0
		newest := !q.Newest && !more || q.Newest && q.After <= 0
		addClaim = claim && oldest
		switch {
		case !outcome:
		case info.FirstAfter == 0:
			addOutcome = newest
		case len(asc) > 0:
			addOutcome = asc[0].ID <= info.FirstAfter && info.FirstAfter <= asc[len(asc)-1].ID
		}
		if claim {
			p.Total++
		}
		if outcome {
			p.Total++
		}
	}
	p.Events = happyPath(a, origin, asc, addClaim, addOutcome, info.FirstAfter)
	if q.Newest {
		slices.Reverse(p.Events)
	}
	return p
}

// Happy-path events are not written: a first claim and the worker's
// outcome of that first attempt are described by the action row itself
// (created_at, completed_at, its origin), and writing them as rows of
// the trail tripled what a plain action cost the database. The trail's
// readers see them all the same: WithHappyPath puts them back. A store
// writes the unwritten outcome out before anything changes the row that
// describes it (a person's decision on a failed first attempt), or the
// trail would lose it.

// Unwritten reports whether a transition's event is one of the happy
// path's, which the stores leave out of the trail: the worker's success
// or failure of attempt 1, straight from in flight.
func Unwritten(attempt int, e once.Event, to once.Status) bool {
	return attempt == 1 && e.Actor == once.ActorWorker && e.From == once.StatusInFlight &&
		(e.Type == once.EventSucceeded && to == once.StatusSucceeded || e.Type == once.EventFailed && to == once.StatusFailed)
}

// EventToWrite is the type of the event t writes to the trail, or the
// empty string when it writes none: the happy path's (Unwritten), which
// the row tells.
func EventToWrite(t once.Transition) string {
	if Unwritten(t.Attempt, t.Event, t.To) {
		return ""
	}
	return string(t.Event.Type)
}

// WithHappyPath returns an action's trail as it would have been written
// in full: stored is what the trail holds, in order; a is the action
// row, origin the process that first claimed it (empty for a row
// claimed before it was kept: the written claim then names it). The
// first claim is added at the front unless the trail holds it (rows
// written before the happy path went unwritten do); the worker's outcome
// of attempt 1 where it happened, when the row stands succeeded or
// failed at attempt 1 and no written event took it there (a person's
// resolution, a verification). The added events have ID 0.
func WithHappyPath(a once.Action, origin string, stored []once.Event) []once.Event {
	claimed, decided := false, false
	for _, e := range stored {
		if e.Attempt != 1 {
			continue
		}
		if e.Type == once.EventClaimed {
			if !claimed && origin == "" {
				origin = e.Origin
			}
			claimed = true
		}
		if e.Type != once.EventRefused && e.To == a.Status {
			decided = true
		}
	}
	return happyPath(a, origin, stored, !claimed,
		a.Attempt == 1 && !decided && (a.Status == once.StatusSucceeded || a.Status == once.StatusFailed), 0)
}

// happyPath is stored, in order, with the first claim added at the front
// (addClaim) and the first attempt's outcome where it happened
// (addOutcome); written outcomes of the happy path are put where they
// happened too. before, when not zero, is the ID of the first written
// event after the outcome (TrailInfo.FirstAfter): the outcome goes
// just before it, also when the two share a time, as events written in
// the millisecond of the outcome do
// (TestClient/RefusedResolutionsDoNotGrowTheTrail).
func happyPath(a once.Action, origin string, stored []once.Event, addClaim, addOutcome bool, before int64) []once.Event {
	out := make([]once.Event, 0, len(stored)+2)
	if addClaim {
		to := once.StatusInFlight
		if a.OnExpiry != "" {
			// Its first claim waited for approval.
			to = once.StatusAwaitingApproval
		}
		out = append(out, once.Event{Key: a.Key, At: a.CreatedAt, Type: once.EventClaimed, Attempt: 1,
			To: to, Actor: once.ActorWorker, Origin: origin})
	}
	for _, e := range stored {
		if Unwritten(e.Attempt, e, e.To) {
			// Written out by a decision, after whatever was written
			// between the outcome and the decision (a refusal).
			out = inPlace(out, e)
		} else {
			out = append(out, e)
		}
	}
	if addOutcome {
		typ := once.EventSucceeded
		if a.Status == once.StatusFailed {
			typ = once.EventFailed
		}
		e := once.Event{Key: a.Key, At: a.CompletedAt, Type: typ, Attempt: 1,
			From: once.StatusInFlight, To: a.Status, Actor: once.ActorWorker, Origin: origin}
		if i := slices.IndexFunc(out, func(w once.Event) bool { return before != 0 && w.ID == before }); i >= 0 {
			return slices.Insert(out, i, e)
		}
		out = inPlace(out, e)
	}
	return out
}

// inPlace inserts a first attempt's outcome after the last event that
// came before it (a refused late outcome or decision may have come
// after).
func inPlace(out []once.Event, e once.Event) []once.Event {
	i := len(out)
	for i > 0 && out[i-1].At.After(e.At) {
		i--
	}
	return slices.Insert(out, i, e)
}
