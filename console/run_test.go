package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/oncehq/once/console"
)

// A run of 100,000 steps is shown a page at a time in step order,
// saying how many steps it has: not the 10,000 most recently updated
// (steps 90,000 on), as "10000 steps".
func TestRunPagePagesSteps(t *testing.T) {
	ctx := context.Background()
	pool, _, client, schema := postgresClient(t, "once_run")
	const n = 100_000
	// Later steps were updated later, as in a run that went in order.
	if _, err := pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema, "once_action"}.Sanitize()+` (key, fingerprint, run_id, step, kind, target, payload, status, attempt, result, updated_at, completed_at)
SELECT md5(g::text) || md5(g::text), '', 'big', g, 'send_email', '', '\x7b7d', 'succeeded', 1, '{}', now() - (($1::int - g) * interval '1 millisecond'), now() FROM generate_series(0, $1::int - 1) g`, n); err != nil {
		t.Fatal(err)
	}
	h, err := console.New(console.Config{Client: client})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	steps := regexp.MustCompile(`<td class="num">(\d+)</td>\s*<td><a class="key"`)
	next := srv.URL + "/runs/big"
	for page := range 2 {
		code, body := fetch(t, next)
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d", next, code)
		}
		if !strings.Contains(string(body), fmt.Sprintf("%d steps", n)) {
			t.Errorf("GET %s does not say the run has %d steps", next, n)
		}
		var got []string
		for _, m := range steps.FindAllStringSubmatch(string(body), -1) {
			got = append(got, m[1])
		}
		if len(got) != 100 || got[0] != fmt.Sprint(page*100) || got[99] != fmt.Sprint(page*100+99) {
			t.Fatalf("GET %s shows %d steps, %v … ; want steps %d to %d", next, len(got), got[:min(3, len(got))], page*100, page*100+99)
		}
		m := regexp.MustCompile(`href="(/runs/big\?after=[^"]+)"`).FindSubmatch(body)
		if m == nil {
			t.Fatalf("GET %s links no next page", next)
		}
		next = srv.URL + html.UnescapeString(string(m[1]))
	}
	code, body := fetch(t, srv.URL+"/api/runs/big?limit=1000")
	var api struct {
		Steps []struct {
			Step int64 `json:"step"`
		} `json:"steps"`
		Total int64  `json:"total"`
		Next  string `json:"next"`
	}
	if err := json.Unmarshal(body, &api); code != http.StatusOK || err != nil {
		t.Fatalf("GET /api/runs/big: %d %v", code, err)
	}
	if len(api.Steps) != 1000 || api.Steps[0].Step != 0 || api.Steps[999].Step != 999 || api.Total != n || api.Next == "" {
		t.Fatalf("GET /api/runs/big?limit=1000: %d steps from %v, total %d, next %q", len(api.Steps), api.Steps[:min(1, len(api.Steps))], api.Total, api.Next)
	}
	code, body = fetch(t, srv.URL+"/api/runs/big?limit=2&after="+api.Next)
	api.Steps = nil
	if err := json.Unmarshal(body, &api); code != http.StatusOK || err != nil || len(api.Steps) != 2 || api.Steps[0].Step != 1000 {
		t.Errorf("GET /api/runs/big?after=%s: %d %v %+v", api.Next, code, err, api.Steps)
	}
}
