package protocol_test

import (
	"testing"
	"time"

	"github.com/oncehq/once"
)

// TestCarriedPolicy: a claim of a kind the server does not pin carries
// its policy, as a Go worker's Config would: the claim is held for the
// lease it says, its heartbeats renew that lease, and its recovery is
// recorded, so a duplicate after its worker died takes it over. A kind
// the server pins refuses a different policy; a policy out of bounds,
// or one that needs a verifier, is refused.
func TestCarriedPolicy(t *testing.T) {
	for name, open := range stores(t) {
		t.Run(name, func(t *testing.T) {
			s := newServer(t, open(t), once.Config{Default: once.KindPolicy{Lease: time.Minute},
				Kinds: map[string]once.KindPolicy{"charge_card": {Lease: time.Minute}}})
			policy := map[string]any{"lease_ms": 2000, "recovery": "retry_with_provider_key"}
			in := wireIntent(1, map[string]any{"subject": "hello"})
			body := claimBody(in)
			body["policy"] = policy
			code, a := s.post("/v1/claim", body)
			want(t, "a claim carrying its policy", code, a, 200, "answer", "claimed")
			if a["stop_after_ms"].(float64) > 2000 || a["heartbeat_every_ms"].(float64) > 700 {
				t.Fatalf("claimed %v; want the carried 2 s lease's stop and heartbeat", a)
			}
			key := once.Key(a["key"].(string))
			row, err := s.c.Get(t.Context(), key)
			if err != nil {
				t.Fatal(err)
			}
			if left := time.Until(row.LeaseUntil); left > 3*time.Second || row.Recovery != once.RetryWithProviderKey {
				t.Fatalf("the row is held %v under %v; want the carried lease and recovery", left, row.Recovery)
			}
			hb := ref(a)
			hb["policy"] = policy
			code, v := s.post("/v1/heartbeat", hb)
			want(t, "heartbeat", code, v, 200, "", "")
			if row, _ = s.c.Get(t.Context(), key); time.Until(row.LeaseUntil) > 3*time.Second {
				t.Fatalf("the heartbeat renewed the lease to %v from now; want the carried 2 s", time.Until(row.LeaseUntil))
			}
			time.Sleep(2500 * time.Millisecond) // the worker died
			code, v = s.post("/v1/claim", claimBody(in))
			want(t, "a duplicate after the carried lease lapsed", code, v, 200, "answer", "claimed")
			if v["attempt"] != 2.0 {
				t.Fatalf("the duplicate claimed attempt %v; want 2, a takeover under the recorded recovery", v["attempt"])
			}

			pinned := claimBody(map[string]any{"run": "run-1", "step": 2, "kind": "charge_card", "target": "acct-1", "payload": 1})
			pinned["policy"] = map[string]any{"lease_ms": 5000}
			code, v = s.post("/v1/claim", pinned)
			want(t, "a pinned kind's claim carrying another policy", code, v, 409, "code", "policy_pinned")
			pinned["policy"] = map[string]any{"lease_ms": 60000}
			code, v = s.post("/v1/claim", pinned)
			want(t, "a pinned kind's claim carrying its own policy", code, v, 200, "answer", "claimed")

			for _, bad := range []map[string]any{
				{"recovery": "verify_then_decide"},
				{"recovery": "pray"},
				{"lease_ms": 10},
				{"lease_ms": 7200000},
				{"max_execution_ms": -1},
			} {
				b := claimBody(wireIntent(3, nil))
				b["policy"] = bad
				code, v = s.post("/v1/claim", b)
				want(t, "a claim carrying a bad policy", code, v, 400, "code", "bad_request")
			}
		})
	}
}

// TestPinnedKindTakesItsOwnPolicyCarried: a claim of a pinned
// verify_then_decide kind that carries the pinned policy itself (a
// client that sends its whole policy always) is served, as any pinned
// kind's is; carrying another one is refused as pinned.
func TestPinnedKindTakesItsOwnPolicyCarried(t *testing.T) {
	store := stores(t)["sqlite"](t)
	s := verifiedServer(t, store)
	own := claimBody(wireIntent(1, map[string]any{"subject": "hello"}))
	own["policy"] = map[string]any{"lease_ms": 1000, "max_execution_ms": 3000, "recovery": "verify_then_decide"}
	code, v := s.post("/v1/claim", own)
	want(t, "a verified kind's claim carrying its pinned policy", code, v, 200, "answer", "claimed")
	hb := ref(v)
	hb["policy"] = own["policy"]
	code, hv := s.post("/v1/heartbeat", hb)
	want(t, "its heartbeat carrying it too", code, hv, 200, "", "")
	other := claimBody(wireIntent(2, nil))
	other["policy"] = map[string]any{"recovery": "retry_with_provider_key"}
	code, v = s.post("/v1/claim", other)
	want(t, "a verified kind's claim carrying another recovery", code, v, 409, "code", "policy_pinned")
	other["policy"] = map[string]any{"lease_ms": 2000, "recovery": "verify_then_decide"}
	code, v = s.post("/v1/claim", other)
	want(t, "a verified kind's claim carrying another lease", code, v, 409, "code", "policy_pinned")
}
