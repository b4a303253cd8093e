package console

import (
	"sync"
	"time"

	"github.com/oncehq/once"
)

// ReaperStatus keeps the last pass of a once.Reaper for the overview.
// Give its OnPass to the reaper and the status to the console:
//
//	status := new(console.ReaperStatus)
//	reaper, err := once.NewReaper(client, once.ReaperConfig{OnPass: status.OnPass})
//	err = reaper.Start(ctx)
//	h, err := console.New(console.Config{Client: client, Reaper: status})
//
// The zero value is ready to use, and safe for concurrent use.
type ReaperStatus struct {
	mu   sync.Mutex
	last ReaperPass
	seen bool
}

// ReaperPass is one pass of a reaper as the console shows it.
type ReaperPass struct {
	// Report is what the pass did; after a failed pass, what it did
	// before it failed.
	Report once.ReapReport
	// Err is why the pass failed, nil if it did not.
	Err error
	// At is when the pass ended.
	At time.Time
}

// OnPass records a pass. Its signature is once.ReaperConfig.OnPass's.
func (s *ReaperStatus) OnPass(rep once.ReapReport, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last, s.seen = ReaperPass{Report: rep, Err: err, At: time.Now()}, true
}

// Last returns the last pass recorded, and false before the first.
func (s *ReaperStatus) Last() (ReaperPass, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last, s.seen
}
