package demo

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestTallyLog: the send log, written by the workers' own code, counts an
// attempt as accepted only on its accepted line, as nothing on its
// not_accepted line, and as unknown otherwise; count turns that into
// ranges, a job in review being no loss.
func TestTallyLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sends.log")
	l, err := openSendLog(path)
	if err != nil {
		t.Fatal(err)
	}
	jobs := []Job{{ID: 0, Rcpt: "a"}, {ID: 1, Rcpt: "b"}, {ID: 2, Rcpt: "c"}, {ID: 3, Rcpt: "d"}, {ID: 4, Rcpt: "e"}}
	send := func(half string, job int, outcome string) {
		line, err := l.begin(half, jobs[job], "mid")
		if err != nil {
			t.Fatal(err)
		}
		if outcome != "" {
			l.end(line, outcome, "reply")
		}
	}
	send("naive", 0, logAccepted)    // job 0: one accepted,
	send("naive", 0, "")             // one killed mid-send,
	send("naive", 0, logAccepted)    // another accepted
	send("naive", 1, logNotAccepted) // job 1: refused, then
	send("naive", 1, logUnsure)      // sent with no reply
	send("naive", 2, "")             // job 2: killed mid-send
	send("naive", 3, logNotAccepted) // job 3: never accepted
	send("once", 4, logAccepted)     // the other half's line
	l.close()

	got, err := tallyLog(path, "naive", jobs)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{2, 0, 0, 0, 0}; !slices.Equal(got.accepted, want) {
		t.Errorf("accepted = %v, want %v", got.accepted, want)
	}
	if want := []int{1, 1, 1, 0, 0}; !slices.Equal(got.unknown, want) {
		t.Errorf("unknown = %v, want %v", got.unknown, want)
	}
	delivered, duplicates, lost, b := count(got, func(job int) bool { return job == 2 })
	want := Bounds{SendsAccepted: 2, SendsUnknown: 3, DeliveredAtMost: 3, DuplicatesAtMost: 2, LostAtLeast: 2}
	if delivered != 1 || duplicates != 1 || lost != 3 || b != want {
		t.Errorf("count = delivered %d, duplicates %d, lost %d, %+v; want 1, 1, 3, %+v", delivered, duplicates, lost, b, want)
	}

	// A torn or foreign line makes the counts untrustworthy: an error,
	// not a silent undercount.
	os.WriteFile(path, []byte("{\"event\":\"attempt\",\"half\":\"naive\",\"job\":0}\n{\"event\":\"acc"), 0o644)
	if _, err := tallyLog(path, "naive", jobs); err == nil {
		t.Error("a torn line was read without an error")
	}
}
