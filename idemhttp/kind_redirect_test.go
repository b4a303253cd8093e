package idemhttp_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/oncehq/once"
	"github.com/oncehq/once/idemhttp"
	"github.com/oncehq/once/internal/testdb"
)

// TestMuxRedirectIsNotKeyed: a mux with a subtree pattern
// ("POST /users/{id}/") answers "/users/x" with a redirect to
// "/users/x/", as it does a path to clean ("/users//x/"). The redirect
// is the mux's answer, no effect. Keyed and stored, it took the key: a
// client that followed it, sending its key again as Go's client does,
// was refused 422 (another path, so another fingerprint), and the
// handler never ran; and every key made a stored redirect.
func TestMuxRedirectIsNotKeyed(t *testing.T) {
	scope := func(*http.Request) string { return "t" }
	c, _ := testdb.SQLiteClient(t, once.Config{})
	mux := http.NewServeMux()
	var ran int
	mux.HandleFunc("POST /users/{id}/", func(w http.ResponseWriter, r *http.Request) {
		ran++
		w.WriteHeader(http.StatusCreated)
	})
	srv := httptest.NewServer(idemhttp.Middleware(c, idemhttp.Config{Scope: scope})(mux))
	defer srv.Close()
	for i, path := range []string{"/users/a", "/users//b/", "/users/c"} {
		req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(idemhttp.Header, fmt.Sprintf("k-%d", i))
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("POST %s, following the mux's redirect: %d %s; want 201", path, resp.StatusCode, body)
		}
	}
	if _, n := kindsOf(t, c); n != 3 || ran != 3 {
		t.Fatalf("%d actions stored and the handler ran %d times; want 3 and 3 (the redirects not stored)", n, ran)
	}
}
