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
	"sync"

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

// An effect that makes three calls to a provider gives each its own
// Idempotency-Key, derived from the attempt's provider key: the same
// keys on every attempt, so a retried effect's calls are absorbed, and
// never one key for two calls.
func ExampleWithRequestKeys() {
	client, done, err := exampleClient()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer done()

	keys := map[string][]string{} // the provider's view: keys by call
	var mu sync.Mutex
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		keys[r.Method+" "+r.URL.Path] = append(keys[r.Method+" "+r.URL.Path], r.Header.Get(idemhttp.Header))
	}))
	defer provider.Close()
	hc := &http.Client{Transport: &idemhttp.Transport{}}

	onboard := func(ctx context.Context, a once.Attempt) (string, error) {
		ctx = idemhttp.WithRequestKeys(ctx, a.ProviderKey)
		for _, call := range []string{"POST /customers", "POST /charges", "GET /telemetry"} {
			method, path, _ := strings.Cut(call, " ")
			req, _ := http.NewRequestWithContext(ctx, method, provider.URL+path, nil)
			resp, err := hc.Do(req)
			if err != nil {
				return "", err
			}
			resp.Body.Close()
		}
		if a.Number == 1 {
			return "", once.RetryLater(errors.New("the first attempt stops here, to be run again"))
		}
		return "onboarded", nil
	}
	in := once.Intent{Run: "signup-9", Kind: "onboard", Target: "ada@example.com"}
	once.Do(context.Background(), client, in, onboard)
	res, err := once.Do(context.Background(), client, in, onboard)
	fmt.Println(res.Value, "at attempt", res.Attempt, err)

	distinct := map[string]bool{}
	for _, call := range []string{"POST /customers", "POST /charges", "GET /telemetry"} {
		k := keys[call]
		fmt.Printf("%s: %d calls, the same key each time: %v\n", call, len(k), k[0] == k[1])
		distinct[k[0]] = true
	}
	fmt.Println("distinct keys:", len(distinct))
	// Output:
	// onboarded at attempt 2 <nil>
	// POST /customers: 2 calls, the same key each time: true
	// POST /charges: 2 calls, the same key each time: true
	// GET /telemetry: 2 calls, the same key each time: true
	// distinct keys: 3
}

// An effect that charges a provider leaves the meaning of its answer to
// Outcome: a declined card (402) fails the action for good, and a retry
// of the job gets the failure back instead of charging again.
func ExampleOutcome() {
	client, done, err := exampleClient()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer done()
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusPaymentRequired)
		io.WriteString(w, `{"error":"card_declined"}`)
	}))
	defer provider.Close()
	hc := &http.Client{Transport: &idemhttp.Transport{}}

	charge := func(ctx context.Context, a once.Attempt) (string, error) {
		req, err := http.NewRequestWithContext(idemhttp.WithKey(ctx, a.ProviderKey), http.MethodPost, provider.URL+"/charges", strings.NewReader(`{"amount":1250}`))
		if err != nil {
			return "", once.Permanent(err)
		}
		resp, err := hc.Do(req)
		if err := idemhttp.Outcome(resp, err); err != nil {
			if resp != nil {
				resp.Body.Close()
			}
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	in := once.Intent{Run: "order-7", Kind: "charge", Target: "cus_ada", Payload: 1250}
	for range 2 {
		_, err := once.Do(context.Background(), client, in, charge)
		var failed *once.FailedError
		if errors.As(err, &failed) {
			fmt.Printf("failed for good (replayed %v): %s\n", failed.Replayed, strings.ReplaceAll(failed.Message, provider.URL, "PROVIDER"))
		}
	}
	// Output:
	// failed for good (replayed false): POST PROVIDER/charges answered 402 Payment Required: "{\"error\":\"card_declined\"}"
	// failed for good (replayed true): POST PROVIDER/charges answered 402 Payment Required: "{\"error\":\"card_declined\"}"
}
