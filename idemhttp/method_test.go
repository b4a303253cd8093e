package idemhttp_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/oncehq/once"
	"github.com/oncehq/once/idemhttp"
	"github.com/oncehq/once/internal/testdb"
)

// TestMethodCaseIsOneKey: a client that sends "post" and then "POST"
// with one Idempotency-Key makes one request. The middleware acts on
// both spellings, so both must name the same action: the handler runs
// once, and the second answer is the first one replayed.
func TestMethodCaseIsOneKey(t *testing.T) {
	c, _ := testdb.SQLiteClient(t, once.Config{})
	h := &orders{}
	mux := http.NewServeMux()
	// A pattern without a method routes every spelling to the handler.
	mux.Handle("/orders", idemhttp.Middleware(c, idemhttp.Config{
		Scope: func(*http.Request) string { return "tenant:acme" },
	})(h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	var bodies []string
	for _, method := range []string{"post", "POST", "Post"} {
		req, err := http.NewRequest(method, srv.URL+"/orders", strings.NewReader(`{"sku":"A1"}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Idempotency-Key", "k-method-case")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("%s: status %d, body %s; want 201", method, resp.StatusCode, b)
		}
		bodies = append(bodies, string(b))
	}
	if n := h.runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times for one Idempotency-Key sent as post, POST and Post; want once", n)
	}
	for i, b := range bodies[1:] {
		if b != bodies[0] {
			t.Fatalf("answer %d = %s; want the first, %s, replayed", i+2, b, bodies[0])
		}
	}
}
