package demo_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/demo"
	"github.com/oncehq/once/sqlite"
)

func TestMain(m *testing.M) {
	// The demo's workers are this test binary, started again.
	if demo.IsWorker() {
		os.Exit(demo.WorkerMain(os.Stderr))
	}
	os.Exit(m.Run())
}

// TestDemo runs the whole story with real processes, a real SMTP server
// and real SIGKILLs: the naive half sends duplicates, the once half none,
// and nothing is silently lost.
func TestDemo(t *testing.T) {
	intents := 200
	if testing.Short() {
		intents = 40
	}
	db := filepath.Join(t.TempDir(), "once.db")
	rep, err := demo.Run(context.Background(), demo.Options{DB: db, Intents: intents, Workers: 4,
		Progress: func(half string, acked, total, kills int) {
			if os.Getenv("ONCE_DEMO_TRACE") != "" {
				t.Logf("%s %d/%d kills %d", half, acked, total, kills)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", rep)
	if rep.Kills == 0 {
		t.Error("no worker was killed")
	}
	if rep.Naive.Duplicates == 0 {
		t.Error("the naive half sent no duplicate; the kills between send and record should have caused some")
	}
	if rep.Once.Duplicates != 0 || rep.Once.Lost != 0 {
		t.Errorf("once half: %d duplicates, %d lost; want none", rep.Once.Duplicates, rep.Once.Lost)
	}
	if rep.Once.Delivered+rep.Once.Review < intents {
		t.Errorf("once half: %d delivered + %d for review < %d intents", rep.Once.Delivered, rep.Once.Review, intents)
	}
	// The review items are in the database for `once serve` to show.
	s, err := sqlite.Open(db, sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	review, err := s.List(context.Background(), once.Filter{Status: once.StatusReview, Run: rep.Run, Limit: 1000})
	if err != nil || len(review) != rep.Once.Review {
		t.Fatalf("store has %d review actions (%v), report says %d", len(review), err, rep.Once.Review)
	}
}
