package idemhttp_test

import (
	"context"
	"errors"
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

// exampleClient is a once client over a new SQLite file, and the
// function that removes it.
func exampleClient() (*once.Client, func(), error) {
	dir, err := os.MkdirTemp("", "idemhttp-example")
	if err != nil {
		return nil, nil, err
	}
	store, err := sqlite.Open(filepath.Join(dir, "once.db"), sqlite.Config{})
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	done := func() { store.Close(); os.RemoveAll(dir) }
	if err := store.Migrate(context.Background()); err != nil {
		done()
		return nil, nil, err
	}
	client, err := once.New(once.Config{Store: store})
	if err != nil {
		done()
		return nil, nil, err
	}
	return client, done, nil
}

// A handler whose email, sent through a once.Do of its own, went to a
// person's review answers 202 and calls Release, so that answer is not
// the key's for good: once the person resolves the email Done, the
// client's retry runs the handler again, whose Do replays the person's
// result.
func ExampleRelease() {
	client, done, err := exampleClient()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer done()

	mux := http.NewServeMux()
	mux.Handle("POST /orders", idemhttp.Middleware(client, idemhttp.Config{
		Scope: func(r *http.Request) string { return "tenant:acme" },
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mail := once.Intent{Run: "order-7", Kind: "email", Target: "ada@example.com", Payload: "receipt"}
		res, err := once.Do(r.Context(), client, mail, func(context.Context, once.Attempt) (string, error) {
			return "", errors.New("the connection dropped after the final dot") // sent or not: a person decides
		})
		if err != nil {
			idemhttp.Release(r) // not final: the retry asks again
			w.WriteHeader(http.StatusAccepted)
			fmt.Fprintln(w, "the receipt is being checked")
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintln(w, "receipt sent:", res.Value)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	send := func() {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{}`))
		req.Header.Set(idemhttp.Header, "order-7")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%d replayed=%q %s", resp.StatusCode, resp.Header.Get(idemhttp.ReplayedHeader), body)
	}
	send()
	review, _ := client.List(context.Background(), once.Filter{Status: once.StatusReview})
	client.Resolve(context.Background(), review[0].Key, once.Resolution{Decision: once.DecisionDone, Result: []byte(`"msg-1"`), By: "ops", Note: "in the mail log"})
	send()
	send()
	// Output:
	// 202 replayed="" the receipt is being checked
	// 201 replayed="" receipt sent: msg-1
	// 201 replayed="true" receipt sent: msg-1
}
