package idemhttp

import (
	"bytes"
	"fmt"
	"io"
	"net/http"

	"github.com/oncehq/once"
)

// maxErrorBody bounds how much of a provider's answer a StatusError
// quotes.
const maxErrorBody = 512

// StatusError is a provider's answer that was not a success, as Outcome
// reports it.
type StatusError struct {
	// Method and URL name the request: the URL without its query or
	// user information, which may hold secrets.
	Method string
	URL    string
	// StatusCode and Status are the answer's ("402 Payment Required").
	StatusCode int
	Status     string
	// Body is the start of the answer's body, at most 512 bytes.
	Body []byte
}

func (e *StatusError) Error() string {
	body := ""
	if len(e.Body) > 0 {
		body = fmt.Sprintf(": %q", e.Body)
	}
	return fmt.Sprintf("%s %s answered %s%s", e.Method, e.URL, e.Status, body)
}

// Outcome says what a provider's answer to a call an effect made means
// for once.Do: resp and err are what http.Client.Do returned, and the
// effect returns what Outcome does when it is not nil.
//
//   - a 2xx: nil, a success; read the body as usual;
//   - a 4xx the provider would give again (400, 402, 404, 422, …):
//     once.Permanent(*StatusError): the call did not happen and never
//     will, the action fails for good, and every duplicate gets the
//     failure;
//   - 408, 409 (a provider that honours the key is still running its
//     first request), 425, 429, a 5xx, or a 1xx or 3xx that reached
//     the effect: a *StatusError, unmarked: an unknown outcome, since the
//     provider may have acted;
//   - a transport error (no answer, a timeout, a refused connection):
//     err, unmarked, unknown too. Even a refused connection: Go's client
//     resends a request that carries an Idempotency-Key by itself when
//     the connection it went out on broke, so the request may have
//     arrived before the refusal.
//
// An unknown outcome is what the action's kind recovery decides, never
// a guess: RetryWithProviderKey releases it, and the next delivery makes
// the call again with the same key, which a provider that honours it
// absorbs; AskPerson (the default) puts it up for a person's review;
// VerifyThenDecide asks the kind's verifier. Use RetryWithProviderKey for
// a provider that honours Idempotency-Key.
//
// Outcome reads at most 512 bytes of a failed answer's body, for the
// error's message, and leaves resp.Body whole to read and to close.
func Outcome(resp *http.Response, err error) error {
	if err != nil {
		return fmt.Errorf("the call may have reached the provider, and no answer came: %w", err)
	}
	code := resp.StatusCode
	if code >= 200 && code < 300 {
		return nil
	}
	se := &StatusError{StatusCode: code, Status: resp.Status}
	if req := resp.Request; req != nil && req.URL != nil {
		u := *req.URL
		u.User, u.RawQuery, u.ForceQuery, u.Fragment, u.RawFragment = nil, "", false, "", ""
		se.Method, se.URL = req.Method, u.String()
	}
	if resp.Body != nil {
		head, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		se.Body = head
		resp.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(head), resp.Body), resp.Body}
	}
	switch {
	case code == http.StatusRequestTimeout, code == http.StatusConflict, code == http.StatusTooEarly, code == http.StatusTooManyRequests:
		return se
	case code >= 400 && code < 500:
		return once.Permanent(se)
	}
	return se
}
