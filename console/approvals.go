package console

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/view"
)

// Approval gates (once.KindPolicy.Approval): the approvals queue lists
// the actions that wait for a person before they run, and the action
// page of one carries the Approve and Reject form. Every decision goes
// through Client.Approve or Client.Reject, fenced by the attempt and the
// payload the page showed.

const (
	// approvalsPage is how many actions an approvals page shows unless
	// its limit says otherwise; approvalsLimit is the most it may say.
	// Each reads its payload for the preview, so pages are short.
	approvalsPage  = 50
	approvalsLimit = 200
	// previewBytes bounds the payload an approvals page or
	// /api/approvals shows of each action; the action page shows more.
	previewBytes = 2 << 10
)

// approvalItem is one action of the approvals queue, as a person reads
// it before deciding.
type approvalItem struct {
	// Action is the row without its payload; Preview is the payload's
	// first previewBytes.
	Action  once.Action
	Preview payloadView
	// Origin is the process whose claim asked (host:pid by default).
	Origin string
	// Expired says the wait expired, by the database's clock: a
	// decision now is refused.
	Expired bool
	// json is the action as /api/approvals shows it, its payload cut
	// to previewBytes.
	json view.Action
}

// approvalQueue reads up to size actions awaiting approval after the
// cursor, oldest first, each with its payload preview, the origin of
// the claim that asked and whether its wait expired. More says there
// are more after them. Each action is read again in full for its
// preview, one at a time, so a page holds at most one payload at once;
// one that was decided or purged meanwhile is left out.
func (s *server) approvalQueue(ctx context.Context, after reviewCursor, size int) (items []approvalItem, more bool, last reviewCursor, err error) {
	acts, err := s.reviewAfter(ctx, once.StatusAwaitingApproval, after, size+1)
	if err != nil {
		return nil, false, last, err
	}
	if more = len(acts) > size; more {
		acts = acts[:size]
	}
	if len(acts) == 0 {
		return nil, false, last, nil
	}
	l := acts[len(acts)-1]
	last = reviewCursor{at: l.UpdatedAt, key: l.Key}
	expired, err := s.expiredAmong(ctx, acts)
	if err != nil {
		return nil, false, last, err
	}
	for _, brief := range acts {
		a, err := s.client.Get(ctx, brief.Key)
		switch {
		case errors.Is(err, once.ErrNotFound):
			continue
		case err != nil:
			return nil, false, last, err
		case a.Status != once.StatusAwaitingApproval:
			continue
		}
		it := approvalItem{Action: a, Expired: expired[a.Key], Preview: cutPayload(a.Payload, previewBytes)}
		it.json = view.CutPayload(view.FromAction(a, nil), a, previewBytes)
		// Nothing may keep the whole payload alive past this one: a
		// cut one's bytes are copied out of it.
		it.json.PayloadBase64 = bytes.Clone(it.json.PayloadBase64)
		it.Action.Payload = nil
		if it.Origin, err = s.askedBy(ctx, a.Key); err != nil {
			return nil, false, last, err
		}
		items = append(items, it)
	}
	return items, more, last, nil
}

// expiredAmong says which of acts (oldest first, as a queue page lists
// them) have an expired wait, by the database's clock: the clock the
// decision is fenced by, so a page never offers a decision it will
// refuse, whatever this machine's clock says. One read covers the page:
// the expired waits last updated within its span.
func (s *server) expiredAmong(ctx context.Context, acts []once.Action) (map[once.Key]bool, error) {
	out := map[once.Key]bool{}
	if len(acts) == 0 {
		return out, nil
	}
	exp, err := s.client.List(ctx, once.Filter{Status: once.StatusAwaitingApproval, Expired: true, OldestFirst: true,
		Since: acts[0].UpdatedAt, Before: acts[len(acts)-1].UpdatedAt.Add(time.Millisecond), Limit: reviewRead, Brief: true})
	if err != nil {
		return nil, err
	}
	for _, a := range exp {
		out[a.Key] = true
	}
	return out, nil
}

// waitExpired says whether the wait of the action key expired, by the
// database's clock.
func (s *server) waitExpired(ctx context.Context, key once.Key) (bool, error) {
	n, err := s.client.Count(ctx, once.Filter{Status: once.StatusAwaitingApproval, Expired: true, KeyPrefix: string(key)})
	return n > 0, err
}

// askedBy is the origin of the claim that wrote the action's wait: its
// trail's first event.
func (s *server) askedBy(ctx context.Context, key once.Key) (string, error) {
	p, err := s.client.EventPage(ctx, once.EventQuery{Key: key, Limit: 1})
	if err != nil {
		return "", err
	}
	for _, e := range p.Events {
		if e.Type == once.EventClaimed {
			return e.Origin, nil
		}
	}
	return "", nil
}

// queueQuery reads a queue page's limit and cursor (after), as the
// review and approvals pages and /api/approvals take them.
func queueQuery(q url.Values, def, most int) (int, reviewCursor, error) {
	size := def
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > most {
			return size, reviewCursor{}, fmt.Errorf("limit %q must be a whole number from 1 to %d", l, most)
		}
		size = n
	}
	var after reviewCursor
	if v := q.Get("after"); v != "" {
		var err error
		if after, err = parseCursor(v); err != nil {
			return size, after, err
		}
	}
	return size, after, nil
}

type approvalsData struct {
	Items []approvalItem
	// Total is how many actions await approval, and Expired how many of
	// them waited past their expiry, by the database's clock.
	Total, Expired int64
	// First is the first page's URL on a later one; Next the next
	// page's when there are more.
	First, Next string
}

// approvals lists the actions that wait for a person's approval, oldest
// first, a page at a time: what will happen (kind, target, a preview of
// the payload), who asked, since when and until when. The decision is
// taken on the action's page, beside its whole payload.
func (s *server) approvals(w http.ResponseWriter, r *http.Request) {
	var d approvalsData
	size, after, err := queueQuery(r.URL.Query(), approvalsPage, approvalsLimit)
	if err != nil {
		d.First = s.path("/approvals")
		s.render(w, r, http.StatusBadRequest, "approvals", page{Title: "Approvals", Nav: "approvals", Error: err.Error(), Data: d})
		return
	}
	ctx := r.Context()
	if d.Total, err = s.client.Count(ctx, once.Filter{Status: once.StatusAwaitingApproval}); err == nil {
		d.Expired, err = s.client.Count(ctx, once.Filter{Status: once.StatusAwaitingApproval, Expired: true})
	}
	if err != nil {
		s.renderError(w, r, http.StatusInternalServerError, "Store unavailable", "Counting the approvals queue failed: "+err.Error())
		return
	}
	items, more, last, err := s.approvalQueue(ctx, after, size)
	if err != nil {
		s.renderError(w, r, http.StatusInternalServerError, "Store unavailable", "Reading the approvals queue failed: "+err.Error())
		return
	}
	d.Items = items
	link := s.queueLink("/approvals", size, approvalsPage)
	if !after.at.IsZero() {
		d.First = link(reviewCursor{})
	}
	if more {
		d.Next = link(last)
	}
	s.render(w, r, http.StatusOK, "approvals", page{Title: "Approvals", Nav: "approvals", Data: d})
}

// approvalInput is a decision on an approval as a form or the API sent
// it. Attempt and Fingerprint, if set, are the attempt and payload the
// caller looked at: the decision applies only while the action still
// stands there.
type approvalInput struct {
	Note        string `json:"note"`
	By          string `json:"by"`
	Attempt     int    `json:"attempt,omitempty"`
	Fingerprint string `json:"fingerprint,omitempty"`
	// Since is when the wait looked at began (the queue's "since"), in
	// RFC 3339: a wait after a purge has the same attempt and payload.
	Since string `json:"since,omitempty"`
}

// decide approves (or, with reject, rejects) the action key as in
// says, through Client.Approve or Client.Reject, via the surface named,
// and says which HTTP status the outcome is: 200, 400 (bad input, and
// the field), 404, 409 (another decided first, the wait expired, or the
// action moved on), 503 (the request was cancelled or timed out) or
// 500. The client checks the input before any I/O.
func (s *server) decide(ctx context.Context, key once.Key, in approvalInput, reject bool, via string) (once.Action, int, string, error) {
	var since time.Time
	if in.Since != "" {
		t, err := time.Parse(time.RFC3339Nano, in.Since)
		if err != nil || len(in.Since) > 64 {
			return once.Action{}, http.StatusBadRequest, "Since", fmt.Errorf("since %.64q is not a time in RFC 3339 (as the approvals queue gives it); send it as given, or leave it out", in.Since)
		}
		since = t
	}
	d := once.Approval{
		Since: since,
		// Browsers send textarea line breaks as CRLF.
		Note:        strings.TrimSpace(strings.ReplaceAll(in.Note, "\r\n", "\n")),
		By:          cmp.Or(strings.TrimSpace(in.By), defaultBy),
		Attempt:     in.Attempt,
		Fingerprint: once.Fingerprint(in.Fingerprint),
		Via:         via,
	}
	op, decideFn := "approve", s.client.Approve
	if reject {
		op, decideFn = "reject", s.client.Reject
	}
	a, err := decideFn(ctx, key, d)
	var conflict *once.ConflictError
	var bad *once.ResolutionError
	switch {
	case err == nil:
		s.log.Info("console: "+op+"d", "key", key, "by", d.By, "via", via, "status", a.Status)
		return a, http.StatusOK, "", nil
	case errors.As(err, &bad):
		return a, http.StatusBadRequest, bad.Field, refusal(err)
	case errors.Is(err, once.ErrNotFound):
		return a, http.StatusNotFound, "", fmt.Errorf("no action has the key %q; give the whole key, as the approvals queue lists it", key)
	case errors.As(err, &conflict):
		return conflict.Current, http.StatusConflict, "", err
	case ctx.Err() != nil:
		return a, http.StatusServiceUnavailable, "", err
	default:
		s.log.Error("console: "+op+" failed", "key", key, "err", err)
		return a, http.StatusInternalServerError, "", err
	}
}

// approvalForm takes an Approve (or, with reject, Reject) from the
// action page's form, as resolveForm takes a resolution: CSRF checked,
// the attempt and the fingerprint the page showed passed on, a 303 to
// the form's next page on success, and on a refusal the action again
// with the reason and what the person typed.
func (s *server) approvalForm(reject bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
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
		in := approvalInput{Note: r.PostFormValue("note"), By: r.PostFormValue("by"), Fingerprint: r.PostFormValue("fingerprint"), Since: r.PostFormValue("since")}
		if v := r.PostFormValue("attempt"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				s.renderError(w, r, http.StatusBadRequest, "Bad request", "The form's attempt is not a number; reload the page and decide again.")
				return
			}
			in.Attempt = n
		}
		a, code, _, err := s.decide(r.Context(), key, in, reject, "console")
		switch code {
		case http.StatusOK:
			msg := fmt.Sprintf("Action %s approved by %s: the next delivery of its job runs it, once.", view.ShortKey(key), a.ResolvedBy)
			if reject {
				msg = fmt.Sprintf("Action %s rejected by %s: it does not run, and every duplicate is told why (now %s).", view.ShortKey(key), a.ResolvedBy, a.Status)
			}
			s.setFlash(w, r, msg)
			http.Redirect(w, r, next, http.StatusSeeOther)
		case http.StatusNotFound:
			s.notFound(w, r, key)
		case http.StatusInternalServerError:
			s.renderError(w, r, code, "Decision failed", err.Error())
		default:
			// The page shows the action as it stands now; what the
			// person typed is kept, the attempt and payload are the
			// page's own again.
			s.showAction(w, r, key, code, err.Error(), formView{Next: next, Note: in.Note, By: in.By})
		}
	}
}
