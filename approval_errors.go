package once

import (
	"errors"
	"fmt"
	"time"
)

// ErrAwaitingApproval: the action waits for a person's approval before
// it runs (KindPolicy.Approval). Nothing ran. Once approved, the next
// delivery runs it; rejected, it fails.
var ErrAwaitingApproval = errors.New("once: action awaits approval")

// AwaitingApprovalError reports an action that waits for a person's
// approval. The call that claimed it and every duplicate get it; only
// the claim announces the wait (Hooks.OnAwaitingApproval), so a
// duplicate asks nobody a second time.
type AwaitingApprovalError struct {
	Key     Key
	Kind    string
	Attempt int
	// Since is when the wait began; Expires, when it expires (by the
	// database's clock). Expired says it has: the reaper fails it, or
	// puts it up for review, as its kind asked, and an approval given
	// now is refused.
	Since   time.Time
	Expires time.Time
	Expired bool
	// Redrive says the application that claimed it has a Redrive hook
	// for its kind: once approved, the reaper hands it to the hook, so
	// the job may be dropped.
	Redrive bool
}

func (e *AwaitingApprovalError) Error() string {
	if e.Expired {
		return fmt.Sprintf("once: action %s (%s) waited for approval since %s and expired at %s unanswered; it does not run",
			e.Key, e.Kind, e.Since.UTC().Format(time.RFC3339), e.Expires.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("once: action %s (%s) awaits a person's approval since %s, until %s; nothing ran: approve it in the console or with once approve",
		e.Key, e.Kind, e.Since.UTC().Format(time.RFC3339), e.Expires.UTC().Format(time.RFC3339))
}
func (e *AwaitingApprovalError) Is(target error) bool { return target == ErrAwaitingApproval }

// awaitingApproval is the answer an action waiting for approval gives,
// as a claim at now found it.
func awaitingApproval(a Action, now time.Time) *AwaitingApprovalError {
	return &AwaitingApprovalError{Key: a.Key, Kind: a.Kind, Attempt: a.Attempt, Since: a.CreatedAt, Expires: a.LeaseUntil,
		Expired: !now.IsZero() && !a.LeaseUntil.After(now), Redrive: a.Redrive}
}
