package protocol

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oncehq/once"
	"github.com/oncehq/once/sqlite"
)

// TestReclaimedClaimIsHeldOnce: a claim sent again with its write token
// (its reply lost, or a client that resends it) is answered with the
// same attempt, and the server holds it once. Each resend was appended
// to the held queue and only the newest counted against MaxHeldClaims
// and MaxHeldBytes, so a client resending one claim kept every copy of
// its payload: memory past both bounds, never let go.
func TestReclaimedClaimIsHeldOnce(t *testing.T) {
	store, err := sqlite.Open(filepath.Join(t.TempDir(), "once.db"), sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	c, err := once.New(once.Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	const token = "worker-token-0123456789"
	s, err := New(Config{Client: c, Workers: []string{token}})
	if err != nil {
		t.Fatal(err)
	}
	payload := `"` + strings.Repeat("x", 256<<10) + `"`
	body := `{"intent":{"run":"r","step":1,"kind":"k","payload":` + payload + `},"write":"write-token-0123456789abcdef"}`
	const resends = 100 // 100 × 256 KiB: past MaxHeldBytes if each is kept
	var first string
	for i := range resends {
		req := httptest.NewRequest("POST", "/v1/claim", bytes.NewReader([]byte(body)))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		s.ServeHTTP(w, req)
		var a ClaimAnswer
		if w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &a) != nil || a.Answer != AnswerClaimed {
			t.Fatalf("claim %d = %d %s; want 200 claimed", i+1, w.Code, w.Body.Bytes())
		}
		if i == 0 {
			first = a.Token
		} else if a.Token != first {
			t.Fatalf("claim %d answered another token", i+1)
		}
	}
	s.held.mu.Lock()
	defer s.held.mu.Unlock()
	if n := len(s.held.order) - s.held.head; n > len(s.held.m) {
		t.Fatalf("one claim sent %d times is held %d times (%d bytes counted); want once", resends, n, s.held.bytes)
	}
	kept := 0
	for _, e := range s.held.order[s.held.head:] {
		kept += e.size
	}
	if kept > MaxHeldBytes || s.held.bytes != kept {
		t.Fatalf("the held queue keeps %d bytes of payload, %d counted; at most %d", kept, s.held.bytes, MaxHeldBytes)
	}
}
