package cli_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oncehq/once"
)

// TestResolveSucceededSaysSo: `once resolve` on an action that succeeded
// says that it succeeded and that there is nothing to resolve; it said
// "reload it and decide again", as if a decision were still to be made.
func TestResolveSucceededSaysSo(t *testing.T) {
	db := filepath.Join(t.TempDir(), "once.db")
	mustRun(t, "migrate", "--db", db)
	var key, resolved once.Key
	withClient(t, db, once.Config{}, func(c *once.Client, _ once.Store) {
		ctx := context.Background()
		in := once.Intent{Run: "run-s", Kind: "send_email", Target: "ada@example.com"}
		key, _, _ = once.KeyOf(in)
		once.Do(ctx, c, in, func(context.Context, once.Attempt) (int, error) { return 1, nil })
		in.Step = 1
		resolved, _, _ = once.KeyOf(in)
		once.Do(ctx, c, in, func(context.Context, once.Attempt) (int, error) { return 0, once.Permanent(nil) })
		if _, err := c.Resolve(ctx, resolved, once.Resolution{Decision: once.DecisionDone, By: "ada", Note: "sent by hand"}); err != nil {
			t.Fatal(err)
		}
	})
	for k, says := range map[once.Key][]string{
		key:      {"succeeded (attempt 1)", "there is nothing to resolve"},
		resolved: {"succeeded (attempt 1, marked done by ada)", "there is nothing to resolve"},
	} {
		for _, decision := range []string{"--done", "--retry", "--abandon"} {
			code, _, stderr := run(t, "resolve", string(k), decision, "--note", "again", "--db", db)
			if code != 1 || strings.Contains(stderr, "decide again") {
				t.Errorf("once resolve %s on a succeeded action: exit %d, %q; want a refusal that does not ask to decide again", decision, code, stderr)
			}
			for _, s := range says {
				if !strings.Contains(stderr, s) {
					t.Errorf("once resolve %s on a succeeded action: %q does not say %q", decision, stderr, s)
				}
			}
		}
	}
}
