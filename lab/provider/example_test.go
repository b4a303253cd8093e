package provider_test

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
	"github.com/oncehq/once/lab/provider"
	"github.com/oncehq/once/sqlite"
)

// A charge sent twice with the same Idempotency-Key is made once: the
// second request gets the first one's answer back.
func Example() {
	dir, _ := os.MkdirTemp("", "provider-example")
	defer os.RemoveAll(dir)
	store, err := sqlite.Open(filepath.Join(dir, "provider.db"), sqlite.Config{})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	if err := store.Migrate(context.Background()); err != nil {
		panic(err)
	}
	client, _ := once.New(once.Config{Store: store})
	p, _ := provider.New(provider.Config{Client: client})
	srv := httptest.NewServer(p)
	defer srv.Close()

	post := func(path, key, body string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
		req.Header.Set(idemhttp.Header, key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		fmt.Printf("%d replayed=%q %s", resp.StatusCode, resp.Header.Get(idemhttp.ReplayedHeader), b)
	}
	post("/v1/customers", "key-1", `{"email":"ada@example.com"}`)
	post("/v1/charges", "key-2", `{"customer":"cus_1","amount":4200,"currency":"eur"}`)
	post("/v1/charges", "key-2", `{"customer":"cus_1","amount":4200,"currency":"eur"}`)
	http.DefaultClient.CloseIdleConnections()
	fmt.Println("requests with key-2:", p.Requests("key-2"), "charges made:", len(p.Created("key-2")))
	// Output:
	// 200 replayed="" {"id":"cus_1","object":"customer","email":"ada@example.com"}
	// 200 replayed="" {"id":"ch_1","object":"charge","customer":"cus_1","amount":4200,"currency":"eur"}
	// 200 replayed="true" {"id":"ch_1","object":"charge","customer":"cus_1","amount":4200,"currency":"eur"}
	// requests with key-2: 2 charges made: 1
}
