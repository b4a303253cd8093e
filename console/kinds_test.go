package console_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/oncehq/once/console/internal/consoletest"
)

// kindsLog is consoletest.KindsLog.
var kindsLog = consoletest.KindsLog

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
