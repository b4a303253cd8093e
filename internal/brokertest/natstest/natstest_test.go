package natstest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Streams are made and deleted by tests running in parallel. When the
// server's last stream was deleted, the server removed the account's
// store directory, and a stream made at that moment failed ("error
// creating store for stream", 10049): a test failed for a race of the
// server's, not of its own (natsjs TestPanicIsTerminatedAfterBound, on
// CI). Making and deleting streams at once must always succeed, and the
// anchor stream stays (the race is too narrow to hit at will here).
func TestStreamsMadeAsTheLastIsDeleted(t *testing.T) {
	_, js := Connect(t)
	var wg sync.WaitGroup
	errs := make(chan error, 1000)
	for g := range 4 {
		wg.Go(func() {
			for i := range 100 {
				name := fmt.Sprintf("%s_%d_%d", UniqueName(t), g, i)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				if _, err := create(ctx, js, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}}); err != nil {
					errs <- fmt.Errorf("creating %s: %w", name, err)
				} else if err := js.DeleteStream(ctx, name); err != nil {
					errs <- fmt.Errorf("deleting %s: %w", name, err)
				}
				cancel()
			}
		})
	}
	wg.Wait()
	close(errs)
	n := 0
	for err := range errs {
		if n++; n <= 5 {
			t.Error(err)
		}
	}
	if n > 0 {
		t.Fatalf("%d of %d streams could not be made or deleted", n, 4*100)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.Stream(ctx, anchorName); err != nil {
		t.Fatalf("the anchor stream: %v; want it standing while streams come and go", err)
	}
}
