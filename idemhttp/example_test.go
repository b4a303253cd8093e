package idemhttp_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/oncehq/once"
	"github.com/oncehq/once/idemhttp"
	"github.com/oncehq/once/sqlite"
)

// A POST endpoint behind the middleware: the client's retry of the same
// request gets the first response back, and the order is created once.
func Example() {
	dir, err := os.MkdirTemp("", "idemhttp-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	store, err := sqlite.Open(filepath.Join(dir, "once.db"), sqlite.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	if err := store.Migrate(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	client, err := once.New(once.Config{Store: store})
	if err != nil {
		fmt.Println(err)
		return
	}

	created := 0
	mux := http.NewServeMux()
	mux.Handle("POST /orders", idemhttp.Middleware(client, idemhttp.Config{
		// In a real service: the tenant of the authenticated caller.
		Scope: func(r *http.Request) string { return "tenant:" + r.Header.Get("X-Tenant") },
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		created++
		w.Header().Set("Location", fmt.Sprintf("/orders/%d", created))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order %d\n", created)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"sku":"tea"}`))
		req.Header.Set("Idempotency-Key", `"8e03978e-40d5-43e8-bc93-6894a57f9324"`)
		req.Header.Set("X-Tenant", "acme")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%d %s replayed=%q %s", resp.StatusCode, resp.Header.Get("Location"), resp.Header.Get("Idempotent-Replayed"), body)
	}
	fmt.Println("orders created:", created)
	// Output:
	// 201 /orders/1 replayed="" order 1
	// 201 /orders/1 replayed="true" order 1
	// orders created: 1
}
