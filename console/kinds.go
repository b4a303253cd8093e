package console

import (
	"context"
	"net/http"
	"slices"
	"time"

	"github.com/oncehq/once"
)

// kindView is one kind of action as the console shows it: what its rows
// recorded when they were claimed (the policy that travels with the
// data, which every recovery applies), what the process hosting the
// console would apply to a new claim, and how many actions it has in
// each status.
type kindView struct {
	Kind string `json:"kind"`
	// Recorded are the recoveries its actions recorded at their claims;
	// "" for rows from before recoveries were recorded.
	Recorded []string `json:"recorded_recovery"`
	// Latest is what its most recently updated action recorded at its
	// claim: the policy that action's recovery and re-drive follow,
	// whichever process hosts the console.
	Latest recordedView          `json:"recorded"`
	Counts map[once.Status]int64 `json:"counts"`
	Total  int64                 `json:"total"`
	// Configured says this process configures the kind; Policy is what
	// it would give a new claim (its defaults, when not configured).
	Configured bool       `json:"configured_here"`
	Policy     policyView `json:"policy"`
}

// recordedView is the policy an action recorded at its claim.
type recordedView struct {
	Recovery string `json:"recovery"`
	// Retention is zero for a row from before it was recorded.
	Retention time.Duration `json:"retention_ns"`
	// RedriveAfter is zero for a row from before it was recorded
	// (once.DefaultRedriveAfter applies); Redrive says the claiming
	// application had a re-drive hook for the kind.
	RedriveAfter time.Duration `json:"redrive_after_ns"`
	Redrive      bool          `json:"redrive"`
}

// policyView is a kind policy as this process has it.
type policyView struct {
	Recovery     string        `json:"recovery"`
	Lease        time.Duration `json:"lease_ns"`
	MaxExecution time.Duration `json:"max_execution_ns"`
	Retention    time.Duration `json:"retention_ns"`
	RedriveAfter time.Duration `json:"redrive_after_ns"`
	// Verifier and Redrive say whether this process holds the kind's
	// verifier and re-drive hook: only a process with the verifier
	// decides its VerifyThenDecide actions.
	Verifier bool `json:"verifier"`
	Redrive  bool `json:"redrive"`
}

// kindViews groups the store's counts by kind, with what each kind's
// most recently updated action recorded: one brief read per kind,
// through the kind's index.
func (s *server) kindViews(ctx context.Context, st []once.StatusCount) ([]kindView, error) {
	byKind := map[string]*kindView{}
	var kinds []string
	for _, sc := range st {
		k := byKind[sc.Kind]
		if k == nil {
			p := s.client.Policy(sc.Kind)
			k = &kindView{Kind: sc.Kind, Counts: map[once.Status]int64{}, Configured: s.client.Configured(sc.Kind), Policy: policyView{
				Recovery: p.Recovery.String(), Lease: p.Lease, MaxExecution: p.MaxExecution, Retention: p.Retention,
				RedriveAfter: p.RedriveAfter, Verifier: p.Verifier != nil, Redrive: p.Redrive != nil,
			}}
			byKind[sc.Kind] = k
			kinds = append(kinds, sc.Kind)
		}
		rec := ""
		if sc.Recovery != once.RecoveryDefault {
			rec = sc.Recovery.String()
		}
		if !slices.Contains(k.Recorded, rec) {
			k.Recorded = append(k.Recorded, rec)
		}
		k.Counts[sc.Status] += sc.Count
		k.Total += sc.Count
	}
	slices.Sort(kinds)
	out := make([]kindView, len(kinds))
	for i, kind := range kinds {
		out[i] = *byKind[kind]
		slices.Sort(out[i].Recorded)
		latest, err := s.client.List(ctx, once.Filter{Kind: kind, Limit: 1, Brief: true})
		if err != nil {
			return nil, err
		}
		if len(latest) == 1 {
			a := latest[0]
			out[i].Latest = recordedView{Retention: a.Retention, RedriveAfter: a.RedriveAfter, Redrive: a.Redrive}
			if a.Recovery != once.RecoveryDefault {
				out[i].Latest.Recovery = a.Recovery.String()
			}
		}
	}
	return out, nil
}

type kindsData struct {
	Kinds    []kindView
	Statuses []once.Status
	// Counted is when the finished actions were counted, when not now
	// (countedAsOf).
	Counted time.Time
}

func (s *server) kinds(w http.ResponseWriter, r *http.Request) {
	st, err := s.client.Stats(r.Context())
	if err != nil {
		s.renderError(w, r, http.StatusInternalServerError, "Store unavailable", "Reading the action counts failed: "+err.Error())
		return
	}
	kinds, err := s.kindViews(r.Context(), st)
	if err != nil {
		s.renderError(w, r, http.StatusInternalServerError, "Store unavailable", "Reading the kinds' actions failed: "+err.Error())
		return
	}
	s.render(w, r, http.StatusOK, "kinds", page{Title: "Kinds", Nav: "kinds", Data: kindsData{Kinds: kinds, Statuses: once.Statuses(), Counted: countedAsOf(st)}})
}

func (s *server) apiKinds(w http.ResponseWriter, r *http.Request) {
	st, err := s.client.Stats(r.Context())
	if err != nil {
		s.apiFail(w, r, "reading the counts", err)
		return
	}
	kinds, err := s.kindViews(r.Context(), st)
	if err != nil {
		s.apiFail(w, r, "reading the kinds' actions", err)
		return
	}
	writeJSON(w, http.StatusOK, kinds)
}
