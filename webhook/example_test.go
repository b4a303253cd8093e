package webhook_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/oncehq/once/webhook"
)

// A receiver verifies the signature over the body as read, before it
// decodes it, and dedupes by the delivery's ID.
func Example() {
	secret := []byte("a secret shared with once serve")
	seen := map[string]bool{}
	receiver := func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, "cannot read the body", http.StatusBadRequest)
			return
		}
		if err := webhook.Verify(secret, r.Header.Get(webhook.Header), body, time.Now(), 0); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		var d webhook.Delivery
		if err := json.Unmarshal(body, &d); err != nil {
			http.Error(w, "not a delivery", http.StatusBadRequest)
			return
		}
		if !seen[d.ID] {
			seen[d.ID] = true
			fmt.Printf("%s to %s awaits approval: %s\n", d.Kind, d.Target, d.URL)
		}
		w.WriteHeader(http.StatusNoContent)
	}

	// What once serve sends, twice (a retry, or a restart).
	body := []byte(`{"id":"k-1-1","type":"awaiting_approval","kind":"charge_card","target":"acct-42","url":"https://ops.example/actions/k"}`)
	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/once", strings.NewReader(string(body)))
		req.Header.Set(webhook.Header, webhook.Sign(secret, time.Now(), body))
		w := httptest.NewRecorder()
		receiver(w, req)
		fmt.Println(w.Code)
	}

	// A forged request: signed with another secret.
	req := httptest.NewRequest(http.MethodPost, "/once", strings.NewReader(string(body)))
	req.Header.Set(webhook.Header, webhook.Sign([]byte("a guess"), time.Now(), body))
	w := httptest.NewRecorder()
	receiver(w, req)
	fmt.Print(w.Code, " ", w.Body.String())
	// Output:
	// charge_card to acct-42 awaits approval: https://ops.example/actions/k
	// 204
	// 204
	// 401 webhook: no signature matches: the body or the secret is not the one signed
}
