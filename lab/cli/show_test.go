package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/oncehq/once"
)

// A trail of 1,000 events with 4 KB notes is printed a page at a time:
// `once show` prints 100 events, says how many there are and how to
// get the next page, and walking the pages prints every event once.
func TestShowPagesTheTrail(t *testing.T) {
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			showPagesTheTrail(t, db(t))
		})
	}
}

func showPagesTheTrail(t *testing.T, db string) {
	mustRun(t, "migrate", "--db", db)
	const n = 1000
	in := once.Intent{Run: "run-p", Kind: "send_email", Target: "ada@example.com"}
	key, _, _ := once.KeyOf(in)
	withClient(t, db, once.Config{}, func(c *once.Client, s once.Store) {
		ctx := context.Background()
		if _, err := once.Do(ctx, c, in, func(context.Context, once.Attempt) (int, error) { return 1, nil }); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			if err := s.AppendEvent(ctx, once.Event{Key: key, Type: once.EventRefused, Attempt: 1, From: once.StatusSucceeded, Actor: "mallory",
				Note: fmt.Sprintf("note-%04d-", i) + strings.Repeat("n", 4000)}); err != nil {
				t.Fatal(err)
			}
		}
	})
	seen := map[string]int{}
	args := []string{"show", string(key), "--db", db}
	for pages := 0; ; pages++ {
		if pages > n {
			t.Fatal("the pages do not end")
		}
		out := mustRun(t, args...)
		if len(out) > 600<<10 {
			t.Fatalf("once %s printed %d bytes; a page should hold 100 events of 4 KB, not all %d", strings.Join(args, " "), len(out), n)
		}
		if !strings.Contains(out, fmt.Sprintf("%d events", n+2)) {
			t.Fatalf("once %s does not say the trail holds %d events:\n%.2000s", strings.Join(args, " "), n+2, out)
		}
		for _, m := range regexp.MustCompile(`note-(\d{4})-`).FindAllStringSubmatch(out, -1) {
			seen[m[1]]++
		}
		m := regexp.MustCompile(`--events-after (\d+)`).FindStringSubmatch(out)
		if m == nil {
			break
		}
		args = []string{"show", string(key), "--db", db, "--events-after", m[1]}
	}
	if len(seen) != n {
		t.Errorf("walking the pages printed %d of the %d events", len(seen), n)
	}
	for note, times := range seen {
		if times != 1 {
			t.Errorf("event %s printed %d times", note, times)
		}
	}
	// Newest first, and the JSON output's page.
	out := mustRun(t, "show", string(key), "--db", db, "--newest", "--events", "3")
	if _, trail, _ := strings.Cut(out, "trail (UTC):\n"); !strings.Contains(strings.SplitN(trail, "\n", 2)[0], "note-0999-") {
		t.Errorf("once show --newest does not start with the newest event:\n%.1000s", trail)
	}
	var shown struct {
		Events      []json.RawMessage `json:"events"`
		EventsTotal int64             `json:"events_total"`
		EventsNext  int64             `json:"events_next"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "show", string(key), "--db", db, "--json")), &shown); err != nil {
		t.Fatal(err)
	}
	if len(shown.Events) > 102 || shown.EventsTotal != n+2 || shown.EventsNext == 0 {
		t.Errorf("once show --json: %d events, total %d, next %d", len(shown.Events), shown.EventsTotal, shown.EventsNext)
	}
	if code, _, errOut := run(t, "show", string(key), "--db", db, "--events", "1001"); code == 0 || !strings.Contains(errOut, "1000") {
		t.Errorf("once show --events 1001: exit %d, %s; want a refusal naming the most, 1000", code, errOut)
	}
}
