package linearize_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/lab/linearize"
	"github.com/oncehq/once/sqlite"
)

// Three deliveries of one job race through a recorded client; the
// history they leave is checked against the ledger's model.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "linearize-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	s, err := sqlite.Open(filepath.Join(dir, "once.db"), sqlite.Config{})
	if err != nil {
		panic(err)
	}
	defer s.Close()
	if err := s.Migrate(ctx); err != nil {
		panic(err)
	}

	rec := linearize.NewRecorder()
	c, err := once.New(once.Config{Store: s, Hooks: rec.Hooks()})
	if err != nil {
		panic(err)
	}
	in := once.Intent{Run: "order-1", Kind: "send_email", Target: "ada@example.com"}
	send := func(context.Context, once.Attempt) (string, error) { return "250 queued", nil }
	var wg sync.WaitGroup
	for id := range 3 {
		wg.Go(func() { linearize.Do(ctx, rec, id, c, in, send) })
	}
	wg.Wait()

	v := linearize.Check(rec.History(), time.Minute)
	fmt.Println(v.Result, "on", v.Keys, "key; problems:", len(rec.Problems()))
	// Output: Ok on 1 key; problems: 0
}
