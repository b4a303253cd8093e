package demo

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Job is one intent on the queue: send one email to one recipient.
type Job struct {
	ID       int    `json:"id"`
	Run      string `json:"run"`
	Rcpt     string `json:"rcpt"`
	Subject  string `json:"subject"`
	Delivery int    `json:"delivery"`
	// PauseAfterSend asks the worker to stop dead after the SMTP server
	// accepted the message and before anything is recorded, so that it is
	// killed exactly there.
	PauseAfterSend bool `json:"pause_after_send"`
	// PauseBeforeLog stops the worker at the same point, before it logs
	// the server's acceptance too (see Options.KillBeforeLog).
	PauseBeforeLog bool `json:"pause_before_log"`
}

type slot struct {
	job       Job
	acked     bool
	leasedBy  int
	visibleAt time.Time
}

// queue delivers at least once: a job not acknowledged within its
// visibility timeout, or whose worker died, is delivered again.
type queue struct {
	mu         sync.Mutex
	jobs       []*slot
	visibility time.Duration
	acked      int
	onPause    func(worker, pid int)
	onAck      func(acked int)
	srv        *http.Server
	ln         net.Listener
	done       chan struct{}
}

// newQueue starts the queue's HTTP server; the callbacks are set before
// it serves its first request.
func newQueue(jobs []Job, visibility time.Duration, onPause func(worker, pid int), onAck func(acked int)) (*queue, error) {
	q := &queue{visibility: visibility, done: make(chan struct{}), onPause: onPause, onAck: onAck}
	for _, j := range jobs {
		q.jobs = append(q.jobs, &slot{job: j, leasedBy: -1})
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /next", q.next)
	mux.HandleFunc("POST /ack", q.ack)
	mux.HandleFunc("POST /nack", q.nack)
	mux.HandleFunc("POST /pause", q.pause)
	q.ln, q.srv = ln, &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go q.srv.Serve(ln)
	return q, nil
}

func (q *queue) url() string { return "http://" + q.ln.Addr().String() }
func (q *queue) close()      { q.srv.Close() }

func formInt(r *http.Request, name string) int {
	n, _ := strconv.Atoi(r.FormValue(name))
	return n
}

func (q *queue) next(w http.ResponseWriter, r *http.Request) {
	worker := formInt(r, "worker")
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.acked == len(q.jobs) {
		w.WriteHeader(http.StatusGone)
		return
	}
	now := time.Now()
	for _, s := range q.jobs {
		if s.acked || now.Before(s.visibleAt) {
			continue
		}
		s.job.Delivery++
		s.leasedBy, s.visibleAt = worker, now.Add(q.visibility)
		json.NewEncoder(w).Encode(s.job)
		s.job.PauseAfterSend, s.job.PauseBeforeLog = false, false // only ever on the first delivery
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (q *queue) find(id int) *slot {
	if id < 0 || id >= len(q.jobs) {
		return nil
	}
	return q.jobs[id]
}

func (q *queue) ack(w http.ResponseWriter, r *http.Request) {
	q.mu.Lock()
	s := q.find(formInt(r, "id"))
	var n int
	if s != nil && !s.acked {
		s.acked = true
		q.acked++
		n = q.acked
		if q.acked == len(q.jobs) {
			close(q.done)
		}
	}
	q.mu.Unlock()
	if n > 0 && q.onAck != nil {
		q.onAck(n)
	}
}

func (q *queue) nack(w http.ResponseWriter, r *http.Request) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if s := q.find(formInt(r, "id")); s != nil && !s.acked {
		s.leasedBy, s.visibleAt = -1, time.Now().Add(time.Duration(formInt(r, "delay_ms"))*time.Millisecond)
	}
}

func (q *queue) pause(w http.ResponseWriter, r *http.Request) {
	if q.onPause != nil {
		q.onPause(formInt(r, "worker"), formInt(r, "pid"))
	}
}

// workerDied makes the jobs a dead worker held visible again at once, as
// a broker does when a consumer's connection drops.
func (q *queue) workerDied(worker int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, s := range q.jobs {
		if !s.acked && s.leasedBy == worker {
			s.leasedBy, s.visibleAt = -1, time.Now()
		}
	}
}

// pending describes the jobs not yet acknowledged, for a demo that did
// not finish.
func (q *queue) pending() string {
	q.mu.Lock()
	defer q.mu.Unlock()
	var b []string
	for _, s := range q.jobs {
		if !s.acked {
			b = append(b, fmt.Sprintf("job %d (%s, %d deliveries, worker %d)", s.job.ID, s.job.Rcpt, s.job.Delivery, s.leasedBy))
		}
		if len(b) == 5 {
			break
		}
	}
	return strings.Join(b, "; ")
}
