package console

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/oncehq/once"
)

// defaultBy names the decider when the form leaves it empty: the trail
// then at least says the decision came through the console.
const defaultBy = "console"

// resolveInput is a decision as a form or the API sent it.
type resolveInput struct {
	Decision string          `json:"decision"`
	Note     string          `json:"note"`
	By       string          `json:"by"`
	Result   json.RawMessage `json:"result"`
	// Attempt, if set, is the attempt the caller looked at; the decision
	// applies only while the action is still at it.
	Attempt int `json:"attempt,omitempty"`
}

// parseDecision reads a decision as a person types or a button sends it.
func parseDecision(s string) (once.Decision, error) {
	d := once.Decision(strings.ToLower(strings.TrimSpace(s)))
	switch d {
	case once.DecisionDone, once.DecisionRetry, once.DecisionAbandon:
		return d, nil
	case "":
		return d, errors.New("no decision: choose done, retry or abandon")
	}
	return d, fmt.Errorf("decision %q is not done, retry or abandon", s)
}

// resolution turns what a form or the API sent into a once.Resolution:
// the decision parsed, text trimmed, the default decider filled in, and
// an empty or null result left out. Whether the resolution is acceptable
// is the client's to say (Client.ValidateResolution).
func resolution(in resolveInput) (once.Resolution, error) {
	d, err := parseDecision(in.Decision)
	if err != nil {
		return once.Resolution{}, err
	}
	res := once.Resolution{
		Decision: d,
		// Browsers send textarea line breaks as CRLF.
		Note:    strings.TrimSpace(strings.ReplaceAll(in.Note, "\r\n", "\n")),
		By:      cmp.Or(strings.TrimSpace(in.By), defaultBy),
		Attempt: in.Attempt,
	}
	if r := bytes.TrimSpace(in.Result); len(r) > 0 && !bytes.Equal(r, []byte("null")) {
		res.Result = r
	}
	return res, nil
}

// resolve checks a decision and hands it to Client.Resolve, and says
// which HTTP status the outcome is: 200, 400 (bad input), 404, 409 (the
// action moved on or is not resolvable), 503 (the request was cancelled
// or timed out) or 500. The input is checked first, with
// Client.ValidateResolution, so that a mistyped form is a 400 with a
// message for the user and never reaches the store.
func (s *server) resolve(ctx context.Context, key once.Key, in resolveInput) (once.Action, int, error) {
	res, err := resolution(in)
	if err == nil {
		err = s.client.ValidateResolution(res)
	}
	if err != nil {
		return once.Action{}, http.StatusBadRequest, refusal(err)
	}
	a, err := s.client.Resolve(ctx, key, res)
	var conflict *once.ConflictError
	switch {
	case err == nil:
		s.log.Info("console: resolved", "key", key, "decision", res.Decision, "by", res.By, "status", a.Status)
		return a, http.StatusOK, nil
	case errors.Is(err, once.ErrNotFound):
		return a, http.StatusNotFound, fmt.Errorf("no action has the key %q", key)
	case errors.As(err, &conflict):
		return conflict.Current, http.StatusConflict, err
	case errors.Is(err, once.ErrInvalidResolution):
		return a, http.StatusBadRequest, refusal(err)
	case ctx.Err() != nil:
		return a, http.StatusServiceUnavailable, err
	default:
		s.log.Error("console: resolving failed", "key", key, "err", err)
		return a, http.StatusInternalServerError, err
	}
}

// refusal words a refused resolution for the person at the form: the
// field as the form labels it and what is wrong with it.
func refusal(err error) error {
	if re, ok := errors.AsType[*once.ResolutionError](err); ok {
		return fmt.Errorf("%s %s", re.Field, re.Reason)
	}
	return err
}
