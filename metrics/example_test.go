package metrics_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncehq/once"
	"github.com/oncehq/once/metrics"
	"github.com/oncehq/once/sqlite"
)

// The client takes the metrics' hooks, so the gauges are handed the
// client after once.New.
func ExampleNew() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "once-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	store, err := sqlite.Open(filepath.Join(dir, "once.db"), sqlite.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, nil)
	if err != nil {
		log.Fatal(err)
	}
	client, err := once.New(once.Config{Store: store, Hooks: m.Hooks()})
	if err != nil {
		log.Fatal(err)
	}
	m.SetStats(client)

	in := once.Intent{Run: "order-1", Kind: "send_email", Target: "ada@example.com"}
	for range 2 { // the second is a duplicate, answered from the store
		once.Do(ctx, client, in, func(context.Context, once.Attempt) (string, error) { return "msg-1", nil })
	}

	mfs, err := reg.Gather()
	if err != nil {
		log.Fatal(err)
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "once_actions", "once_claims_total", "once_replays_total":
			for _, s := range mf.GetMetric() {
				v := s.GetGauge().GetValue() + s.GetCounter().GetValue()
				fmt.Print(mf.GetName())
				for _, l := range s.GetLabel() {
					fmt.Printf(" %s=%s", l.GetName(), l.GetValue())
				}
				fmt.Println(":", v)
			}
		}
	}
	// Output:
	// once_actions kind=send_email status=succeeded: 1
	// once_claims_total kind=send_email: 1
	// once_replays_total kind=send_email status=succeeded: 1
}
