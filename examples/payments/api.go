package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/idemhttp"
)

// kindCreateCharge is the once kind of a POST /charges: its policy (see
// newAPI) says how a charge whose process died is recovered.
const kindCreateCharge = "http:POST /charges"

// defaultTenant is the tenant of a request without an Authorization
// header.
const defaultTenant = "demo"

// maxBody bounds a request body. A charge is three short fields.
const maxBody = 16 << 10

// api is the HTTP API: POST /charges behind the Idempotency-Key
// middleware, and the reads.
type api struct {
	charges *chargeTable
	// hold is how long a charge waits between its write and its answer
	// (--hold-after-charge): zero but to watch a crash in that window.
	hold time.Duration
	log  *slog.Logger
}

// handler routes the API. Every request is authenticated first (it
// names its tenant); a POST /charges is then validated, before the
// idempotency layer, so a malformed body changes nothing, not even the
// key's record: the client fixes the body and sends it again under the
// same key.
func (a *api) handler(client *once.Client) http.Handler {
	idem := idemhttp.Middleware(client, idemhttp.Config{
		// The tenant, from authenticate: one tenant's key never meets
		// another's.
		Scope: func(r *http.Request) string { return "tenant:" + tenantOf(r) },
		Kind:  func(*http.Request) string { return kindCreateCharge },
		// The same charge is the same request, whatever the JSON's
		// spacing, key order or currency case: a repeat that differs
		// only there is answered from the record, one that asks for
		// another charge is refused with 422.
		Fingerprint: func(r *http.Request, body []byte) any {
			req, _, err := parseCharge(body)
			if err != nil {
				return body // not reached: validate refused it
			}
			return req
		},
		MaxBodyBytes: maxBody,
	})
	mux := http.NewServeMux()
	mux.Handle("POST /charges", authenticate(validate(idem(http.HandlerFunc(a.create)))))
	mux.Handle("GET /charges", authenticate(http.HandlerFunc(a.list)))
	mux.Handle("GET /charges/{id}", authenticate(http.HandlerFunc(a.get)))
	return mux
}

// create is POST /charges, run at most once per tenant and key by the
// middleware. It writes the charge to the charges table and answers 201
// with it.
//
// The charge is written here and its answer recorded by the middleware
// after it returns, as two writes. A process that dies between them
// leaves the charge written and its action in flight; the charges
// table's unique (tenant, key) is what makes that safe: the action's
// kind recovers by RetryWithProviderKey, so the client's retry, once the
// dead claim's lease has run out, runs this handler again, whose insert
// finds the charge already there and answers it. The record and the
// table can lag, never contradict each other: a recorded answer names a
// charge that exists, and a key has one charge however often it runs.
func (a *api) create(w http.ResponseWriter, r *http.Request) {
	tenant := tenantOf(r)
	key, err := idemhttp.ParseKey(r.Header.Get(idemhttp.Header)) // the middleware checked it
	if err != nil {
		writeProblem(w, http.StatusBadRequest, "key-malformed", err.Error(), nil)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		writeProblem(w, http.StatusBadRequest, "body-unreadable", "the request body could not be read; send the request again", nil)
		return
	}
	req, _, err := parseCharge(body)
	if err != nil {
		writeProblem(w, http.StatusBadRequest, "body-malformed", err.Error(), nil)
		return
	}
	// The charge is written on the request's context. Behind the
	// middleware it outlives the client: a client that times out and
	// leaves does not cut the write off half-way (which would leave its
	// outcome unknown), and its retry gets the charge. It ends at the
	// kind's MaxExecution (see serve), or when the claim is lost. Work
	// that must not outlive that goes under it; nothing here waits on the
	// client.
	c, found, err := a.charges.create(r.Context(), tenant, key, req)
	switch {
	case errors.Is(err, errKeyReused):
		writeProblem(w, http.StatusUnprocessableEntity, "key-reused", err.Error(), nil)
		return
	case err != nil:
		// The write failed and no charge could be read back under the
		// key. A 5xx releases the key for a retry. That is safe even if
		// the write committed after the read (a statement still on its
		// way to the server): the retry finds the charge instead of
		// making another.
		a.log.Warn("payments: writing a charge failed", "tenant", tenant, "key", key, "err", err)
		w.Header().Set("Retry-After", "1")
		writeProblem(w, http.StatusServiceUnavailable, "charge-not-written", "the charge could not be written, or its write could not be confirmed; retry with the same Idempotency-Key: a retry answers the charge if it was written, and makes it once if it was not", nil)
		return
	}
	if found {
		a.log.Info("payments: charge found, written by an earlier attempt", "id", c.ID, "tenant", tenant, "key", key)
	} else {
		a.log.Info("payments: charge created", "id", c.ID, "tenant", tenant, "key", key, "amount", c.Amount, "currency", c.Currency)
	}
	if a.hold > 0 {
		// Cut short when the request's context ends (its claim was lost
		// to a retry elsewhere, or it ran past MaxExecution; not when the
		// client leaves): the charge is written all the same, so it is
		// the answer, not a 5xx that would call it interrupted and
		// release its key.
		select {
		case <-time.After(a.hold):
		case <-r.Context().Done():
		}
	}
	w.Header().Set("Location", "/charges/"+c.ID)
	writeJSON(w, http.StatusCreated, c)
}

// list is GET /charges: the tenant's charges, oldest first.
func (a *api) list(w http.ResponseWriter, r *http.Request) {
	charges, err := a.charges.list(r.Context(), tenantOf(r))
	if err != nil {
		a.log.Warn("payments: listing charges failed", "err", err)
		w.Header().Set("Retry-After", "1")
		writeProblem(w, http.StatusServiceUnavailable, "unavailable", "the charges could not be read; try again", nil)
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Charges []charge `json:"charges"`
	}{charges})
}

// get is GET /charges/{id}, where a created charge's Location points.
func (a *api) get(w http.ResponseWriter, r *http.Request) {
	c, err := a.charges.get(r.Context(), tenantOf(r), r.PathValue("id"))
	switch {
	case errors.Is(err, sql.ErrNoRows):
		writeProblem(w, http.StatusNotFound, "charge-not-found", "this tenant has no charge with that id", nil)
	case err != nil:
		a.log.Warn("payments: reading a charge failed", "err", err)
		w.Header().Set("Retry-After", "1")
		writeProblem(w, http.StatusServiceUnavailable, "unavailable", "the charge could not be read; try again", nil)
	default:
		writeJSON(w, http.StatusOK, c)
	}
}

type tenantKey struct{}

func tenantOf(r *http.Request) string { return r.Context().Value(tenantKey{}).(string) }

// authenticate names the request's tenant. This example has no
// accounts: "Authorization: Bearer TENANT" stands in for an API key
// (the token is taken as the tenant's name), and a request without the
// header is tenant "demo". A real service takes the tenant from the
// credentials it verified, never from what the client merely asserts.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tenant := defaultTenant
		switch vs := r.Header.Values("Authorization"); len(vs) {
		case 0:
		case 1:
			scheme, token, _ := strings.Cut(vs[0], " ")
			if !strings.EqualFold(scheme, "Bearer") || !isTenant(token) {
				w.Header().Set("WWW-Authenticate", `Bearer realm="payments"`)
				writeProblem(w, http.StatusUnauthorized, "unauthorized", "send Authorization: Bearer TENANT, where TENANT is 1 to 64 letters, digits, '-' or '_' (or no Authorization header, for tenant "+defaultTenant+")", nil)
				return
			}
			tenant = token
		default:
			writeProblem(w, http.StatusUnauthorized, "unauthorized", "the request has more than one Authorization header; send one", nil)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), tenantKey{}, tenant)))
	})
}

func isTenant(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// validate refuses a body that is not a valid charge before anything
// else happens: 400 when it is not a JSON object, 422 with every field
// at fault otherwise, 413 when it is over maxBody.
func validate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
		if err != nil {
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				writeProblem(w, http.StatusRequestEntityTooLarge, "body-too-large", fmt.Sprintf("the body is over %d bytes; a charge is three short fields", maxBody), nil)
				return
			}
			writeProblem(w, http.StatusBadRequest, "body-unreadable", "the request body could not be read; send the request again", nil)
			return
		}
		_, faults, err := parseCharge(body)
		switch {
		case err != nil:
			writeProblem(w, http.StatusBadRequest, "body-malformed", err.Error(), nil)
			return
		case faults != nil:
			writeProblem(w, http.StatusUnprocessableEntity, "charge-invalid", "the charge is not valid; fix the fields listed in errors and send it again (the same Idempotency-Key may be used: nothing was recorded)", faults)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		next.ServeHTTP(w, r)
	})
}

// problem is an RFC 9457 problem detail, shaped as the middleware's
// own: Code names the problem for a program; Errors lists a body's
// faulty fields.
type problem struct {
	Type   string       `json:"type"`
	Title  string       `json:"title"`
	Status int          `json:"status"`
	Detail string       `json:"detail"`
	Code   string       `json:"code"`
	Errors []fieldError `json:"errors,omitempty"`
}

func writeProblem(w http.ResponseWriter, status int, code, detail string, errs []fieldError) {
	b, _ := json.Marshal(problem{Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: detail, Code: code, Errors: errs})
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeProblem(w, http.StatusInternalServerError, "internal", "the answer could not be encoded", nil)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}
