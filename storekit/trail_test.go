package storekit

import (
	"testing"
	"time"

	"github.com/oncehq/once"
)

// Page is handed the limit its store read, and a store that passes the
// query's own (zero: the default) must get a page, not a panic in its
// caller's EventPage. PageCursor's limit is what Page takes.
func TestPageOfALimitPageCursorWouldNotGive(t *testing.T) {
	at := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	a := once.Action{Key: "k1", Status: once.StatusReview, Attempt: 1, CreatedAt: at}
	rows := []once.Event{{ID: 7, Key: "k1", At: at, Type: once.EventReview, Attempt: 1, From: once.StatusInFlight, To: once.StatusReview, Actor: once.ActorReaper}}
	for _, limit := range []int{0, -1} {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("Page with limit %d panicked: %v", limit, r)
				}
			}()
			p := Page(a, true, "host:1", TrailInfo{Written: 1, Claimed: false}, append([]once.Event(nil), rows...), once.EventQuery{Key: "k1", Limit: limit}, limit)
			if len(p.Events) != 2 || p.Events[1].ID != 7 {
				t.Errorf("Page with limit %d = %+v; want the claim and the written event", limit, p.Events)
			}
		}()
	}
}
