package idemhttp_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/oncehq/once"
	"github.com/oncehq/once/idemhttp"
	"github.com/oncehq/once/internal/testdb"
)

// kindsOf returns the distinct kinds of c's actions, sorted.
func kindsOf(t *testing.T, c *once.Client) ([]string, int) {
	t.Helper()
	acts, err := c.List(context.Background(), once.Filter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, a := range acts {
		if !slices.Contains(kinds, a.Kind) {
			kinds = append(kinds, a.Kind)
		}
	}
	slices.Sort(kinds)
	return kinds, len(acts)
}

func postTo(t *testing.T, url, key string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(idemhttp.Header, key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestKindComesFromABoundedSet: the kind names a kind policy and labels
// every metric series, so it must come from the routes the program
// registered, never from the path a client sends. Wrapping a whole mux,
// the middleware asks the mux which pattern a request matches; a request
// the mux routes nowhere is not keyed at all (the mux answers 404, and
// nothing is stored). Wrapping a handler that knows no patterns, every
// request of a method is one fallback kind.
func TestKindComesFromABoundedSet(t *testing.T) {
	scope := func(*http.Request) string { return "t" }
	created := func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }

	t.Run("a whole mux", func(t *testing.T) {
		c, _ := testdb.SQLiteClient(t, once.Config{})
		mux := http.NewServeMux()
		mux.HandleFunc("POST /orders/{id}", created)
		srv := httptest.NewServer(idemhttp.Middleware(c, idemhttp.Config{Scope: scope})(mux))
		defer srv.Close()
		for i := range 30 {
			if got := postTo(t, fmt.Sprintf("%s/junk/%d", srv.URL, i), fmt.Sprintf("junk-%d", i)); got != http.StatusNotFound {
				t.Fatalf("POST /junk/%d: %d, want the mux's 404", i, got)
			}
			if got := postTo(t, fmt.Sprintf("%s/orders/%d", srv.URL, i), fmt.Sprintf("order-%d", i)); got != http.StatusCreated {
				t.Fatalf("POST /orders/%d: %d, want 201", i, got)
			}
		}
		kinds, n := kindsOf(t, c)
		if want := []string{"http:POST /orders/{id}"}; !slices.Equal(kinds, want) || n != 30 {
			t.Fatalf("%d actions of kinds %q; want 30 of %q (the 404s not stored)", n, kinds, want)
		}
	})

	t.Run("no pattern known", func(t *testing.T) {
		c, _ := testdb.SQLiteClient(t, once.Config{})
		srv := httptest.NewServer(idemhttp.Middleware(c, idemhttp.Config{Scope: scope})(http.HandlerFunc(created)))
		defer srv.Close()
		for i := range 30 {
			if got := postTo(t, fmt.Sprintf("%s/junk/%d", srv.URL, i), fmt.Sprintf("junk-%d", i)); got != http.StatusCreated {
				t.Fatalf("POST /junk/%d: %d, want 201", i, got)
			}
		}
		kinds, n := kindsOf(t, c)
		if want := []string{"http:POST"}; !slices.Equal(kinds, want) || n != 30 {
			t.Fatalf("%d actions of kinds %q; want 30 of %q", n, kinds, want)
		}
	})
}
