package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/oncehq/once/internal/connlimit"
)

// Cookie names.
const (
	tokenCookie = "once_token"
	csrfCookie  = "once_csrf"
	flashCookie = "once_flash"
)

// authenticate enforces Config.Token on every request but /healthz. A
// browser cannot set an Authorization header on a link, so a page opened
// with ?token=TOKEN trades it for a cookie and is sent back to the same
// URL without it, keeping the token out of history and Referer.
//
// A wrong token spends one of its address's attempts (see guessLimit);
// an address that has spent them all gets 429 for every token it sends
// until the bucket refills. Wrong tokens and ?token= logins go to the
// log, with the address and never the token.
//
// A request that passes is reported to `once serve`'s listener
// (connlimit.Authorized), which then stops counting its connection as a
// guest; without a token every request but /healthz passes.
func (s *server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			next.ServeHTTP(w, r)
			return
		}
		if !s.hasToken {
			connlimit.Authorized(w, r)
			next.ServeHTTP(w, r)
			return
		}
		q := r.URL.Query()
		login := q.Has("token") && (r.Method == http.MethodGet || r.Method == http.MethodHead) && !isAPI(r)
		tok, via := credential(r, login)
		if via == "" {
			s.unauthorized(w, r)
			return
		}
		// The token is compared first, in constant time, and its
		// answer told only if the address may still be answered. A
		// right token on a connection that showed it before is
		// answered even so: a guesser holds no such connection, and
		// one beside the operator (any local process, for a console on
		// loopback) must not lock it out of the connection it has
		// (TestGuesserBesideTheOperatorLeavesItsConnection).
		addr, right := connlimit.AddrKey(r.RemoteAddr), s.tokenOK(tok)
		if !right || !connlimit.Shown(r) {
			if d := s.guesses.attempt(s.log, addr, via, right, time.Now()); d > 0 {
				s.tooManyGuesses(w, r, d)
				return
			}
		}
		if !right {
			s.unauthorized(w, r)
			return
		}
		connlimit.Authorized(w, r)
		if !login {
			next.ServeHTTP(w, r)
			return
		}
		s.log.Info("console: token login", "remote", addr)
		http.SetCookie(w, &http.Cookie{
			Name: tokenCookie, Value: base64.RawURLEncoding.EncodeToString([]byte(tok)),
			Path: s.cookiePath(), HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode,
		})
		q.Del("token")
		// The path is reduced to one leading slash: "//host" would
		// send the browser to another site.
		loc := s.path("/" + strings.TrimLeft(r.URL.EscapedPath(), "/"))
		if len(q) > 0 {
			loc += "?" + q.Encode()
		}
		w.Header().Set("Cache-Control", "no-store")
		http.Redirect(w, r, loc, http.StatusSeeOther)
	})
}

// credential returns the token r carries and how it came ("query" for a
// ?token= login, "header", "cookie"); via is empty if r carries none. A
// header that is not a bearer token, or a cookie that does not decode,
// counts as a wrong token: badToken never matches.
func credential(r *http.Request, login bool) (tok, via string) {
	if login {
		return r.URL.Query().Get("token"), "query"
	}
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, tok, ok := strings.Cut(h, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") {
			return badToken, "header"
		}
		return strings.TrimSpace(tok), "header"
	}
	if c, err := r.Cookie(tokenCookie); err == nil {
		tok, err := base64.RawURLEncoding.DecodeString(c.Value)
		if err != nil {
			return badToken, "cookie"
		}
		return string(tok), "cookie"
	}
	return "", ""
}

// badToken stands for a credential that is malformed: checkToken refuses
// control characters in Config.Token, so it matches none.
const badToken = "\x00"

func (s *server) tokenOK(tok string) bool {
	got := sha256.Sum256([]byte(tok))
	return subtle.ConstantTimeCompare(got[:], s.tokenHash[:]) == 1
}

// unauthorized answers 401 and closes the connection: a client without
// the token has nothing more to ask on it, and it frees the slot.
func (s *server) unauthorized(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="once"`)
	w.Header().Set("Connection", "close")
	if isAPI(r) {
		writeJSONError(w, http.StatusUnauthorized, s.unauthorizedMsg())
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusUnauthorized)
	io.WriteString(w, s.unauthorizedMsg()+"\n")
}

// tooManyGuesses answers 429 to an address that sent too many wrong
// tokens, saying when to come back, and closes the connection.
func (s *server) tooManyGuesses(w http.ResponseWriter, r *http.Request, wait time.Duration) {
	secs := int(math.Ceil(wait.Seconds()))
	msg := fmt.Sprintf("once console: too many wrong tokens from this address; no token from it is checked for %d s. "+
		"Check the token (--token or ONCE_TOKEN of `once serve`, Config.Token) and try again then.", secs)
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	w.Header().Set("Connection", "close")
	if isAPI(r) {
		writeJSONError(w, http.StatusTooManyRequests, msg)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusTooManyRequests)
	io.WriteString(w, msg+"\n")
}

func (s *server) unauthorizedMsg() string {
	return "once console: a token is required. Send the header \"Authorization: Bearer TOKEN\", " +
		"or open " + s.path("/") + "?token=TOKEN in the browser once to set a cookie."
}

// checkOrigin refuses a write whose Origin header names another host. A
// browser sends Origin on every cross-site POST, so a forged form from
// another site stops here even before its missing CSRF token is noticed.
//
// With Config.AllowedHosts, the Origin's host must be one of them: not
// merely the request's own Host, which a page on a DNS name rebound to
// this machine sends as well, and which a proxy may have rewritten.
// Without it, the Origin must name the request's Host.
func (s *server) checkOrigin(r *http.Request) error {
	o := r.Header.Get("Origin")
	if o == "" {
		return nil
	}
	u, err := url.Parse(o)
	switch {
	case err != nil || u.Host == "":
	case s.hosts != nil && s.hosts[strings.ToLower(u.Hostname())]:
		return nil
	case s.hosts == nil && strings.EqualFold(u.Host, r.Host):
		return nil
	}
	return errors.New("cross-origin request refused: Origin " + o + " is not this console (" + r.Host + ")")
}

// The CSRF token is an HMAC, under a per-process secret, of a random value
// the browser holds in an HttpOnly, SameSite=Strict cookie. Another site
// can make the browser send the cookie (on some paths) but can read
// neither it nor the page, so it cannot produce the token that goes with
// it; and the server keeps no per-session state.

// csrfToken returns the token for this browser, setting its cookie first
// if it has none (or one that is not ours).
func (s *server) csrfToken(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(csrfCookie); err == nil && validCSRFCookie(c.Value) {
		return s.csrfFor(c.Value)
	}
	b := make([]byte, 32)
	rand.Read(b) // never fails; see crypto/rand.Read
	v := base64.RawURLEncoding.EncodeToString(b)
	http.SetCookie(w, &http.Cookie{
		Name: csrfCookie, Value: v, Path: s.cookiePath(),
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode,
	})
	return s.csrfFor(v)
}

func validCSRFCookie(v string) bool {
	b, err := base64.RawURLEncoding.DecodeString(v)
	return err == nil && len(b) == 32
}

func (s *server) csrfFor(cookie string) string {
	m := hmac.New(sha256.New, s.csrfSecret)
	m.Write([]byte(cookie))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// checkCSRF verifies a form's csrf field against the browser's cookie.
func (s *server) checkCSRF(r *http.Request) error {
	c, err := r.Cookie(csrfCookie)
	if err != nil || !validCSRFCookie(c.Value) {
		return errors.New("the form came without the console's cookie; load the page again (with cookies enabled) and resubmit")
	}
	want := s.csrfFor(c.Value)
	if !hmac.Equal([]byte(r.PostFormValue("csrf")), []byte(want)) {
		return errors.New("the form's CSRF token does not match (the console may have restarted since the page was loaded); reload the page and resubmit")
	}
	return nil
}

// The notice after a decision travels to the next page in the
// once_flash cookie, signed: a cookie is not the console's alone to set
// (a sibling host may set one for the parent domain, and a man in the
// middle of a plain-http console may too), and a notice the console did
// not write must not be shown as its own (TestFlashNotForged). The
// cookie holds when it expires, the message, and an HMAC of both under
// the CSRF secret: a notice is shown only by the process that wrote it,
// unaltered, within flashTTL. The HMAC's input starts with flashDomain,
// which no CSRF cookie (base64) holds, so no CSRF token is ever a
// notice's signature, nor the other way round.
const (
	flashTTL    = time.Minute
	flashDomain = "once_flash\x00"
	// maxFlash bounds a notice; signed, one is under 800 bytes, and a
	// cookie over maxFlashCookie is not read.
	maxFlash       = 500
	maxFlashCookie = 1024
)

func (s *server) flashMAC(expires int64, msg []byte) []byte {
	m := hmac.New(sha256.New, s.csrfSecret)
	m.Write([]byte(flashDomain))
	m.Write([]byte(strconv.FormatInt(expires, 10)))
	m.Write([]byte{0})
	m.Write(msg)
	return m.Sum(nil)
}

// setFlash leaves a one-line message for the next page this browser
// loads: the outcome of a decision, shown after the redirect.
func (s *server) setFlash(w http.ResponseWriter, r *http.Request, msg string) {
	if len(msg) > maxFlash {
		return
	}
	expires := time.Now().Add(flashTTL).Unix()
	b64 := base64.RawURLEncoding
	v := strconv.FormatInt(expires, 10) + "." + b64.EncodeToString([]byte(msg)) + "." + b64.EncodeToString(s.flashMAC(expires, []byte(msg)))
	http.SetCookie(w, &http.Cookie{
		Name: flashCookie, Value: v, Path: s.cookiePath(), MaxAge: int(flashTTL / time.Second),
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode,
	})
}

// takeFlash returns the pending message, if this console wrote it and
// it has not expired, and clears it. Any other once_flash cookie
// (forged, altered, from another process, or expired) is cleared and
// shows nothing.
func (s *server) takeFlash(w http.ResponseWriter, r *http.Request) string {
	c, err := r.Cookie(flashCookie)
	if err != nil {
		return ""
	}
	http.SetCookie(w, &http.Cookie{Name: flashCookie, Path: s.cookiePath(), MaxAge: -1, HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	if len(c.Value) > maxFlashCookie {
		return ""
	}
	exp, rest, ok := strings.Cut(c.Value, ".")
	msg64, mac64, ok2 := strings.Cut(rest, ".")
	if !ok || !ok2 {
		return ""
	}
	expires, err := strconv.ParseInt(exp, 10, 64)
	if err != nil || time.Now().Unix() > expires {
		return ""
	}
	msg, err1 := base64.RawURLEncoding.DecodeString(msg64)
	mac, err2 := base64.RawURLEncoding.DecodeString(mac64)
	if err1 != nil || err2 != nil || len(msg) > maxFlash || !hmac.Equal(mac, s.flashMAC(expires, msg)) {
		return ""
	}
	return string(msg)
}

// safeNext accepts a redirect target only if it is a path on this
// console, under its prefix: not "//host" nor "/\host" (which browsers
// read as "//host"), nor anything with a scheme or a host.
func (s *server) safeNext(next string) bool {
	if !strings.HasPrefix(next, s.path("/")) || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n\t") {
		return false
	}
	u, err := url.Parse(next)
	return err == nil && u.Scheme == "" && u.Host == "" && u.User == nil
}
