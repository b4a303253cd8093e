package idemhttp

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
)

// FuzzReplay: whatever a stored result holds (a person may store any
// JSON), a replay sends no header outside ReplayHeaders but its own, no
// value with a control byte, and a status from 200 to 599, or refuses
// it as no response.
func FuzzReplay(f *testing.F) {
	f.Add([]byte(`{"status":201,"header":{"Location":["/orders/1"],"Set-Cookie":["a=b"]},"body":"aGk="}`))
	f.Add([]byte(`{"status":200,"header":{"location":["/x\r\nSet-Cookie: a=b"],"Content-Type":["text/html\u0000"]}}`))
	f.Add([]byte(`{"status":101}`))
	f.Add([]byte(`"order-17"`))
	m := &middleware{replay: map[string]bool{"Content-Type": true, "Location": true}}
	f.Fuzz(func(t *testing.T, raw []byte) {
		stored, ok := storedResponse(json.RawMessage(raw))
		if !ok {
			return
		}
		if stored.Status < 200 || stored.Status > 599 {
			t.Fatalf("status %d taken for a response", stored.Status)
		}
		rec := httptest.NewRecorder()
		stored.write(rec, m.replayable(stored.Header), true)
		for k, vs := range rec.Header() {
			switch k {
			case "Content-Type", "Location", "Content-Length", ReplayedHeader, "X-Content-Type-Options":
			default:
				t.Fatalf("replay sent %s: %q", k, vs)
			}
			for _, v := range vs {
				if strings.ContainsAny(v, "\r\n\x00") || !validHeaderValue(v) {
					t.Fatalf("replay sent %s: %q", k, v)
				}
			}
		}
		if rec.Code != stored.Status {
			t.Fatalf("replayed %d, stored %d", rec.Code, stored.Status)
		}
	})
}
