package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/oncehq/once"
	"github.com/oncehq/once/console"
	"github.com/oncehq/once/sqlite"
)

// An application mounts the console on its own mux, under a path of its
// choosing, so that resolutions go through its own client (with its
// policies and verifiers) and its reaper's passes show on the overview.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "once-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	store, err := sqlite.Open(filepath.Join(dir, "once.db"), sqlite.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	client, err := once.New(once.Config{Store: store})
	if err != nil {
		log.Fatal(err)
	}

	// The library's reaper reports each pass to the console.
	status := new(console.ReaperStatus)
	reaper, err := once.NewReaper(client, once.ReaperConfig{OnPass: status.OnPass})
	if err != nil {
		log.Fatal(err)
	}
	if err := reaper.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer reaper.Stop()

	ops, err := console.New(console.Config{Client: client, Prefix: "/ops/once", Reaper: status})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "the application\n") })
	// In production, behind the application's own authentication, or
	// with Config.Token set.
	mux.Handle("/ops/once/", ops)
	// http.ListenAndServe("127.0.0.1:8080", mux)

	get := func(path string) (int, string) {
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		return w.Code, w.Body.String()
	}
	code, body := get("/")
	fmt.Print(code, " ", body)
	code, body = get("/ops/once/healthz")
	fmt.Print(code, " ", body)
	code, body = get("/ops/once/review")
	fmt.Println(code, strings.Contains(body, `href="/ops/once/actions"`))
	code, body = get("/ops/once/api/stats")
	var stats struct {
		Backlog int `json:"review_backlog"`
	}
	json.Unmarshal([]byte(body), &stats)
	fmt.Println(code, "review backlog:", stats.Backlog)
	// Output:
	// 200 the application
	// 200 ok
	// 200 true
	// 200 review backlog: 0
}
