// Package natstest finds the NATS server the tests talk to and makes
// streams of their own on it. It lives in the brokertest module, so that
// nats.go stays out of the core module's graph.
package natstest

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncehq/once/internal/testdb"
)

// DefaultURL is the machine's NATS server, with JetStream enabled.
const DefaultURL = "nats://127.0.0.1:4222"

// URL returns ONCE_TEST_NATS_URL, or the default.
func URL() string {
	return cmp.Or(os.Getenv("ONCE_TEST_NATS_URL"), DefaultURL)
}

// natsProbe connects once per test binary and asks for JetStream.
var natsProbe = sync.OnceValue(func() error {
	nc, err := nats.Connect(URL(), nats.Timeout(5*time.Second))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.AccountInfo(ctx); err != nil {
		return fmt.Errorf("JetStream is not available: %w", err)
	}
	return nil
})

// Require skips (or, under CI, fails) the test when NATS cannot be
// reached or has JetStream disabled, and returns its URL.
func Require(t testing.TB) string {
	t.Helper()
	url := URL()
	if err := natsProbe(); err != nil {
		msg := "NATS with JetStream is not reachable at " + url + " (" + err.Error() + "); start it with " +
			"'nats-server -a 127.0.0.1 -p 4222 -js' or set ONCE_TEST_NATS_URL"
		testdb.Unavailable(t, msg)
	}
	return url
}

// Connect connects to the test server (see Require) and returns the
// connection and its JetStream context; the connection is closed when
// the test ends.
func Connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	url := Require(t)
	nc, err := nats.Connect(url, nats.Name(t.Name()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// UniqueName returns a name for a stream, consumer or subject token made
// from the test's name and random bytes, so parallel packages and
// repeated runs on the shared server never meet.
func UniqueName(t testing.TB) string {
	b := make([]byte, 4)
	rand.Read(b)
	name := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-':
			return r
		}
		return '_'
	}, t.Name())
	if len(name) > 40 {
		name = name[:40]
	}
	return name + "_" + hex.EncodeToString(b)
}

// Stream creates a stream with a unique name for the test, deleted
// when it ends. cfg's Name is set here, and its Subjects default to
// "<name>.>".
func Stream(t testing.TB, js jetstream.JetStream, cfg jetstream.StreamConfig) jetstream.Stream {
	t.Helper()
	cfg.Name = UniqueName(t)
	if len(cfg.Subjects) == 0 {
		cfg.Subjects = []string{cfg.Name + ".>"}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := create(ctx, js, cfg)
	if err != nil {
		t.Fatalf("creating stream %s: %v", cfg.Name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// The test's own connection may be closed by now; use a new one.
		nc, err := nats.Connect(URL())
		if err != nil {
			t.Errorf("deleting stream %s: %v", cfg.Name, err)
			return
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err == nil {
			err = js.DeleteStream(ctx, cfg.Name)
		}
		if err != nil {
			t.Errorf("deleting stream %s: %v", cfg.Name, err)
		}
	})
	return s
}

// create creates a stream, once the anchor stands.
func create(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	if err := anchor(ctx, js); err != nil {
		return nil, err
	}
	return js.CreateStream(ctx, cfg)
}

// anchorName is a stream the tests make and never delete.
const anchorName = "once_test_anchor"

var (
	anchorMu sync.Mutex
	anchored bool
)

// anchor makes sure one stream always stands on the server. The server
// removes the account's store directory when its last stream is
// deleted, and a stream made at that moment fails ("error creating
// store for stream", 10049): tests in parallel packages delete their
// streams as others make theirs. With the anchor the directory stays.
func anchor(ctx context.Context, js jetstream.JetStream) error {
	anchorMu.Lock()
	defer anchorMu.Unlock()
	if anchored {
		return nil
	}
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: anchorName, Subjects: []string{anchorName + ".>"}, MaxMsgs: 1}); err != nil {
		return fmt.Errorf("making the anchor stream %s: %w", anchorName, err)
	}
	anchored = true
	return nil
}
