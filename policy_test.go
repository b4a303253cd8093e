package once_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/oncehq/once"
)

// A kind inherits every field it leaves zero from Config.Default, its
// recovery included; Default's own zero fields take the package's.
func TestKindsInheritDefault(t *testing.T) {
	c, _ := newClient(t, once.Config{
		Default: once.KindPolicy{Recovery: once.RetryWithProviderKey, MaxExecution: time.Minute},
		Kinds: map[string]once.KindPolicy{
			"lease_only": {Lease: 50 * time.Millisecond},
			"asks":       {Recovery: once.AskPerson, Retention: time.Hour},
		},
	})
	p := c.Policy("lease_only")
	if p.Recovery != once.RetryWithProviderKey || p.Lease != 50*time.Millisecond || p.MaxExecution != time.Minute ||
		p.Retention != once.DefaultRetention || p.MaxVerifyFailures != once.DefaultMaxVerifyFailures || p.VerifyBackoff != 10*time.Second {
		t.Fatalf("Policy(lease_only) = %+v", p)
	}
	if p := c.Policy("not_named"); p.Recovery != once.RetryWithProviderKey || p.Lease != once.DefaultLease || p.MaxExecution != time.Minute {
		t.Fatalf("Policy of an unnamed kind = %+v; want Default's", p)
	}
	if p := c.Policy("asks"); p.Recovery != once.AskPerson || p.Retention != time.Hour || p.MaxExecution != time.Minute {
		t.Fatalf("Policy(asks) = %+v", p)
	}
	if p := mustNew(t, once.Config{}).Policy("any"); p.Recovery != once.AskPerson || p.Lease != once.DefaultLease || p.MaxExecution != once.DefaultMaxExecution {
		t.Fatalf("package defaults = %+v", p)
	}

	// What the policies do with an unknown outcome.
	lost := func(context.Context, once.Attempt) (string, error) { return "", errors.New("EOF") }
	_, err := once.Do(context.Background(), c, once.Intent{Run: "r", Kind: "lease_only"}, lost)
	if !errors.Is(err, once.ErrRetryLater) || errors.Is(err, once.ErrReview) {
		t.Fatalf("a kind that set only a lease: %v; want Default's RetryWithProviderKey (released)", err)
	}
	_, err = once.Do(context.Background(), c, once.Intent{Run: "r", Kind: "asks"}, lost)
	if !errors.Is(err, once.ErrReview) {
		t.Fatalf("a kind that asks a person: %v; want review", err)
	}
}

func mustNew(t *testing.T, cfg once.Config) *once.Client {
	t.Helper()
	c, _ := newClient(t, cfg)
	return c
}

// A kind that takes its recovery from Default takes Default's verifier
// unless it has its own; a kind with a recovery of its own does not take
// Default's verifier.
func TestKindVerifier(t *testing.T) {
	verifier := func(name string) once.Verifier {
		return func(context.Context, once.Action) (bool, json.RawMessage, error) {
			return true, json.RawMessage(`"` + name + `"`), nil
		}
	}
	c, _ := newClient(t, once.Config{
		Default: once.KindPolicy{Recovery: once.VerifyThenDecide, Verifier: verifier("default")},
		Kinds: map[string]once.KindPolicy{
			"inherits": {Lease: time.Minute},
			"own":      {Verifier: verifier("own")},
			"own_mode": {Recovery: once.VerifyThenDecide, Verifier: verifier("own_mode")},
			"asks":     {Recovery: once.AskPerson},
		},
	})
	if c.Policy("asks").Verifier != nil {
		t.Fatal("a kind that asks a person took Default's verifier")
	}
	ctx := context.Background()
	for kind, want := range map[string]string{"inherits": "default", "own": "own", "own_mode": "own_mode", "unnamed": "default"} {
		in := once.Intent{Run: "v", Kind: kind}
		if _, err := once.Do(ctx, c, in, func(context.Context, once.Attempt) (string, error) { return "", errors.New("EOF") }); !errors.Is(err, once.ErrOutcomeUnknown) {
			t.Fatalf("%s: %v", kind, err)
		}
		time.Sleep(10 * time.Millisecond) // due for verification at once
		res, err := once.Do(ctx, c, in, func(context.Context, once.Attempt) (string, error) {
			t.Errorf("%s: re-executed instead of asking the verifier", kind)
			return "", nil
		})
		if err != nil || !res.Replayed || res.Value != want {
			t.Errorf("%s: %+v, %v; want the %s verifier's result", kind, res, err, want)
		}
	}
	_, err := once.Do(ctx, c, once.Intent{Run: "v", Kind: "asks"}, func(context.Context, once.Attempt) (string, error) { return "", errors.New("EOF") })
	if !errors.Is(err, once.ErrReview) {
		t.Fatalf("asks: %v", err)
	}
}

// The verifier's backoff doubles with each failure, up to an hour, and
// after MaxVerifyFailures the action goes to review.
func TestVerifyBackoff(t *testing.T) {
	failing := func(context.Context, once.Action) (bool, json.RawMessage, error) {
		return false, nil, errors.New("provider API down")
	}
	c, s := newClient(t, once.Config{Default: once.KindPolicy{Recovery: once.VerifyThenDecide, Verifier: failing,
		VerifyBackoff: 40 * time.Minute, MaxVerifyFailures: 3}})
	ctx := context.Background()
	k := deadClaim(t, s, once.Intent{Run: "b", Kind: "k"})
	r, err := once.NewReaper(c, once.ReaperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []time.Duration{40 * time.Minute, time.Hour} {
		rep, err := r.RunOnce(ctx)
		if err != nil || rep.Deferred != 1 {
			t.Fatalf("pass %d = %+v, %v; want deferred", i+1, rep, err)
		}
		a, err := s.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if got := a.LeaseUntil.Sub(a.UpdatedAt); a.VerifyFailures != i+1 || got < want-time.Second || got > want+time.Second {
			t.Fatalf("after failure %d: asked again in %v (failures %d), want %v", i+1, got, a.VerifyFailures, want)
		}
		// Bring the next try forward, as the passing of time would.
		if ok, err := s.Transition(ctx, once.Transition{Key: k, Attempt: 1, From: []once.Status{a.Status}, To: a.Status, Lease: time.Millisecond, VerifyFailures: a.VerifyFailures}); !ok || err != nil {
			t.Fatal(ok, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	rep, err := r.RunOnce(ctx)
	if err != nil || rep.Review != 1 {
		t.Fatalf("third failure = %+v, %v; want review", rep, err)
	}
	if a, _ := s.Get(ctx, k); a.Status != once.StatusReview || !strings.Contains(a.Error, "could not tell 3 times") {
		t.Fatalf("stored %+v", a)
	}
}

// New refuses a config it cannot honour, naming the field and what to do.
func TestNewRefusesBadConfig(t *testing.T) {
	_, s := newClient(t, once.Config{})
	v := func(context.Context, once.Action) (bool, json.RawMessage, error) { return false, nil, nil }
	for _, c := range []struct {
		name string
		cfg  once.Config
		want string
	}{
		{"no store", once.Config{}, "Config.Store is nil"},
		{"negative lease", once.Config{Store: s, Default: once.KindPolicy{Lease: -time.Second}}, "Config.Default has a negative"},
		{"negative count", once.Config{Store: s, Kinds: map[string]once.KindPolicy{"k": {MaxVerifyFailures: -1}}}, `Config.Kinds["k"] has a negative`},
		{"short lease", once.Config{Store: s, Kinds: map[string]once.KindPolicy{"k": {Lease: 10 * time.Millisecond}}}, `Config.Kinds["k"].Lease is 10ms; it must be at least 30ms`},
		{"unknown recovery", once.Config{Store: s, Default: once.KindPolicy{Recovery: once.Recovery(9)}}, "Recovery is Recovery(9); use AskPerson"},
		{"verifier without verification", once.Config{Store: s, Kinds: map[string]once.KindPolicy{"k": {Recovery: once.AskPerson, Verifier: v}}}, "a verifier is only asked under VerifyThenDecide"},
		{"default verification without verifier", once.Config{Store: s, Default: once.KindPolicy{Recovery: once.VerifyThenDecide}}, "Config.Default.Recovery is VerifyThenDecide but Verifier is nil"},
		{"kind verification without verifier", once.Config{Store: s, Kinds: map[string]once.KindPolicy{"k": {Recovery: once.VerifyThenDecide}}}, `Config.Kinds["k"].Recovery is VerifyThenDecide but Verifier is nil`},
		{"empty kind", once.Config{Store: s, Kinds: map[string]once.KindPolicy{"": {}}}, "empty kind name"},
		{"negative payload limit", once.Config{Store: s, MaxPayloadBytes: -1}, "must not be negative"},
		{"negative result limit", once.Config{Store: s, MaxResultBytes: -1}, "must not be negative"},
		{"negative record timeout", once.Config{Store: s, RecordTimeout: -time.Second}, "must not be negative"},
		{"negative approval expiry", once.Config{Store: s, Kinds: map[string]once.KindPolicy{"k": {Approval: once.ApprovalPolicy{Always: true, Expiry: -time.Hour}}}}, `Config.Kinds["k"].Approval.Expiry is -1h0m0s`},
		{"sub-second approval expiry", once.Config{Store: s, Default: once.KindPolicy{Approval: once.ApprovalPolicy{Always: true, Expiry: time.Millisecond}}}, "give a person at least a second"},
		{"approval expiry to succeeded", once.Config{Store: s, Default: once.KindPolicy{Approval: once.ApprovalPolicy{Always: true, OnExpiry: once.StatusSucceeded}}}, `OnExpiry is "succeeded"; use once.StatusFailed or once.StatusReview`},
		{"approval always and when", once.Config{Store: s, Default: once.KindPolicy{Approval: once.ApprovalPolicy{Always: true, When: func(once.Intent) bool { return true }}}}, "sets both Always and When"},
	} {
		if _, err := once.New(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: New = %v, want an error containing %q", c.name, err, c.want)
		}
	}
}

func TestRecoveryString(t *testing.T) {
	for r, want := range map[once.Recovery]string{
		once.RecoveryDefault:      "default",
		once.AskPerson:            "ask_person",
		once.RetryWithProviderKey: "retry_with_provider_key",
		once.VerifyThenDecide:     "verify_then_decide",
		once.Recovery(7):          "Recovery(7)",
	} {
		if got := r.String(); got != want {
			t.Errorf("Recovery(%d).String() = %q, want %q", int(r), got, want)
		}
	}
}

// A kind that sets no approval takes Default's, as every field is
// inherited; one that sets its own keeps it, with Default's expiry.
func TestApprovalPolicyValidated(t *testing.T) {
	_, s := newClient(t, once.Config{})
	c, err := once.New(once.Config{Store: s, Default: once.KindPolicy{Approval: once.ApprovalPolicy{Always: true, Expiry: time.Hour}},
		Kinds: map[string]once.KindPolicy{"plain": {Lease: time.Minute}, "own": {Approval: once.ApprovalPolicy{When: func(once.Intent) bool { return false }}}}})
	if err != nil {
		t.Fatal(err)
	}
	if p := c.Policy("plain").Approval; !p.Always || p.Expiry != time.Hour || p.OnExpiry != once.StatusFailed {
		t.Errorf("a kind that sets no approval has %+v; want Default's, failing on expiry", p)
	}
	if p := c.Policy("own").Approval; p.Always || p.When == nil || p.Expiry != time.Hour {
		t.Errorf("a kind with its own approval has %+v; want its When, with Default's expiry", p)
	}
	if p := c.Policy("nobody").Approval; !p.Always {
		t.Errorf("an unconfigured kind's approval %+v; want Default's", p)
	}
	plain, err := once.New(once.Config{Store: s})
	if err != nil {
		t.Fatal(err)
	}
	if p := plain.Policy("k").Approval; p.Always || p.When != nil || p.Expiry != once.DefaultApprovalExpiry {
		t.Errorf("without any approval configured: %+v; want none, with the default expiry", p)
	}
}

// Carrying: a copy of the client whose policy for one kind is the one a
// remote worker's claim carried. The claim is held under it and its
// recovery recorded; the client it was copied from is unchanged; a kind
// the client configures is pinned; a carried policy cannot verify,
// re-drive or ask for approval.
func TestCarrying(t *testing.T) {
	c, s := newClient(t, once.Config{
		Default: once.KindPolicy{Lease: time.Minute},
		Kinds:   map[string]once.KindPolicy{"pinned": {Lease: 2 * time.Minute}},
	})
	cc, err := c.Carrying("send_email", once.KindPolicy{Lease: 5 * time.Second, Recovery: once.RetryWithProviderKey})
	if err != nil {
		t.Fatal(err)
	}
	if p := cc.Policy("send_email"); p.Lease != 5*time.Second || p.Recovery != once.RetryWithProviderKey || p.MaxExecution != c.Policy("").MaxExecution {
		t.Fatalf("carried policy %+v; want the lease and recovery carried over Default's", p)
	}
	if p := c.Policy("send_email"); p.Lease != time.Minute {
		t.Fatalf("the client copied from has %v for the kind; want Default's minute, unchanged", p.Lease)
	}
	if p := cc.Policy("pinned"); p.Lease != 2*time.Minute {
		t.Fatalf("the copy's pinned kind %+v", p)
	}
	in := once.Intent{Run: "r", Step: 1, Kind: "send_email", Target: "ada@example.com"}
	a, err := cc.Claim(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	row, err := s.Get(context.Background(), a.Key)
	if err != nil {
		t.Fatal(err)
	}
	if left := time.Until(row.LeaseUntil); left > 10*time.Second || row.Recovery != once.RetryWithProviderKey {
		t.Fatalf("the claim holds for %v under %v; want the carried 5s lease and recovery", left, row.Recovery)
	}
	for _, bad := range []struct {
		kind string
		p    once.KindPolicy
	}{
		{"pinned", once.KindPolicy{Lease: time.Second}},
		{"", once.KindPolicy{}},
		{"k", once.KindPolicy{Recovery: once.VerifyThenDecide}},
		{"k", once.KindPolicy{Approval: once.ApprovalPolicy{Always: true}}},
		{"k", once.KindPolicy{Redrive: func(context.Context, once.Action) error { return nil }}},
		{"k", once.KindPolicy{Lease: time.Millisecond}},
		{"k", once.KindPolicy{MaxExecution: -time.Second}},
	} {
		if _, err := c.Carrying(bad.kind, bad.p); !errors.Is(err, once.ErrInvalidIntent) {
			t.Errorf("Carrying(%q, %+v) = %v; want it refused as invalid", bad.kind, bad.p, err)
		}
	}
}

// Settled says what an attempt's outcome left its action in, once it
// is recorded: what the kind's recovery made of an unknown outcome.
func TestAttemptSettled(t *testing.T) {
	c, _ := newClient(t, once.Config{Default: once.KindPolicy{Recovery: once.RetryWithProviderKey}})
	a, err := c.Claim(context.Background(), once.Intent{Run: "r", Step: 1, Kind: "send_email"})
	if err != nil {
		t.Fatal(err)
	}
	if st, ok := a.Settled(); ok {
		t.Fatalf("Settled before any outcome = %v", st)
	}
	if err := a.Unknown(context.Background(), errors.New("timed out")); err != nil {
		t.Fatal(err)
	}
	if st, ok := a.Settled(); !ok || st != once.StatusReleased {
		t.Fatalf("Settled after an unknown outcome under RetryWithProviderKey = %v, %v; want released", st, ok)
	}
}
