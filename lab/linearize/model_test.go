package linearize_test

import (
	"os"
	"strings"
	"testing"

	"github.com/anishathalye/porcupine"

	"github.com/oncehq/once"
	"github.com/oncehq/once/lab/linearize"
)

// h builds histories by hand: times in milliseconds.
type h struct {
	key once.Key
	rec once.Recovery
	ops []porcupine.Operation
}

func (x *h) add(client int, call, ret int64, in linearize.Input, out linearize.Output) *h {
	in.Key, in.Recovery = x.key, x.rec
	if ret != linearize.Never {
		ret *= 1e6
	}
	x.ops = append(x.ops, porcupine.Operation{ClientId: client, Input: in, Call: call * 1e6, Output: out, Return: ret})
	return x
}

func (x *h) claim(client int, call, ret int64, n int) *h {
	return x.add(client, call, ret, linearize.Input{Op: linearize.OpClaim, Attempt: n}, linearize.Output{Result: linearize.Applied})
}

func (x *h) outcome(client int, call, ret int64, n int, s once.Status, v string, r linearize.Result) *h {
	return x.add(client, call, ret, linearize.Input{Op: linearize.OpOutcome, Attempt: n, Outcome: s, Value: v}, linearize.Output{Result: r})
}

func (x *h) saw(client int, call, ret int64, s once.Status, n int, v string) *h {
	return x.add(client, call, ret, linearize.Input{Op: linearize.OpAnswer}, linearize.Output{Result: linearize.Saw, Status: s, Attempt: n, Value: v})
}

func (x *h) unsure(client int, call int64) *h {
	return x.add(client, call, linearize.Never, linearize.Input{Op: linearize.OpAnswer}, linearize.Output{Result: linearize.Unsure})
}

func (x *h) resolve(client int, call, ret int64, d once.Decision, n int, v string, r linearize.Result) *h {
	return x.add(client, call, ret, linearize.Input{Op: linearize.OpResolve, Attempt: n, Decision: d, Value: v}, linearize.Output{Result: r})
}

func (x *h) read(client int, call, ret int64, s once.Status, n int, v string) *h {
	return x.add(client, call, ret, linearize.Input{Op: linearize.OpRead}, linearize.Output{Result: linearize.Saw, Status: s, Attempt: n, Value: v})
}

const (
	inFlight  = once.StatusInFlight
	succeeded = once.StatusSucceeded
	failed    = once.StatusFailed
	review    = once.StatusReview
	released  = once.StatusReleased
)

const (
	applied = linearize.Applied
	refused = linearize.Refused
	unsure  = linearize.Unsure
)

func email() *h  { return &h{key: "e0", rec: once.AskPerson} }
func charge() *h { return &h{key: "c0", rec: once.RetryWithProviderKey} }

// Histories the ledger may produce: the model must accept each.
func TestModelAcceptsTheLedger(t *testing.T) {
	for name, x := range map[string]*h{
		"first claim wins, the rest see it in flight, then its result": email().
			claim(0, 0, 10, 1).
			saw(1, 2, 12, inFlight, 1, "").
			outcome(0, 20, 30, 1, succeeded, `"r1"`, applied).
			saw(1, 25, 26, succeeded, 1, `"r1"`).
			saw(2, 40, 41, succeeded, 1, `"r1"`),
		"a reply seen before the outcome's Do returned": email().
			claim(0, 0, 10, 1).
			outcome(0, 20, 100, 1, succeeded, `"r1"`, applied).
			saw(1, 30, 31, succeeded, 1, `"r1"`),
		"released, then claimed again": email().
			claim(0, 0, 10, 1).
			outcome(0, 20, 30, 1, released, "", applied).
			saw(1, 31, 32, released, 0, "").
			claim(1, 40, 50, 2).
			outcome(1, 60, 70, 2, succeeded, `"r2"`, applied).
			read(2, 80, 81, succeeded, 2, `"r2"`),
		"lease lapsed under AskPerson: review, a person says done": email().
			claim(0, 0, 10, 1).
			saw(1, 100, 101, review, 1, "").
			resolve(2, 110, 120, once.DecisionDone, 1, `"by hand"`, applied).
			saw(1, 130, 131, succeeded, 1, `"by hand"`).
			outcome(0, 200, 210, 1, succeeded, `"late"`, refused),
		"a late success of the same attempt over a person's retry": email().
			claim(0, 0, 10, 1).
			read(1, 100, 101, review, 1, "").
			resolve(2, 110, 120, once.DecisionRetry, 1, "", applied).
			outcome(0, 200, 210, 1, succeeded, `"late"`, applied).
			saw(1, 220, 221, succeeded, 1, `"late"`),
		"a zombie fenced out by a takeover": charge().
			claim(0, 0, 10, 1).
			claim(1, 100, 110, 2).
			outcome(1, 120, 130, 2, succeeded, `"r"`, applied).
			outcome(0, 200, 210, 1, succeeded, `"r"`, refused).
			saw(2, 220, 221, succeeded, 2, `"r"`),
		"a reaper released the lapsed claim": charge().
			claim(0, 0, 10, 1).
			read(1, 100, 101, released, 1, "").
			claim(1, 110, 120, 2),
		"a stale decision is refused": email().
			claim(0, 0, 10, 1).
			outcome(0, 20, 30, 1, review, "", applied).
			resolve(1, 40, 50, once.DecisionRetry, 1, "", applied).
			claim(2, 60, 70, 2).
			resolve(1, 80, 90, once.DecisionAbandon, 1, "", refused),
		"a claim whose reply was lost, never run, then reviewed": email().
			unsure(0, 0).
			saw(1, 50, 51, inFlight, 1, "").
			saw(1, 300, 301, review, 1, ""),
		"a claim whose reply was lost that did not commit": email().
			unsure(0, 0).
			claim(1, 50, 60, 1).
			outcome(1, 70, 80, 1, succeeded, `"r"`, applied),
		// What the recorder makes of a Do whose claim's try failed and was
		// sent again (once.EventClaimResent): the try given up on, an
		// unsure claim, beside what the Do saw. The try committed after
		// the read-back; its lease lapsed before the Do's next try, which
		// saw it in review (AskPerson) or taken by the next claim
		// (RetryWithProviderKey).
		"a resent claim whose first try committed late, reviewed": email().
			unsure(2, 0).
			saw(2, 0, 840, review, 1, ""),
		"a resent claim whose first try committed late, taken over": charge().
			claim(0, 0, 10, 1).
			outcome(0, 10, 90, 1, released, "", applied).
			unsure(1, 5).
			claim(2, 940, 975, 3).
			saw(1, 5, 1030, inFlight, 3, ""),
		"an outcome not recorded in time that committed later": email().
			claim(0, 0, 10, 1).
			outcome(0, 20, linearize.Never, 1, succeeded, `"r"`, unsure).
			saw(1, 30, 31, inFlight, 1, "").
			saw(1, 500, 501, succeeded, 1, `"r"`),
	} {
		t.Run(name, func(t *testing.T) {
			if v := linearize.Check(x.ops, 0); v.Result != porcupine.Ok {
				t.Fatalf("history rejected (%s):\n%s", v.Result, v.Explanation)
			}
		})
	}
}

// Histories the ledger must never produce: the model must reject each,
// so a real violation fails the test that recorded it.
func TestModelRejectsViolations(t *testing.T) {
	for name, x := range map[string]*h{
		"two attempts both ran with no release between": email().
			claim(0, 0, 10, 1).
			outcome(0, 20, 30, 1, succeeded, `"a"`, applied).
			claim(1, 40, 50, 2).
			outcome(1, 60, 70, 2, succeeded, `"b"`, applied),
		"two callers both won the first claim": email().
			claim(0, 0, 10, 1).
			claim(1, 0, 10, 1),
		"a replay of a value never stored": email().
			claim(0, 0, 10, 1).
			outcome(0, 20, 30, 1, succeeded, `"a"`, applied).
			saw(1, 40, 50, succeeded, 1, `"b"`),
		"a replay naming another attempt": email().
			claim(0, 0, 10, 1).
			outcome(0, 20, 30, 1, succeeded, `"a"`, applied).
			saw(1, 40, 50, succeeded, 2, `"a"`),
		"in flight seen after the outcome was recorded and returned": email().
			claim(0, 0, 10, 1).
			outcome(0, 20, 30, 1, succeeded, `"a"`, applied).
			saw(1, 40, 50, inFlight, 1, ""),
		"an outcome recorded over a newer attempt's claim": charge().
			claim(0, 0, 10, 1).
			claim(1, 100, 110, 2).
			outcome(0, 200, 210, 1, succeeded, `"late"`, applied),
		"a released outcome recorded over a person's decision": email().
			claim(0, 0, 10, 1).
			read(1, 100, 101, review, 1, "").
			outcome(0, 200, 210, 1, released, "", applied),
		"a lapsed claim taken over under AskPerson": email().
			claim(0, 0, 10, 1).
			claim(1, 100, 110, 2),
		"a decision applied to an attempt nobody looked at": email().
			claim(0, 0, 10, 1).
			outcome(0, 20, 30, 1, review, "", applied).
			resolve(1, 40, 50, once.DecisionRetry, 1, "", applied).
			claim(2, 60, 70, 2).
			outcome(2, 80, 90, 2, review, "", applied).
			resolve(1, 100, 110, once.DecisionRetry, 1, "", applied),
		"a person's done overwritten by a late success": email().
			claim(0, 0, 10, 1).
			saw(1, 100, 101, review, 1, "").
			resolve(2, 110, 120, once.DecisionDone, 1, `"by hand"`, applied).
			outcome(0, 200, 210, 1, succeeded, `"late"`, applied),
		"a fenced answer while the attempt still held its claim": email().
			claim(0, 0, 10, 1).
			outcome(0, 20, 30, 1, released, "", refused).
			saw(1, 40, 41, inFlight, 1, ""),
		"a decision that was applied but said refused": email().
			claim(0, 0, 10, 1).
			outcome(0, 20, 30, 1, review, "", applied).
			resolve(1, 40, 50, once.DecisionDone, 1, `"x"`, refused).
			saw(2, 60, 61, succeeded, 1, `"x"`),
		"a result read that nothing wrote": email().
			read(0, 0, 1, succeeded, 1, `"x"`),
	} {
		t.Run(name, func(t *testing.T) {
			v := linearize.Check(x.ops, 0)
			if v.Result != porcupine.Illegal {
				t.Fatalf("broken history accepted (%s)", v.Result)
			}
			if !strings.Contains(v.Explanation, string(x.key)) || !strings.Contains(v.Explanation, "left over") {
				t.Fatalf("explanation does not show the key and what was left over:\n%s", v.Explanation)
			}
			if len(v.Illegal) != 1 || v.Illegal[0] != x.key {
				t.Fatalf("illegal keys %v, want [%s]", v.Illegal, x.key)
			}
		})
	}
}

// A rejected history can be drawn for a person: porcupine's HTML view.
func TestVisualize(t *testing.T) {
	x := email().claim(0, 0, 10, 1).claim(1, 0, 10, 1).unsure(2, 5)
	v := linearize.Check(x.ops, 0)
	path, err := v.Visualize()
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(path)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "<html") || !strings.Contains(string(b), "claim #1") {
		t.Fatalf("visualization %s does not draw the history (%d bytes)", path, len(b))
	}
}
