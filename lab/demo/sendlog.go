package demo

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
)

// The send log is the workers' own account of their SMTP transactions,
// kept when the demo cannot ask the server what it accepted (--smtp).
// A worker writes an "attempt" line before it dials and, once it knows,
// a line saying how the transaction ended. A worker killed in between
// leaves an attempt with no outcome: the server may or may not have
// accepted that message, and the counts say so instead of guessing.
const (
	logAttempt     = "attempt"
	logAccepted    = "accepted"     // the server replied 250 to the message
	logNotAccepted = "not_accepted" // it certainly did not take it: no connection, a refusal, or the message never ended
	logUnsure      = "unsure"       // the message ended, and no reply came back
)

// logLine is one line of the send log. Every line carries the half and
// the job, so that an outcome counts even if its attempt line were
// missing.
type logLine struct {
	Event    string `json:"event"`
	Attempt  string `json:"attempt"` // one SMTP transaction, across lines
	Half     string `json:"half"`
	Job      int    `json:"job"`
	Delivery int    `json:"delivery"`
	Rcpt     string `json:"rcpt"`
	// MessageID is the message's Message-ID, angle brackets included:
	// <naive-JOB-DELIVERY@once.localhost> in the naive half, the
	// action's key through once (the same on every attempt of one
	// action; see smtpsend.MessageID).
	MessageID string `json:"message_id"`
	// Reply is the server's reply, or the error that ended the attempt.
	Reply string `json:"reply,omitempty"`
}

// sendLog appends to the send log. Each line is one write to a file
// opened with O_APPEND, so lines from concurrent workers do not
// interleave; a write that returned is in the kernel's hands, and the
// only failure the demo causes, SIGKILL, cannot take it back, so there
// is no fsync.
type sendLog struct {
	f *os.File
}

func openSendLog(path string) (*sendLog, error) {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open the send log: %w", err)
	}
	return &sendLog{f: f}, nil
}

// begin writes the attempt line of a new transaction and returns its
// line, for the outcome to follow. A nil log (the demo's own server
// counts) writes nothing.
func (l *sendLog) begin(half string, j Job, messageID string) (logLine, error) {
	var id [8]byte
	rand.Read(id[:])
	line := logLine{Event: logAttempt, Attempt: hex.EncodeToString(id[:]), Half: half, Job: j.ID, Delivery: j.Delivery, Rcpt: j.Rcpt, MessageID: messageID}
	return line, l.write(line)
}

// end writes the outcome of the transaction begun with line. A failed
// write leaves the attempt without an outcome, which counts it as
// unknown: a wider range, never a wrong one.
func (l *sendLog) end(line logLine, event, reply string) {
	line.Event, line.Reply = event, reply
	l.write(line)
}

func (l *sendLog) write(line logLine) error {
	if l == nil {
		return nil
	}
	b, err := json.Marshal(line)
	if err != nil {
		return err
	}
	_, err = l.f.Write(append(b, '\n'))
	return err
}

func (l *sendLog) close() {
	if l != nil {
		l.f.Close()
	}
}

// tally is, for each job of a half, the messages the server is known to
// have accepted and the sends whose outcome nobody saw.
type tally struct {
	accepted, unknown []int
}

func newTally(n int) tally {
	return tally{accepted: make([]int, n), unknown: make([]int, n)}
}

// tallyServer takes the counts of the demo's own server: exact.
func tallyServer(mail *mailServer, jobs []Job) tally {
	t := newTally(len(jobs))
	for i, j := range jobs {
		t.accepted[i] = mail.count(j.Rcpt)
	}
	return t
}

// tallyLog reads the send log for one half. An attempt counts as
// accepted when its accepted line is there, as nothing when its
// not_accepted line is, and as unknown otherwise.
func tallyLog(path, half string, jobs []Job) (tally, error) {
	t := newTally(len(jobs))
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return t, nil // no worker of this run got as far as a send
	}
	if err != nil {
		return t, fmt.Errorf("read the send log: %w", err)
	}
	defer f.Close()
	type attempt struct {
		job     int
		outcome string
	}
	attempts := map[string]*attempt{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		var l logLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return t, fmt.Errorf("send log %s, line %d: %w; the counts cannot be trusted without it", path, n, err)
		}
		if l.Half != half {
			continue
		}
		if l.Job < 0 || l.Job >= len(jobs) {
			return t, fmt.Errorf("send log %s, line %d: job %d is not one of this run's %d", path, n, l.Job, len(jobs))
		}
		a := attempts[l.Attempt]
		if a == nil {
			a = &attempt{job: l.Job}
			attempts[l.Attempt] = a
		}
		if l.Event != logAttempt {
			a.outcome = l.Event
		}
	}
	if err := sc.Err(); err != nil {
		return t, fmt.Errorf("read the send log: %w", err)
	}
	for _, a := range attempts {
		switch a.outcome {
		case logAccepted:
			t.accepted[a.job]++
		case logNotAccepted:
		default: // no outcome line, or unsure
			t.unknown[a.job]++
		}
	}
	return t, nil
}
