package idemhttp

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/oncehq/once"
)

type keyContext struct{}

// keyed is what WithKey and WithRequestKeys put in a context.
type keyed struct {
	key        string
	perRequest bool
}

// WithKey returns ctx carrying key, for Transport to send as the
// Idempotency-Key of every request made with the context. Pass the
// attempt's ProviderKey: it is the same on every attempt of an action, so
// a provider that honours the header absorbs the call a retried effect
// makes again (the RetryWithProviderKey recovery relies on this).
//
// Every request: an effect that makes several calls under the context
// (POST /customers, then POST /charges, then GET /telemetry) sends the
// one key on each, and a provider that keys by it alone takes the second
// call for the first one sent again. Use WithRequestKeys for such an
// effect.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyContext{}, keyed{key: key})
}

// WithRequestKeys returns ctx carrying key, for Transport to send, on
// each request made with the context, a key of its own: RequestKey(key,
// req), from the request's method, host and path. Pass the attempt's
// ProviderKey. Every attempt of the effect sends each call with the key
// it had before, so each is absorbed when the effect runs again, and
// two calls of one effect never share a key. Two calls with the same
// method, host and path do; give the second a key of its own with
// WithKey(ctx, RequestKey(key+"/2", req)).
func WithRequestKeys(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyContext{}, keyed{key: key, perRequest: true})
}

// KeyFrom returns the key WithKey or WithRequestKeys put in ctx, if any:
// the effect's key, not one derived from it.
func KeyFrom(ctx context.Context) (string, bool) {
	k, ok := ctx.Value(keyContext{}).(keyed)
	return k.key, ok && k.key != ""
}

// RequestKey derives the Idempotency-Key of one request an effect makes
// from the effect's key: a SHA-256, in hex, of the key and the
// request's method, scheme, host and port, and path (not its query,
// which may carry a timestamp that differs on every attempt).
func RequestKey(key string, req *http.Request) string {
	h := sha256.New()
	for _, part := range []string{key, strings.ToUpper(req.Method), strings.ToLower(canonicalHost(req.URL)), req.URL.EscapedPath()} {
		// Each part with its length, so no two lists of parts hash
		// alike.
		h.Write(strconv.AppendInt(nil, int64(len(part)), 10))
		h.Write([]byte{':'})
		h.Write([]byte(part))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// SetKey sets req's Idempotency-Key to the attempt's provider key, for a
// request made without Transport.
func SetKey(req *http.Request, a once.Attempt) {
	req.Header.Set(Header, a.ProviderKey)
}

// Transport sends the key carried in a request's context (WithKey, or
// one derived per request with WithRequestKeys) as its Idempotency-Key
// header. A request that already has the header, or
// whose context carries no key, goes out as it is. A redirect to another
// host or scheme goes without the header, whoever set it: the key names
// one request to one provider. Wire it once into the
// http.Client an effect uses, and the effect only has to say
// idemhttp.WithKey(ctx, attempt.ProviderKey).
type Transport struct {
	// Base makes the requests. Nil means http.DefaultTransport.
	Base http.RoundTripper
}

// RoundTrip implements http.RoundTripper. It does not change req (a
// RoundTripper must not); it sends a clone that carries the header.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	if !sameHost(req) {
		// A redirect to another host: the key names one request to one
		// provider, and goes no further, whoever set it (Go's client
		// copies the caller's headers on a redirect)
		// (TestTransportKeepsTheKeyToItsHost).
		if req.Header.Get(Header) == "" {
			return base.RoundTrip(req)
		}
		r := req.Clone(req.Context())
		r.Header.Del(Header)
		return base.RoundTrip(r)
	}
	k, _ := req.Context().Value(keyContext{}).(keyed)
	if k.key == "" || req.Header.Get(Header) != "" {
		return base.RoundTrip(req)
	}
	key := k.key
	if k.perRequest {
		// A redirect carries the key of the request it answers.
		key = RequestKey(k.key, first(req))
	}
	r := req.Clone(req.Context())
	r.Header.Set(Header, key)
	return base.RoundTrip(r)
}

// sameHost reports whether req, if it follows redirects, goes to the
// host (and port) the first request of the chain went to.
func sameHost(req *http.Request) bool {
	return strings.EqualFold(canonicalHost(first(req).URL), canonicalHost(req.URL))
}

// first is the first request of the redirect chain req is in.
func first(req *http.Request) *http.Request {
	for req.Response != nil && req.Response.Request != nil {
		req = req.Response.Request
	}
	return req
}

// canonicalHost is u's host and port, the port made explicit.
func canonicalHost(u *url.URL) string {
	port := u.Port()
	if port == "" {
		switch u.Scheme {
		case "https":
			port = "443"
		default:
			port = "80"
		}
	}
	return u.Scheme + "://" + net.JoinHostPort(u.Hostname(), port)
}
