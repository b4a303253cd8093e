package mailbox_test

import (
	"context"
	"fmt"

	"github.com/oncehq/once"
	"github.com/oncehq/once/lab/mailbox"
	"github.com/oncehq/once/smtpsend"
)

// A test starts a mailbox, sends to it through smtpsend, and counts the
// messages by the Message-ID the action key makes.
func Example() {
	box, err := mailbox.Start(mailbox.Config{})
	if err != nil {
		panic(err)
	}
	defer box.Close()

	sender := &smtpsend.Sender{Addr: box.Addr()}
	a := once.Attempt{Key: "3f2a9c", Number: 1}
	reply, err := sender.Send(context.Background(), a, smtpsend.Message{
		From: "shop@example.com", To: []string{"ada@example.com"}, Subject: "Welcome", Body: []byte("Hello Ada\n"),
	})
	if err != nil {
		panic(err)
	}
	m, found := box.Find(smtpsend.MessageID(a.Key, ""))
	fmt.Println(reply)
	fmt.Println(found, m.MessageID, m.Subject, box.Count(m.MessageID))
	// Output:
	// 250 2.0.0 OK: queued
	// true <3f2a9c@once> Welcome 1
}
