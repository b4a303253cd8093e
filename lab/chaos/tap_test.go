package chaos

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/lab/mailbox"
	"github.com/oncehq/once/smtpsend"
)

// TestSMTPTap sends through the tap to a real SMTP server: it counts
// each accepted message per intent, copies included, and carries out a
// planned kill and a planned withheld reply after the server accepted,
// where the sender cannot tell what happened.
func TestSMTPTap(t *testing.T) {
	mail, err := mailbox.Start(mailbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer mail.Close()
	var (
		mu     sync.Mutex
		killed []int
		faults []faultKind
	)
	pl := make([]plan, 9)
	pl[3], pl[6] = planKill, planTimeout
	tl := newTally(9, pl, func(pid int) bool {
		mu.Lock()
		defer mu.Unlock()
		killed = append(killed, pid)
		return true
	}, func(k faultKind) {
		mu.Lock()
		defer mu.Unlock()
		faults = append(faults, k)
	})
	tap, err := startSMTPTap(mail.Addr(), tl, time.Second, "abc123")
	if err != nil {
		t.Fatal(err)
	}
	defer tap.Close()
	send := func(i int) error {
		s := &smtpsend.Sender{Addr: tap.Addr(), Timeout: 300 * time.Millisecond, Hello: "w4242"}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := s.Send(ctx, once.Attempt{Key: once.Key("k" + string(rune('0'+i)))}, smtpsend.Message{
			From: "a@chaos.once.localhost", To: []string{recipient(i, "abc123")}, Subject: "s", Body: []byte("b\n"),
		})
		return err
	}
	if err := send(0); err != nil {
		t.Fatalf("a plain send through the tap: %v", err)
	}
	for _, i := range []int{3, 6} {
		err := send(i)
		if err == nil || errors.Is(err, once.ErrRetryLater) || errors.Is(err, once.ErrPermanent) {
			t.Errorf("intent %d (plan %d): the sender got %v; want an unknown outcome (a plain error): the server took the message and the reply never came", i, pl[i], err)
		}
	}
	if err := send(0); err != nil {
		t.Fatalf("a second copy through the tap: %v", err)
	}
	if !mail.Wait(4, 5*time.Second) {
		t.Fatalf("the mailbox holds %d messages; want 4", len(mail.Messages()))
	}
	for i, want := range map[int]int{0: 2, 3: 1, 6: 1, 1: 0} {
		deadline := time.Now().Add(5 * time.Second)
		for tl.count(kindEmail, i) != want && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if got := tl.count(kindEmail, i); got != want {
			t.Errorf("the tap counted %d acceptances of intent %d; want %d", got, i, want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(killed, []int{4242}) {
		t.Errorf("killed %v; want the worker that greeted as w4242, once", killed)
	}
	if !slices.Equal(faults, []faultKind{faultKill, faultProviderTimeout}) {
		t.Errorf("faults counted %v; want a kill and a provider timeout", faults)
	}
}

// TestDrawsFollowTheSeed: the same seed draws the same plans and the
// same schedule, every type of fault at least once, every kind meeting
// each plan.
func TestDrawsFollowTheSeed(t *testing.T) {
	draw := func(seed uint64) ([]plan, []scheduled) {
		return plans(rand.New(rand.NewPCG(seed, 1)), 300, 1, 0), schedule(rand.New(rand.NewPCG(seed, 2)), 300, 3, 1, false, nil)
	}
	p1, s1 := draw(42)
	p2, s2 := draw(42)
	if !slices.Equal(p1, p2) || !slices.Equal(s1, s2) {
		t.Fatal("the same seed drew different faults")
	}
	p3, _ := draw(43)
	if slices.Equal(p1, p3) {
		t.Error("seeds 42 and 43 drew the same plans")
	}
	seen := map[[2]int]bool{}
	for i, p := range p1 {
		if p != planNone {
			seen[[2]int{i % len(kinds), int(p)}] = true
		}
	}
	for k := range kinds {
		for _, p := range []plan{planKill, planTimeout} {
			if !seen[[2]int{k, int(p)}] {
				t.Errorf("no %s intent has plan %d", kinds[k], p)
			}
		}
	}
	types := map[faultKind]int{}
	for i, f := range s1 {
		types[f.Kind]++
		if f.At < 15 || f.At > 255 || i > 0 && f.At < s1[i-1].At {
			t.Errorf("fault %d fires at %d of 300 settled, out of order or outside 5%%–85%%", i, f.At)
		}
	}
	for _, k := range []faultKind{faultKill, faultStop, faultConn, faultProxy, faultBroker} {
		if types[k] == 0 {
			t.Errorf("no %s fault scheduled", k)
		}
	}
	if types[faultFailover] != 0 {
		t.Error("a failover was scheduled without a failover cluster")
	}
}

// TestScheduleFaultCounts: FaultCounts sets exactly how many faults of a
// type are scheduled, whatever the scale, and failovers are spread over
// the run.
func TestScheduleFaultCounts(t *testing.T) {
	fixed, err := parseFaultCounts(map[string]int{"broker": 300, "stop": 7, "failover": 3, "provider_timeout": 50})
	if err != nil {
		t.Fatal(err)
	}
	got := map[faultKind]int{}
	var failovers []int
	for _, f := range schedule(rand.New(rand.NewPCG(1, 2)), 10000, 6, 1, true, fixed) {
		got[f.Kind]++
		if f.Kind == faultFailover {
			failovers = append(failovers, f.At)
		}
	}
	want := map[faultKind]int{faultKill: 100, faultStop: 7, faultConn: 100, faultProxy: 100, faultBroker: 300, faultFailover: 3}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("%s: scheduled %d, want %d", k, got[k], n)
		}
	}
	if !slices.Equal(failovers, []int{2500, 5000, 7500}) {
		t.Errorf("failovers at %v, want spread evenly at 2500, 5000, 7500", failovers)
	}
	timeouts := 0
	for _, p := range plans(rand.New(rand.NewPCG(1, 1)), 10000, 1, fixed[faultProviderTimeout]) {
		if p == planTimeout {
			timeouts++
		}
	}
	if timeouts != 50 {
		t.Errorf("planned %d withheld replies, want 50", timeouts)
	}
}
