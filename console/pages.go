package console

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/view"
)

// recoveryEvents are the events the overview lists as recent recoveries:
// what the reaper, the verifiers and people did with unknown outcomes.
var recoveryEvents = []once.EventType{
	once.EventReview, once.EventReleased, once.EventTakenOver, once.EventVerified,
	once.EventVerifyFailed, once.EventResolved, once.EventRefused, once.EventRedriven,
}

const (
	// defaultLimit is how many actions a list shows unless its limit
	// says otherwise; maxLimit is the most it may say (a larger one is
	// refused, naming it). Lists read no payload or result.
	defaultLimit = 100
	maxLimit     = 1000
	// reviewRead bounds the reads a review page grows to, to step past
	// the actions at its cursor's instant (reviewAfter).
	reviewRead = 10000
	// reviewPage is how many actions a review page shows, unless its
	// limit says otherwise; reviewLimit is the most it may say.
	reviewPage  = 100
	reviewLimit = 500
	// waitingLimit bounds the overview's list of released actions that
	// wait for a delivery.
	waitingLimit = 50
)

type overviewData struct {
	Counts   counts
	Statuses []once.Status
	Backlog  int64
	Unknown  int64
	// Approvals is how many actions await a person's approval.
	Approvals int64
	Recent    []once.Event
	// Waiting are released actions no delivery has claimed within their
	// kind's RedriveAfter: they run only if their job comes again.
	Waiting []once.Action
	// Reaper is nil when the console has no reaper to show.
	Reaper *reaperView
}

// reaperView is the reaper's last pass, if it has made one.
type reaperView struct {
	Pass ReaperPass
	Seen bool
}

func (s *server) overview(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	// The last pass first, the counts after: a pass that ends in
	// between is then missing from the page, not shown beside counts
	// from before it (the actions it took to review still counted in
	// flight).
	var rv *reaperView
	if s.reaper != nil {
		pass, seen := s.reaper.Last()
		rv = &reaperView{Pass: pass, Seen: seen}
	}
	st, err := s.client.Stats(ctx)
	if err != nil {
		s.renderError(w, r, http.StatusInternalServerError, "Store unavailable", "Reading the action counts failed: "+err.Error())
		return
	}
	recent, err := s.client.RecentEvents(ctx, recoveryEvents, 20)
	if err != nil {
		s.renderError(w, r, http.StatusInternalServerError, "Store unavailable", "Reading recent recoveries failed: "+err.Error())
		return
	}
	waiting, err := s.client.List(ctx, once.Filter{Waiting: true, OldestFirst: true, Limit: waitingLimit, Brief: true})
	if err != nil {
		s.renderError(w, r, http.StatusInternalServerError, "Store unavailable", "Reading released actions failed: "+err.Error())
		return
	}
	c := tally(st)
	d := overviewData{Counts: c, Statuses: once.Statuses(), Backlog: c.ByStatus[once.StatusReview], Unknown: c.ByStatus[once.StatusUnknown], Recent: recent, Waiting: waiting,
		Approvals: c.ByStatus[once.StatusAwaitingApproval], Reaper: rv}
	s.render(w, r, http.StatusOK, "overview", page{Title: "Overview", Nav: "overview", Data: d})
}

// listForm is the actions filter as the user typed it, echoed back into
// the form.
type listForm struct {
	Status string
	Kind   string
	Run    string
	Limit  int
}

// parseFilter reads status, kind, run and limit from a query, shared by
// the page and the API so they accept exactly the same input.
func parseFilter(q url.Values) (once.Filter, listForm, error) {
	lf := listForm{Status: q.Get("status"), Kind: q.Get("kind"), Run: q.Get("run"), Limit: defaultLimit}
	f := once.Filter{Status: once.Status(lf.Status), Kind: lf.Kind, Run: lf.Run, Limit: defaultLimit, Brief: true}
	if lf.Status != "" && !f.Status.Valid() {
		return f, lf, fmt.Errorf("status %q is not one of %s", lf.Status, view.StatusList())
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > maxLimit {
			return f, lf, fmt.Errorf("limit %q must be a whole number from 1 to %d", l, maxLimit)
		}
		f.Limit, lf.Limit = n, n
	}
	return f, lf, nil
}

type actionsData struct {
	Form     listForm
	Statuses []once.Status
	Actions  []once.Action
	// Limited says the list stopped at the limit: there may be more.
	Limited bool
}

func (s *server) actions(w http.ResponseWriter, r *http.Request) {
	f, lf, err := parseFilter(r.URL.Query())
	d := actionsData{Form: lf, Statuses: once.Statuses()}
	if err != nil {
		s.render(w, r, http.StatusBadRequest, "actions", page{Title: "Actions", Nav: "actions", Error: err.Error(), Data: d})
		return
	}
	d.Actions, err = s.client.List(r.Context(), f)
	if err != nil {
		s.renderError(w, r, http.StatusInternalServerError, "Store unavailable", "Listing actions failed: "+err.Error())
		return
	}
	d.Limited = len(d.Actions) >= f.Limit
	s.render(w, r, http.StatusOK, "actions", page{Title: "Actions", Nav: "actions", Data: d})
}

// formView is a resolve form: where it posts, where it returns, and what
// the user typed, kept when the form comes back with an error.
type formView struct {
	Key once.Key
	// Attempt is the attempt the page showed, and Fingerprint its
	// payload (for an approval); the decision applies only while the
	// action still stands there.
	Attempt     int
	Fingerprint once.Fingerprint
	// Since is when the wait the page showed began (an approval), in
	// RFC 3339 with nanoseconds: a wait after a purge has the same
	// attempt and payload, and only its beginning tells it apart.
	Since string
	// RejectOnly leaves Approve out of an approval's form: the page
	// could not print the whole payload Approve would apply to.
	RejectOnly bool
	// NeverRan leaves Done out of a review's form: the action is a
	// gated one whose wait expired, and it never ran.
	NeverRan bool
	CSRF     string
	Next     string
	Note     string
	By       string
	Result   string
}

type actionData struct {
	Action once.Action
	Events []once.Event
	// Total is how many events the trail holds; Newest says the page
	// lists them newest first. Next is the next page's URL, when there
	// is one; First the first page's, on a later one; Flip the first
	// page's in the other order.
	Total             int64
	Newest            bool
	Next, First, Flip string
	Form              formView
	// Payload is the action's payload as the page prints it: whole, for
	// an action awaiting approval, up to maxApprovalShown.
	Payload payloadView
	// Approvable says the page may offer Approve: the action awaits
	// approval and its payload is printed whole. Approve applies to all
	// of it, so it is never offered beside a payload that is cut.
	Approvable bool
	// Expired says the action's wait for approval expired, by the
	// database's clock: the page offers no decision the client would
	// refuse.
	Expired bool
}

// trailPage is how many events of its trail an action's page shows.
const trailPage = 100

// trailQuery reads which page of a trail a request asks for: after the
// event events_after names, newest first when events=newest.
func trailQuery(key once.Key, q url.Values) (once.EventQuery, error) {
	eq := once.EventQuery{Key: key, Limit: trailPage, Newest: q.Get("events") == "newest"}
	if v := q.Get("events"); v != "" && v != "newest" && v != "oldest" {
		return eq, fmt.Errorf("events %q is not newest or oldest", v)
	}
	if v := q.Get("events_after"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			return eq, fmt.Errorf("events_after %q is not an event's number; follow the page's links", v)
		}
		eq.After = n
	}
	return eq, nil
}

// trailURL is the URL of a page of key's trail.
func (s *server) trailURL(key once.Key, newest bool, after int64) string {
	v := url.Values{}
	if after > 0 {
		v.Set("events_after", strconv.FormatInt(after, 10))
	}
	if newest {
		v.Set("events", "newest")
	}
	if len(v) == 0 {
		return s.actionURL(key)
	}
	return s.actionURL(key) + "?" + v.Encode()
}

func (s *server) action(w http.ResponseWriter, r *http.Request) {
	key := once.Key(r.PathValue("key"))
	s.showAction(w, r, key, http.StatusOK, "", formView{Key: key, Next: s.actionURL(key)})
}

// showAction renders an action's page, with msg shown as an error when a
// resolution was refused.
func (s *server) showAction(w http.ResponseWriter, r *http.Request, key once.Key, code int, msg string, form formView) {
	ctx := r.Context()
	// The key, or 8 or more of its first characters, as `once show`
	// takes them and every list prints them.
	a, err := s.client.Find(ctx, string(key))
	switch {
	case errors.Is(err, once.ErrNotFound), errors.Is(err, once.ErrNotAKey):
		s.notFound(w, r, key)
		return
	case errors.Is(err, once.ErrAmbiguousKey):
		s.renderError(w, r, http.StatusBadRequest, "More than one action",
			fmt.Sprintf("More than one key starts with %q; give more of it, or the whole key.", key))
		return
	case err != nil:
		s.renderError(w, r, http.StatusInternalServerError, "Store unavailable", "Reading the action failed: "+err.Error())
		return
	}
	key = a.Key
	eq, qerr := trailQuery(key, r.URL.Query())
	if qerr != nil {
		eq = once.EventQuery{Key: key, Limit: trailPage}
		code, msg = http.StatusBadRequest, qerr.Error()
	}
	trail, err := s.client.EventPage(ctx, eq)
	if err != nil {
		s.renderError(w, r, http.StatusInternalServerError, "Store unavailable", "Reading the action's trail failed: "+err.Error())
		return
	}
	d := actionData{Action: a, Events: trail.Events, Total: trail.Total, Newest: eq.Newest, Flip: s.trailURL(key, !eq.Newest, 0)}
	if a.Status == once.StatusAwaitingApproval {
		d.Payload = cutPayload(a.Payload, maxApprovalShown)
		d.Approvable = d.Payload.Cut == 0
	} else {
		d.Payload = showPayload(a.Payload)
	}
	if trail.Next != 0 {
		d.Next = s.trailURL(key, eq.Newest, trail.Next)
	}
	if eq.After != 0 {
		d.First = s.trailURL(key, eq.Newest, 0)
	}
	form.Key = key
	if form.Attempt == 0 {
		form.Attempt = a.Attempt
	}
	if form.Fingerprint == "" {
		form.Fingerprint = a.Fingerprint
	}
	if form.Since == "" && a.Status == once.StatusAwaitingApproval {
		form.Since = a.CreatedAt.UTC().Format(time.RFC3339Nano)
	}
	form.RejectOnly = a.Status == once.StatusAwaitingApproval && !d.Approvable
	form.NeverRan = a.NeverRan()
	d.Form = form
	if a.Status == once.StatusAwaitingApproval {
		if d.Expired, err = s.waitExpired(ctx, key); err != nil {
			s.renderError(w, r, http.StatusInternalServerError, "Store unavailable", "Reading the action's expiry failed: "+err.Error())
			return
		}
	}
	s.render(w, r, code, "action", page{Title: "Action " + view.ShortKey(key), Nav: "actions", Error: msg, Data: d})
}

func (s *server) notFound(w http.ResponseWriter, r *http.Request, key once.Key) {
	s.renderError(w, r, http.StatusNotFound, "No such action",
		fmt.Sprintf("No action has the key %q. Give the key, or at least 8 of its first characters; a finished action may also have been purged after its kind's retention.", key))
}

type runData struct {
	Run   string
	Steps []once.Action
	// Total is how many steps the run has; Next is the next page's URL
	// when there are more, First the first page's on a later one.
	Total       int64
	Next, First string
}

// runPage is how many steps a run's page shows unless its limit says
// otherwise; the most it may say is maxLimit.
const runPage = 100

// runQuery is the page of a run a request asks for: limit steps after
// the cursor (step.key) of the page before.
type runQuery struct {
	afterStep int64
	afterKey  once.Key
	limit     int
}

func parseRunQuery(q url.Values) (runQuery, error) {
	rq := runQuery{limit: runPage}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxLimit {
			return rq, fmt.Errorf("limit %q must be a whole number from 1 to %d", v, maxLimit)
		}
		rq.limit = n
	}
	if v := q.Get("after"); v != "" {
		step, key, ok := strings.Cut(v, ".")
		n, err := strconv.ParseInt(step, 10, 64)
		if !ok || err != nil || key == "" || strings.Trim(key, "0123456789abcdef") != "" {
			return rq, fmt.Errorf("after %q is not a run page's cursor; start again from the first page", v)
		}
		rq.afterStep, rq.afterKey = n, once.Key(key)
	}
	return rq, nil
}

// runCursor is where the page after p starts, "" on the last page.
func runCursor(p once.RunPage) string {
	if !p.More || len(p.Steps) == 0 {
		return ""
	}
	last := p.Steps[len(p.Steps)-1]
	return strconv.FormatInt(last.Step, 10) + "." + string(last.Key)
}

func (s *server) run(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("run")
	rq, err := parseRunQuery(r.URL.Query())
	if err != nil {
		s.renderError(w, r, http.StatusBadRequest, "Bad request", err.Error())
		return
	}
	p, err := s.client.RunPage(r.Context(), id, rq.afterStep, rq.afterKey, rq.limit)
	if err != nil {
		s.renderError(w, r, http.StatusInternalServerError, "Store unavailable", "Reading the run failed: "+err.Error())
		return
	}
	if p.Total == 0 {
		s.renderError(w, r, http.StatusNotFound, "No such run", fmt.Sprintf("No actions belong to the run %q.", id))
		return
	}
	d := runData{Run: id, Steps: p.Steps, Total: p.Total}
	link := func(after string) string {
		v := url.Values{}
		if after != "" {
			v.Set("after", after)
		}
		if rq.limit != runPage {
			v.Set("limit", strconv.Itoa(rq.limit))
		}
		u := s.runURL(id)
		if len(v) == 0 {
			return u
		}
		if strings.Contains(u, "?") {
			return u + "&" + v.Encode()
		}
		return u + "?" + v.Encode()
	}
	if c := runCursor(p); c != "" {
		d.Next = link(c)
	}
	if rq.afterKey != "" {
		d.First = link("")
	}
	s.render(w, r, http.StatusOK, "run", page{Title: "Run " + id, Nav: "actions", Data: d})
}

type reviewData struct {
	Items []once.Action
	// Total is how many wait in all, and InReview and Unknown how many of
	// each, from the store's counts.
	Total, InReview, Unknown int64
	// Self is this page's URL, where a decision returns; First is the
	// first page's when this is a later one; Next is the next page's when
	// there are more.
	Self, First, Next string
}

// reviewCursor is where a queue page (review, approvals) starts: after
// the action last updated at at with key key, in the order (updated_at,
// key) the store lists by. The zero cursor is the start of the queue.
type reviewCursor struct {
	at  time.Time
	key once.Key
}

func (c reviewCursor) String() string {
	return strconv.FormatInt(c.at.UnixNano(), 10) + "-" + string(c.key)
}

func parseCursor(v string) (reviewCursor, error) {
	ns, key, ok := strings.Cut(v, "-")
	n, err := strconv.ParseInt(ns, 10, 64)
	if !ok || err != nil || key == "" || strings.Trim(key, "0123456789abcdef") != "" {
		return reviewCursor{}, fmt.Errorf("after %q is not a queue page's cursor; start again from the first page", v)
	}
	return reviewCursor{at: time.Unix(0, n), key: once.Key(key)}, nil
}

// before says whether a comes after the cursor.
func (c reviewCursor) before(a once.Action) bool {
	if c.at.IsZero() {
		return true
	}
	if d := cmp.Compare(a.UpdatedAt.UnixNano(), c.at.UnixNano()); d != 0 {
		return d > 0
	}
	return a.Key > c.key
}

func compareReview(a, b once.Action) int {
	return cmp.Or(cmp.Compare(a.UpdatedAt.UnixNano(), b.UpdatedAt.UnixNano()), cmp.Compare(a.Key, b.Key))
}

// review lists what waits for a person, oldest first, a page at a time:
// actions in review, and those with an unknown outcome, which a person
// may also settle. A page starts after the cursor its link carries, so
// a decision taken meanwhile neither skips nor repeats an action.
func (s *server) review(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	d := reviewData{First: s.path("/review")}
	fail := func(msg string) {
		s.render(w, r, http.StatusBadRequest, "review", page{Title: "Review queue", Nav: "review", Error: msg, Data: d})
	}
	size, after, err := queueQuery(q, reviewPage, reviewLimit)
	if err != nil {
		fail(err.Error())
		return
	}
	st, err := s.client.Stats(r.Context())
	if err != nil {
		s.renderError(w, r, http.StatusInternalServerError, "Store unavailable", "Reading the action counts failed: "+err.Error())
		return
	}
	c := tally(st)
	d.InReview, d.Unknown = c.ByStatus[once.StatusReview], c.ByStatus[once.StatusUnknown]
	d.Total = d.InReview + d.Unknown
	for _, status := range []once.Status{once.StatusReview, once.StatusUnknown} {
		acts, err := s.reviewAfter(r.Context(), status, after, size+1)
		if err != nil {
			s.renderError(w, r, http.StatusInternalServerError, "Store unavailable", "Reading the review queue failed: "+err.Error())
			return
		}
		d.Items = append(d.Items, acts...)
	}
	slices.SortFunc(d.Items, compareReview)
	link := s.queueLink("/review", size, reviewPage)
	d.Self, d.First = link(after), ""
	if !after.at.IsZero() {
		d.First = link(reviewCursor{})
	}
	if len(d.Items) > size {
		d.Items = d.Items[:size]
		last := d.Items[size-1]
		d.Next = link(reviewCursor{at: last.UpdatedAt, key: last.Key})
	}
	s.render(w, r, http.StatusOK, "review", page{Title: "Review queue", Nav: "review", Data: d})
}

// reviewAfter lists up to n actions with status that come after the
// cursor, oldest first. The store filters by time only (Since is
// inclusive), so the actions at the cursor's own instant up to its key
// are read and dropped: the read grows until n remain or the store runs
// out, up to reviewRead rows.
func (s *server) reviewAfter(ctx context.Context, status once.Status, after reviewCursor, n int) ([]once.Action, error) {
	for limit := n; ; limit = min(limit*4, reviewRead) {
		acts, err := s.client.List(ctx, once.Filter{Status: status, OldestFirst: true, Since: after.at, Limit: limit, Brief: true})
		if err != nil {
			return nil, err
		}
		out := slices.DeleteFunc(acts, func(a once.Action) bool { return !after.before(a) })
		if len(out) >= n || len(acts) < limit || limit >= reviewRead {
			return out[:min(n, len(out))], nil
		}
	}
}

// resolveForm takes a decision from a page form. On success it redirects
// (303, so a reload does not post again) to the form's next page; on bad
// input or a conflict it shows the action again with the reason and what
// the user typed.
func (s *server) resolveForm(w http.ResponseWriter, r *http.Request) {
	key := once.Key(r.PathValue("key"))
	if err := r.ParseForm(); err != nil {
		s.renderError(w, r, http.StatusBadRequest, "Bad request", "The form could not be read: "+err.Error())
		return
	}
	if err := s.checkCSRF(r); err != nil {
		s.forbidden(w, r, err.Error())
		return
	}
	next := r.PostFormValue("next")
	if !s.safeNext(next) {
		next = s.actionURL(key)
	}
	in := resolveInput{
		Decision: r.PostFormValue("decision"),
		Note:     r.PostFormValue("note"),
		By:       r.PostFormValue("by"),
		Result:   []byte(strings.TrimSpace(r.PostFormValue("result"))),
	}
	if v := r.PostFormValue("attempt"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			s.renderError(w, r, http.StatusBadRequest, "Bad request", "The form's attempt is not a number; reload the page and decide again.")
			return
		}
		in.Attempt = n
	}
	a, code, err := s.resolve(r.Context(), key, in)
	switch code {
	case http.StatusOK:
		s.setFlash(w, r, fmt.Sprintf("Action %s: %s (now %s).", view.ShortKey(key), decisionWords(in.Decision), a.Status))
		http.Redirect(w, r, next, http.StatusSeeOther)
	case http.StatusNotFound:
		s.notFound(w, r, key)
	case http.StatusInternalServerError:
		s.renderError(w, r, code, "Resolution failed", err.Error())
	default:
		// The page shows the action as it stands now, and so does the
		// form it carries (a newer attempt is decided afresh).
		s.showAction(w, r, key, code, err.Error(), formView{Next: next, Note: in.Note, By: in.By, Result: string(in.Result)})
	}
}

// decisionWords says what a decision did, for the notice after it.
func decisionWords(decision string) string {
	switch d, _ := parseDecision(decision); d {
	case once.DecisionDone:
		return "marked done"
	case once.DecisionRetry:
		return "released for retry"
	case once.DecisionAbandon:
		return "abandoned"
	}
	return decision
}

// queueLink returns the link to a page of the queue at path (the review
// queue, the approvals) that starts after a cursor, with size rows when
// that is not the page's own, size by default.
func (s *server) queueLink(path string, size, byDefault int) func(reviewCursor) string {
	return func(c reviewCursor) string {
		v := url.Values{}
		if !c.at.IsZero() {
			v.Set("after", c.String())
		}
		if size != byDefault {
			v.Set("limit", strconv.Itoa(size))
		}
		if len(v) == 0 {
			return s.path(path)
		}
		return s.path(path + "?" + v.Encode())
	}
}
