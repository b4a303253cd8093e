package mailbox_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/oncehq/once"
	"github.com/oncehq/once/lab/mailbox"
	"github.com/oncehq/once/smtpsend"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines leaked:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func start(t *testing.T, cfg mailbox.Config) *mailbox.Server {
	t.Helper()
	s, err := mailbox.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func send(ctx context.Context, addr string, key once.Key, to, subject string) (string, error) {
	s := &smtpsend.Sender{Addr: addr, Timeout: 10 * time.Second}
	return s.Send(ctx, once.Attempt{Key: key, Number: 1}, smtpsend.Message{
		From: "shop@example.com", To: []string{to}, Subject: subject, Body: []byte("Hello\n"),
	})
}

// TestKeepsAndCounts sends through smtpsend and finds each message by
// the Message-ID its key makes; a second copy counts as a second copy.
func TestKeepsAndCounts(t *testing.T) {
	s := start(t, mailbox.Config{})
	ctx := context.Background()
	for _, k := range []once.Key{"k1", "k2", "k1"} {
		if _, err := send(ctx, s.Addr(), k, "ada@example.com", "Hi "+string(k)); err != nil {
			t.Fatal(err)
		}
	}
	if got := len(s.Messages()); got != 3 {
		t.Fatalf("%d messages, want 3", got)
	}
	if n := s.Count(smtpsend.MessageID("k1", "")); n != 2 {
		t.Errorf("Count(k1) = %d, want 2", n)
	}
	if n := s.Count(smtpsend.MessageID("k2", "")); n != 1 {
		t.Errorf("Count(k2) = %d, want 1", n)
	}
	m, ok := s.Find(smtpsend.MessageID("k2", ""))
	if !ok || m.Subject != "Hi k2" || m.From != "shop@example.com" || len(m.To) != 1 || m.To[0] != "ada@example.com" || !strings.Contains(string(m.Body), "Hello") {
		t.Errorf("Find(k2) = %+v, %v", m, ok)
	}
	if _, ok := s.Find("<nope@once>"); ok {
		t.Error("Find found a message that was never sent")
	}
}

// TestBeforeReplyHoldsTheReply: the message is kept before the reply,
// and the sender waits for the reply until BeforeReply returns.
func TestBeforeReplyHoldsTheReply(t *testing.T) {
	release := make(chan struct{})
	s := start(t, mailbox.Config{BeforeReply: func(mailbox.Message) { <-release }})
	done := make(chan error, 1)
	go func() {
		_, err := send(context.Background(), s.Addr(), "held", "ada@example.com", "held")
		done <- err
	}()
	if !s.Wait(1, 30*time.Second) {
		t.Fatal("the message did not arrive")
	}
	select {
	case err := <-done:
		t.Fatalf("the sender got its reply while BeforeReply held it (err %v)", err)
	default:
	}
	if n := s.Count(smtpsend.MessageID("held", "")); n != 1 {
		t.Errorf("Count = %d while held, want 1: the message is kept before the reply", n)
	}
	close(release)
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("send after release: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the sender got no reply after release")
	}
}

// TestWaitTimesOut: Wait reports false when the messages do not come.
func TestWaitTimesOut(t *testing.T) {
	s := start(t, mailbox.Config{})
	if s.Wait(1, 50*time.Millisecond) {
		t.Error("Wait reported a message that never came")
	}
}

// TestCloseWithIdleClient: Close returns while a client holds a
// connection open, and leaves no goroutine behind (TestMain checks).
func TestCloseWithIdleClient(t *testing.T) {
	s, err := mailbox.Start(mailbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 100)
	if _, err := c.Read(buf); err != nil { // the greeting
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not return with a client connected")
	}
}

// TestAddressInUse: a taken address is refused with a message saying
// what to do.
func TestAddressInUse(t *testing.T) {
	s := start(t, mailbox.Config{})
	_, err := mailbox.Start(mailbox.Config{Addr: s.Addr()})
	if err == nil || !strings.Contains(err.Error(), "pick a free port") {
		t.Fatalf("Start on a taken address: %v", err)
	}
}
