// Package provider is a stand-in for a payment provider's HTTP API, for
// tests and sandboxes: it creates customers and charges them, and, like
// Stripe and most payment APIs, honours the Idempotency-Key header, so a
// call retried with the same key gets the first call's response back
// instead of a second charge.
//
// It keeps its idempotency records with idemhttp.Middleware over a once
// client of its own (the provider's database, not the caller's), and
// counts two things per key, which is what a test of a caller needs:
// every request that reached it (Requests), and every object its handler
// created (Created). A retried call that was absorbed shows as two
// requests and one object.
//
// It is part of the lab module (github.com/oncehq/once/lab): the project's
// harnesses and tools, not a stable API; it may change in any release.
package provider

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/oncehq/once"
	"github.com/oncehq/once/idemhttp"
)

// Config configures a Provider. Only Client is required.
type Config struct {
	// Client keeps the provider's idempotency records: one action per
	// Idempotency-Key. Give it a database of its own; the provider stands
	// for another company's system. Required.
	Client *once.Client
	// BeforeReply, if set, is called after the handler created its object
	// and before the response is stored and sent. The request waits for
	// it: block in it to hold the caller in the window where the charge
	// was made but the caller cannot know.
	BeforeReply func(r *http.Request, created Object)
	// Log, if set, is told of every request once it was answered.
	Log func(Request)
}

// Object is a customer or a charge the provider created.
type Object struct {
	ID       string `json:"id"`
	Object   string `json:"object"` // "customer" or "charge"
	Email    string `json:"email,omitempty"`
	Name     string `json:"name,omitempty"`
	Customer string `json:"customer,omitempty"`
	Amount   int64  `json:"amount,omitempty"`
	Currency string `json:"currency,omitempty"`
	// Key is the Idempotency-Key of the request that created it.
	Key string `json:"-"`
}

// Request describes one request the provider answered, for a log line.
type Request struct {
	Method, Path string
	// Key is its Idempotency-Key ("" when it had none).
	Key string
	// Nth counts the requests seen with this key, this one included.
	Nth    int
	Status int
	// Replayed is true when the response was the stored one of an
	// earlier request with the key (Idempotent-Replayed: true).
	Replayed bool
	// Created is the object the handler created for this request, if it
	// ran.
	Created *Object
}

// Provider serves the API: POST /v1/customers and POST /v1/charges, each
// requiring an Idempotency-Key.
type Provider struct {
	cfg     Config
	handler http.Handler

	mu       sync.Mutex
	requests map[string]int
	created  map[string][]Object
	objects  []Object
	nextID   map[string]int
}

// New returns a provider that keeps its idempotency records with
// cfg.Client.
func New(cfg Config) (*Provider, error) {
	if cfg.Client == nil {
		return nil, errors.New("provider: Config.Client is nil; pass a once client over the provider's own database")
	}
	p := &Provider{cfg: cfg, requests: map[string]int{}, created: map[string][]Object{}, nextID: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/customers", p.createCustomer)
	mux.HandleFunc("POST /v1/charges", p.createCharge)
	p.handler = idemhttp.Middleware(cfg.Client, idemhttp.Config{
		// The stand-in has one account. A real provider scopes keys by the
		// authenticated account, so two accounts' keys never meet.
		Scope: func(*http.Request) string { return "sandbox" },
	})(mux)
	return p, nil
}

type recordKey struct{}

// record is what one request came to, filled in as it passes through.
type record struct {
	mu      sync.Mutex
	created *Object
}

// ServeHTTP counts the request, runs it through the idempotency
// middleware and tells Config.Log what it came to.
func (p *Provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get(idemhttp.Header)
	p.mu.Lock()
	p.requests[key]++
	nth := p.requests[key]
	p.mu.Unlock()

	rec := &record{}
	sw := &statusWriter{ResponseWriter: w}
	p.handler.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), recordKey{}, rec)))
	if p.cfg.Log != nil {
		rec.mu.Lock()
		created := rec.created
		rec.mu.Unlock()
		p.cfg.Log(Request{
			Method: r.Method, Path: r.URL.Path, Key: key, Nth: nth, Status: sw.status,
			Replayed: sw.Header().Get(idemhttp.ReplayedHeader) == "true", Created: created,
		})
	}
}

// Requests returns how many requests reached the provider with this
// Idempotency-Key, replayed ones included.
func (p *Provider) Requests(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.requests[key]
}

// Created returns the objects created by requests with this
// Idempotency-Key: one for a call however often it was retried, if the
// key was honoured.
func (p *Provider) Created(key string) []Object {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Object(nil), p.created[key]...)
}

// Objects returns every object created, in order.
func (p *Provider) Objects() []Object {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Object(nil), p.objects...)
}

// Customer creation's request body.
type customerRequest struct {
	Email string `json:"email"`
	Name  string `json:"name"`
}

// Charge creation's request body.
type chargeRequest struct {
	Customer string `json:"customer"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

func (p *Provider) createCustomer(w http.ResponseWriter, r *http.Request) {
	var req customerRequest
	if !decode(w, r, &req) {
		return
	}
	if !strings.Contains(req.Email, "@") {
		fail(w, http.StatusBadRequest, "email is required: an address such as ada@example.com")
		return
	}
	p.create(w, r, Object{Object: "customer", Email: req.Email, Name: req.Name})
}

func (p *Provider) createCharge(w http.ResponseWriter, r *http.Request) {
	var req chargeRequest
	if !decode(w, r, &req) {
		return
	}
	switch {
	case req.Amount <= 0:
		fail(w, http.StatusBadRequest, "amount must be a positive number of cents")
		return
	case req.Currency == "":
		fail(w, http.StatusBadRequest, "currency is required, such as eur")
		return
	case !p.exists(req.Customer, "customer"):
		fail(w, http.StatusBadRequest, fmt.Sprintf("no such customer: %q; create it first", req.Customer))
		return
	}
	p.create(w, r, Object{Object: "charge", Customer: req.Customer, Amount: req.Amount, Currency: req.Currency})
}

// create makes o, tells BeforeReply, and answers it.
func (p *Provider) create(w http.ResponseWriter, r *http.Request, o Object) {
	o.Key = r.Header.Get(idemhttp.Header)
	p.mu.Lock()
	prefix := map[string]string{"customer": "cus_", "charge": "ch_"}[o.Object]
	p.nextID[o.Object]++
	o.ID = fmt.Sprintf("%s%d", prefix, p.nextID[o.Object])
	p.objects = append(p.objects, o)
	p.created[o.Key] = append(p.created[o.Key], o)
	p.mu.Unlock()
	if rec, ok := r.Context().Value(recordKey{}).(*record); ok {
		rec.mu.Lock()
		rec.created = &o
		rec.mu.Unlock()
	}
	if p.cfg.BeforeReply != nil {
		p.cfg.BeforeReply(r, o)
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(o)
}

func (p *Provider) exists(id, object string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, o := range p.objects {
		if o.ID == id && o.Object == object {
			return true
		}
	}
	return false
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := json.NewDecoder(r.Body).Decode(v); err != nil {
		fail(w, http.StatusBadRequest, "the body is not the JSON object this endpoint takes: "+err.Error())
		return false
	}
	return true
}

func fail(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

// statusWriter remembers the status a response went out with.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}
