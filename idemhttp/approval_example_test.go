package idemhttp_test

import (
	"context"
	"encoding/json"
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

// A payment route whose large payments wait for a person's approval:
// the request and its repeats are answered 202 until someone approves,
// and the repeat after that makes the payment, once. Here
// Client.Approve stands in for the console's Approve button.
func Example_approval() {
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
	var asked []once.Action
	client, err := once.New(once.Config{Store: store,
		Kinds: map[string]once.KindPolicy{"http:POST /payments": {Approval: once.ApprovalPolicy{
			// The payload is the body (Config.Fingerprint below).
			When: func(in once.Intent) bool {
				var p struct{ Amount int }
				return json.Unmarshal(in.Payload.(json.RawMessage), &p) != nil || p.Amount > 1000_00
			},
		}}},
		// Tell a person, once per payment: a message to the approvers.
		Hooks: once.Hooks{OnAwaitingApproval: func(_ context.Context, a once.Action) { asked = append(asked, a) }},
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	paid := 0
	mux := http.NewServeMux()
	mux.Handle("POST /payments", idemhttp.Middleware(client, idemhttp.Config{
		Scope:       func(r *http.Request) string { return "tenant:acme" },
		Fingerprint: func(_ *http.Request, body []byte) any { return json.RawMessage(body) },
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paid++
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "payment %d\n", paid)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	pay := func(key, body string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(body))
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusAccepted {
			var p struct{ Code string }
			json.Unmarshal(b, &p)
			fmt.Printf("%d %s, Retry-After %s\n", resp.StatusCode, p.Code, resp.Header.Get("Retry-After"))
			return
		}
		fmt.Printf("%d replayed=%q %s", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), b)
	}
	pay("p-1", `{"amount":4200}`)
	pay("p-2", `{"amount":250000}`)
	pay("p-2", `{"amount":250000}`) // the client's retry: the same answer, nobody asked twice
	for _, a := range asked {
		// What the console does when ada clicks Approve on the page that
		// showed this attempt and payload.
		if _, err := client.Approve(context.Background(), a.Key, once.Approval{By: "ada", Attempt: a.Attempt, Fingerprint: a.Fingerprint, Via: "console"}); err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println("approved by ada")
	}
	pay("p-2", `{"amount":250000}`)
	pay("p-2", `{"amount":250000}`)
	fmt.Println("payments made:", paid)
	// Output:
	// 201 replayed="" payment 1
	// 202 awaiting-approval, Retry-After 60
	// 202 awaiting-approval, Retry-After 60
	// approved by ada
	// 201 replayed="" payment 2
	// 201 replayed="true" payment 2
	// payments made: 2
}
