package idemhttp

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/oncehq/once"
)

type keyContext struct{}

// WithKey returns ctx carrying key, for Transport to send as the
// Idempotency-Key of every request made with the context. Pass the
// attempt's ProviderKey: it is the same on every attempt of an action, so
// a provider that honours the header absorbs the call a retried effect
// makes again (the RetryWithProviderKey recovery relies on this).
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyContext{}, key)
}

// KeyFrom returns the key WithKey put in ctx, if any.
func KeyFrom(ctx context.Context) (string, bool) {
	k, ok := ctx.Value(keyContext{}).(string)
	return k, ok && k != ""
}

// SetKey sets req's Idempotency-Key to the attempt's provider key, for a
// request made without Transport.
func SetKey(req *http.Request, a once.Attempt) {
	req.Header.Set(Header, a.ProviderKey)
}

// Transport sends the key carried in a request's context (WithKey) as
// its Idempotency-Key header. A request that already has the header, or
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
	key, ok := KeyFrom(req.Context())
	if !ok || req.Header.Get(Header) != "" {
		return base.RoundTrip(req)
	}
	r := req.Clone(req.Context())
	r.Header.Set(Header, key)
	return base.RoundTrip(r)
}

// sameHost reports whether req, if it follows redirects, goes to the
// host (and port) the first request of the chain went to.
func sameHost(req *http.Request) bool {
	first := req
	for first.Response != nil && first.Response.Request != nil {
		first = first.Response.Request
	}
	return strings.EqualFold(canonicalHost(first.URL), canonicalHost(req.URL))
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
