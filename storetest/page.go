package storetest

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oncehq/once"
)

// testEventPage reads trails of several shapes a page at a time, in
// both orders and at several page sizes, and checks that the pages put
// together are Events, each page saying how many the whole trail holds:
// the events the store never wrote (the first claim, the first attempt's
// outcome) come once, where Events has them.
func testEventPage(t *testing.T, h Harness) {
	s, _ := newStore(t, h)
	refuse := func(k once.Key, n int) {
		t.Helper()
		for i := range n {
			if err := s.AppendEvent(ctx(t), once.Event{Key: k, Type: once.EventRefused, Attempt: 1, Actor: "ops", Note: fmt.Sprintf("refusal %d", i)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	shapes := map[string]func(k once.Key){
		"happy path": func(k once.Key) { settle(t, s, k, once.StatusSucceeded) },
		"refused, then succeeded": func(k once.Key) {
			refuse(k, 1)
			settle(t, s, k, once.StatusSucceeded)
		},
		"succeeded, then refused": func(k once.Key) {
			settle(t, s, k, once.StatusSucceeded)
			time.Sleep(2 * time.Millisecond) // the row's times are to the millisecond in some stores
			refuse(k, 7)
		},
		"in review, refused, resolved": func(k once.Key) {
			settle(t, s, k, once.StatusReview)
			refuse(k, 5)
			mustTransition(t, s, once.Transition{Key: k, Attempt: 1, From: []once.Status{once.StatusReview}, To: once.StatusSucceeded,
				Result: jsonRaw(`"ok"`), ResolvedBy: "ops", ResolveNote: "checked",
				Event: once.Event{Key: k, Type: once.EventResolved, From: once.StatusReview, Actor: "ops", Note: "done: checked"}})
		},
		"in flight": func(once.Key) {},
	}
	step := int64(0)
	for name, shape := range shapes {
		step++
		k := mustClaim(t, s, claimReq(t, intent(step), time.Minute)).Action.Key
		shape(k)
		checkPages(t, s, name, k)
	}
	checkPages(t, s, "no such action", keyOf(t, intent(99)))
}

// checkPages compares every paging of k's trail with Events.
func checkPages(t *testing.T, s once.Store, name string, k once.Key) {
	t.Helper()
	all, err := s.Events(ctx(t), k)
	if err != nil {
		t.Fatal(err)
	}
	show := func(evs []once.Event) string {
		var out []string
		for _, e := range evs {
			out = append(out, fmt.Sprintf("%s/%d/%s", e.Type, e.ID, e.Note))
		}
		return strings.Join(out, ",")
	}
	for _, newest := range []bool{false, true} {
		want := slices.Clone(all)
		if newest {
			slices.Reverse(want)
		}
		for _, size := range []int{1, 2, 3, 5, 100} {
			var got []once.Event
			q := once.EventQuery{Key: k, Newest: newest, Limit: size}
			for pages := 0; ; pages++ {
				if pages > len(all)+1 {
					t.Fatalf("%s: paging (newest %v, %d a page) does not end", name, newest, size)
				}
				p, err := s.EventPage(ctx(t), q)
				if err != nil {
					t.Fatal(err)
				}
				if p.Total != int64(len(all)) {
					t.Errorf("%s: EventPage(%+v).Total = %d, want %d", name, q, p.Total, len(all))
				}
				if written := len(slices.DeleteFunc(slices.Clone(p.Events), func(e once.Event) bool { return e.ID == 0 })); written > size {
					t.Errorf("%s: a page of %d holds %d written events", name, size, written)
				}
				got = append(got, p.Events...)
				if p.Next == 0 {
					break
				}
				q.After = p.Next
			}
			if show(got) != show(want) {
				t.Errorf("%s: pages (newest %v, %d a page) =\n%s\nwant\n%s", name, newest, size, show(got), show(want))
			}
		}
	}
}

// testListPages checks the list's brief form, step order with its
// cursor, and Count.
func testListPages(t *testing.T, h Harness) {
	s, _ := newStore(t, h)
	var keys []once.Key
	for _, step := range []int64{5, 1, 4, 2, 3, 0} {
		in := intent(step)
		in.Run = "paged"
		req := claimReq(t, in, time.Minute)
		req.Payload = []byte(`{"big":"` + strings.Repeat("x", 1000) + `"}`)
		mustClaim(t, s, req)
		settle(t, s, req.Key, once.StatusSucceeded)
		keys = append(keys, req.Key)
	}
	other := claimReq(t, intent(7), time.Minute)
	mustClaim(t, s, other)

	full, err := s.List(ctx(t), once.Filter{Run: "paged"})
	if err != nil || len(full) != 6 || len(full[0].Payload) == 0 || len(full[0].Result) == 0 {
		t.Fatalf("List = %d rows, %v; want 6 with their payloads and results", len(full), err)
	}
	brief, err := s.List(ctx(t), once.Filter{Run: "paged", Brief: true})
	if err != nil || len(brief) != 6 {
		t.Fatalf("List(Brief) = %d rows, %v", len(brief), err)
	}
	for i, a := range brief {
		if a.Payload != nil || a.Result != nil || a.Key != full[i].Key || a.Status != full[i].Status || a.Step != full[i].Step || a.Kind != full[i].Kind {
			t.Errorf("List(Brief) row %d = %+v; want %+v without payload and result", i, a, full[i])
		}
	}
	var steps []int64
	f := once.Filter{Run: "paged", ByStep: true, Brief: true, Limit: 4}
	for range 3 {
		page, err := s.List(ctx(t), f)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range page {
			steps = append(steps, a.Step)
		}
		if len(page) < f.Limit {
			break
		}
		f.AfterStep, f.AfterKey = page[len(page)-1].Step, page[len(page)-1].Key
	}
	if fmt.Sprint(steps) != "[0 1 2 3 4 5]" {
		t.Errorf("List(ByStep) in pages of 4 = %v, want [0 1 2 3 4 5]", steps)
	}
	for _, c := range []struct {
		f    once.Filter
		want int64
	}{
		{once.Filter{}, 7},
		{once.Filter{Run: "paged"}, 6},
		{once.Filter{Run: "paged", Limit: 2, ByStep: true, AfterStep: 3, AfterKey: keys[0]}, 6},
		{once.Filter{Status: once.StatusInFlight}, 1},
		{once.Filter{Run: "none"}, 0},
	} {
		if n, err := s.Count(ctx(t), c.f); err != nil || n != c.want {
			t.Errorf("Count(%+v) = %d, %v; want %d", c.f, n, err, c.want)
		}
	}
}
