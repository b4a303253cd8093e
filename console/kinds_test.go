package console_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/console"
	"github.com/oncehq/once/internal/testdb"
)

// kindsLog is a store whose send_email actions were claimed by an
// application with a 10 s lease, a re-drive hook after 10 s and a 3-day
// retention, and a console over a client that knows no kind, as `once
// serve` is.
func kindsLog(t *testing.T) http.Handler {
	t.Helper()
	ctx := context.Background()
	app, store := testdb.SQLiteClient(t, once.Config{Kinds: map[string]once.KindPolicy{"send_email": {
		Lease: 10 * time.Second, RedriveAfter: 10 * time.Second, Retention: 72 * time.Hour,
		Redrive: func(context.Context, once.Action) error { return nil },
	}}})
	for i, kind := range []string{"send_email", "send_email", "charge_card_with_a_rather_long_kind_name", "post_message"} {
		once.Do(ctx, app, once.Intent{Run: "r", Step: int64(i), Kind: kind}, func(context.Context, once.Attempt) (int, error) { return i, nil })
	}
	serve, err := once.New(once.Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	h, err := console.New(console.Config{Client: serve})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// The kinds page shows what a kind's actions recorded at their claims
// (a re-drive hook after 10 s, a retention of 3 days), not the defaults
// of the process that hosts the console (re-drive none, 7 days), which
// knows nothing of the kind; what it does not know it says it does not.
func TestKindsPageShowsWhatRowsRecorded(t *testing.T) {
	t.Parallel()
	h := kindsLog(t)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/kinds", nil))
	body := w.Body.String()
	_, row, _ := strings.Cut(body, `?kind=send_email">send_email</a>`)
	row, _, _ = strings.Cut(row, "</tr>")
	for _, want := range []string{"hook, after 10s", "3d 0h", "not configured here"} {
		if !strings.Contains(row, want) {
			t.Errorf("the kinds page's send_email row does not show %q:\n%s", want, row)
		}
	}
	if strings.Contains(row, ">none<") || strings.Contains(row, "2m 0s") {
		t.Errorf("the kinds page's send_email row shows this process's defaults (re-drive none, lease 2m):\n%s", row)
	}
	w = httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/api/kinds", nil))
	var kinds []struct {
		Kind     string `json:"kind"`
		Recorded struct {
			Redrive      bool          `json:"redrive"`
			RedriveAfter time.Duration `json:"redrive_after_ns"`
			Retention    time.Duration `json:"retention_ns"`
		} `json:"recorded"`
		Configured bool `json:"configured_here"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &kinds); err != nil {
		t.Fatal(err)
	}
	for _, k := range kinds {
		if k.Kind == "send_email" && (!k.Recorded.Redrive || k.Recorded.RedriveAfter != 10*time.Second || k.Recorded.Retention != 72*time.Hour || k.Configured) {
			t.Errorf("/api/kinds send_email = %+v", k)
		}
	}
}
