package sqlite_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oncehq/once"
)

// A store closed while a duplicate waits: no read can ever tell the
// waiter anything, so the wait ends, with an error that says the store
// was closed, instead of reading a closed database until it runs out.
func TestWaitStoreClosedEndsWait(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "once.db"))
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	in := once.Intent{Run: "r", Kind: "send_email", Target: "ada@example.com", Payload: "hello"}
	k, fp, _ := once.KeyOf(in)
	if _, err := s.Claim(ctx, once.ClaimRequest{Key: k, Fingerprint: fp, Run: in.Run, Kind: in.Kind, Target: in.Target, Lease: time.Hour}); err != nil {
		t.Fatal(err)
	}
	waiting := make(chan struct{}, 1)
	c, err := once.New(once.Config{Store: s, Hooks: once.Hooks{OnEvent: func(_ context.Context, o once.Observation) {
		if o.Type == once.EventWaiting {
			waiting <- struct{}{}
		}
	}}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := once.Do(ctx, c, in, func(context.Context, once.Attempt) (string, error) {
			t.Error("the waiting duplicate ran the effect")
			return "", nil
		}, once.WaitFor(time.Hour))
		done <- err
	}()
	select {
	case <-waiting:
	case <-time.After(30 * time.Second):
		t.Fatal("the duplicate did not start waiting")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, once.ErrInFlight) || !strings.Contains(err.Error(), "closed") {
			t.Fatalf("duplicate = %v; want the *InFlightError, saying the store was closed", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the duplicate did not return within 30s of its store being closed")
	}
}
