package smtpsend_test

import (
	"bufio"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/oncehq/once/smtpsend"
)

// stallingServer accepts connections on loopback and talks SMTP as far
// as script says, line by line: for each command it reads, it sends the
// next reply; with no reply left it reads nothing more and says nothing,
// until the test ends. It stands for a server that never finishes.
func stallingServer(t *testing.T, greeting string, replies ...string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { close(done); ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				go func() { <-done; conn.Close() }()
				if greeting == "" {
					<-done
					return
				}
				conn.Write([]byte(greeting + "\r\n"))
				r := bufio.NewReader(conn)
				for _, reply := range replies {
					if _, err := r.ReadString('\n'); err != nil {
						return
					}
					conn.Write([]byte(reply + "\r\n"))
				}
				<-done
			}()
		}
	}()
	return ln.Addr().String()
}

// A server that accepts the connection and never greets: Timeout ends
// the wait, and nothing was sent, so the claim is released.
func TestSendServerNeverGreets(t *testing.T) {
	addr := stallingServer(t, "")
	s := &smtpsend.Sender{Addr: addr, Timeout: 200 * time.Millisecond}
	_, err := s.Send(context.Background(), attempt(t, 1), message())
	if c := class(err); c != "retry-later" {
		t.Fatalf("Timeout: class %s (%v), want retry-later", c, err)
	}
	if !strings.Contains(err.Error(), "nothing was sent") {
		t.Errorf("error %q does not say nothing was sent", err)
	}

	// Without Timeout, the context's deadline ends it the same way.
	s = &smtpsend.Sender{Addr: addr}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = s.Send(ctx, attempt(t, 1), message())
	if c := class(err); c != "retry-later" {
		t.Fatalf("context deadline: class %s (%v), want retry-later", c, err)
	}
	if !strings.Contains(err.Error(), "deadline exceeded") {
		t.Errorf("error %q does not name the context's deadline", err)
	}
}

// A server that answers 354 to DATA, then reads nothing more and never
// replies: the context's deadline ends the send, with no Timeout set.
// The message may have reached the server whole, so the outcome is
// unknown: neither a success nor a release.
func TestSendServerStallsMidData(t *testing.T) {
	addr := stallingServer(t, "220 stall.example ESMTP",
		"250 stall.example", // EHLO
		"250 2.1.0 ok",      // MAIL FROM
		"250 2.1.5 ok",      // RCPT TO
		"354 go ahead",      // DATA
	)
	s := &smtpsend.Sender{Addr: addr}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	reply, err := s.Send(ctx, attempt(t, 1), message())
	if c := class(err); c != "unknown" {
		t.Fatalf("class %s (%v, reply %q), want unknown", c, err, reply)
	}
	if reply != "" {
		t.Errorf("reply %q, want none", reply)
	}
	if id := smtpsend.MessageID(attempt(t, 1).Key, ""); !strings.Contains(err.Error(), "Message-ID "+id) {
		t.Errorf("error %q does not name Message-ID %s to search for", err, id)
	}
}

// A server that greets with a reply that never ends, line after short
// line: the client stops reading at its bound on what a server may say,
// instead of holding all of it in memory until Timeout, and nothing was
// sent.
func TestSendServerEndlessReplyIsBounded(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	wrote := make(chan int64, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			wrote <- 0
			return
		}
		defer conn.Close()
		total := int64(0)
		chunk := []byte(strings.Repeat("220-"+strings.Repeat("a", 60)+"\r\n", 1<<10))
		for {
			n, err := conn.Write(chunk)
			total += int64(n)
			if err != nil {
				break
			}
		}
		wrote <- total
	}()
	s := &smtpsend.Sender{Addr: ln.Addr().String(), Timeout: 5 * time.Second}
	_, err = s.Send(context.Background(), attempt(t, 1), message())
	if c := class(err); c != "retry-later" {
		t.Fatalf("class %s (%v), want retry-later", c, err)
	}
	if !strings.Contains(err.Error(), "bytes of replies") {
		t.Errorf("error %q does not name the bound on what the server may send", err)
	}
	<-wrote
}
