package console

import (
	"bytes"
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
}

// resolve checks a decision and hands it to Client.Resolve, and says
// which HTTP status the outcome is: 200, 400 (bad input), 404, 409 (the
// action moved on or is not resolvable), 503 (the request was cancelled
// or timed out) or 500. The input is checked
// here, before any I/O, so that a mistyped form is a 400 with a message
// for the user and never reaches the store.
func (s *server) resolve(ctx context.Context, key once.Key, in resolveInput) (once.Action, int, error) {
	res := once.Resolution{
		Decision: once.Decision(strings.ToLower(strings.TrimSpace(in.Decision))),
		// Browsers send textarea line breaks as CRLF.
		Note: strings.TrimSpace(strings.ReplaceAll(in.Note, "\r\n", "\n")),
		By:   strings.TrimSpace(in.By),
	}
	switch res.Decision {
	case once.DecisionDone, once.DecisionRetry, once.DecisionAbandon:
	case "":
		return once.Action{}, http.StatusBadRequest, errors.New("no decision: choose done, retry or abandon")
	default:
		return once.Action{}, http.StatusBadRequest, fmt.Errorf("decision %q is not done, retry or abandon", in.Decision)
	}
	if res.Note == "" {
		return once.Action{}, http.StatusBadRequest, errors.New("a note is required: say why, for the next person who reads the trail")
	}
	if res.By == "" {
		res.By = defaultBy
	}
	if r := bytes.TrimSpace(in.Result); len(r) > 0 && !bytes.Equal(r, []byte("null")) {
		if !json.Valid(r) {
			return once.Action{}, http.StatusBadRequest, errors.New("the result is not valid JSON; leave it empty, or give a JSON value such as {\"id\": \"msg-1\"}")
		}
		if res.Decision != once.DecisionDone {
			return once.Action{}, http.StatusBadRequest, fmt.Errorf("a result is only stored with done, not %s; clear it or choose done", res.Decision)
		}
		res.Result = r
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
		// What the checks above leave to the client: a field over its
		// length limit or not UTF-8, a result over Config.MaxResultBytes.
		return a, http.StatusBadRequest, err
	case ctx.Err() != nil:
		return a, http.StatusServiceUnavailable, err
	default:
		s.log.Error("console: resolving failed", "key", key, "err", err)
		return a, http.StatusInternalServerError, err
	}
}
