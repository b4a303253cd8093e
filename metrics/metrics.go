// Package metrics exports once's transitions as Prometheus metrics.
//
// Counters come from the client's hooks; the per-status gauges (the
// review backlog among them) are counted at scrape time through the
// client's read API (Client.Stats), so they are right across every
// process sharing the database. The client needs the hooks before it
// exists, and the gauges need the client, so the client is handed over
// after once.New:
//
//	m, err := metrics.New(prometheus.DefaultRegisterer, nil)
//	client, err := once.New(once.Config{Store: store, Hooks: m.Hooks()})
//	m.SetStats(client)
//
// A process that already has a client (one without these hooks, or a
// dashboard that only counts) passes it to New directly.
package metrics

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncehq/once"
)

// Metrics holds the collectors. Register it once per registry.
type Metrics struct {
	claims      *prometheus.CounterVec
	replays     *prometheus.CounterVec
	conflicts   *prometheus.CounterVec
	mismatches  *prometheus.CounterVec
	outcomes    *prometheus.CounterVec
	recoveries  *prometheus.CounterVec
	expiries    *prometheus.CounterVec
	resolutions *prometheus.CounterVec
	redriven    *prometheus.CounterVec
	waits       *prometheus.CounterVec
	decisions   *prometheus.CounterVec
	waiting     prometheus.Gauge
	effect      *prometheus.HistogramVec
	verify      *prometheus.HistogramVec
	actions     *prometheus.Desc
	scrapeErr   prometheus.Gauge

	mu    sync.Mutex
	stats StatsSource
}

// StatsSource is what the per-status gauges are counted from: a
// *once.Client.
type StatsSource interface {
	Stats(context.Context) ([]once.StatusCount, error)
}

// New makes the collectors and registers them with reg. stats, if not
// nil, is counted by kind and status at every scrape; nil leaves the
// gauges out until SetStats.
func New(reg prometheus.Registerer, stats StatsSource) (*Metrics, error) {
	if reg == nil {
		return nil, errors.New("metrics: New needs a prometheus.Registerer, such as prometheus.DefaultRegisterer")
	}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "once", Name: name, Help: help}, labels)
	}
	m := &Metrics{
		claims:      counter("claims_total", "Claims won: a new attempt started.", "kind"),
		replays:     counter("replays_total", "Duplicates answered from the store without running the effect.", "kind", "status"),
		conflicts:   counter("in_flight_conflicts_total", "Duplicates that met a claim held by another attempt.", "kind"),
		mismatches:  counter("fingerprint_refusals_total", "Attempts refused because their payload differed from the first.", "kind"),
		outcomes:    counter("outcomes_total", "Outcomes recorded by workers, by status.", "kind", "status"),
		recoveries:  counter("recoveries_total", "Unknown outcomes recovered, by recovery mode and outcome.", "kind", "recovery", "outcome"),
		expiries:    counter("lease_expiries_total", "Claims whose lease lapsed: their worker stopped answering.", "kind"),
		resolutions: counter("resolutions_total", "Decisions by people, by the status they led to.", "kind", "status"),
		redriven:    counter("redriven_total", "Released actions handed to their kind's Redrive hook because no delivery claimed them.", "kind"),
		waits:       counter("approval_waits_total", "Actions that began to wait for a person's approval.", "kind"),
		decisions:   counter("approval_decisions_total", "Decisions on actions that waited for approval: approved, rejected, or expired unanswered.", "kind", "decision"),
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "once", Name: "released_waiting",
			Help: "Released actions past their kind's RedriveAfter that could not be re-driven, at the last reaper pass: they run only if their job is delivered again."}),
		effect: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "once", Name: "effect_duration_seconds",
			Help: "How long effects ran, by outcome.", Buckets: prometheus.ExponentialBuckets(0.001, 4, 10)}, []string{"kind", "status"}),
		verify: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "once", Name: "verify_duration_seconds",
			Help: "How long verifiers took.", Buckets: prometheus.ExponentialBuckets(0.001, 4, 10)}, []string{"kind"}),
		actions: prometheus.NewDesc("once_actions", "Actions in the store by kind and status; status=\"review\" is the review backlog. On a large log, succeeded and failed are from a count made now and then.",
			[]string{"kind", "status"}, nil),
		scrapeErr: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "once", Name: "store_scrape_error",
			Help: "1 if the last count of the store failed."}),
		stats: stats,
	}
	for _, c := range []prometheus.Collector{m.claims, m.replays, m.conflicts, m.mismatches, m.outcomes, m.recoveries,
		m.expiries, m.resolutions, m.redriven, m.waits, m.decisions, m.waiting, m.effect, m.verify, m.scrapeErr, storeCollector{m}} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// SetStats sets what the per-status gauges are counted from, for a
// client made after New because it takes Hooks. It is safe to call while
// a scrape runs; nil turns the gauges off.
func (m *Metrics) SetStats(stats StatsSource) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stats = stats
}

// ObservePass takes a reaper pass's report, as once.ReaperConfig.OnPass:
// it sets once_released_waiting from a pass that did not fail.
//
//	once.NewReaper(c, once.ReaperConfig{OnPass: m.ObservePass})
func (m *Metrics) ObservePass(rep once.ReapReport, err error) {
	if err != nil {
		// A failed pass may not have counted the released actions: keep
		// the last count rather than clear an alert during an outage.
		return
	}
	m.waiting.Set(float64(rep.Waiting))
}

// Hooks returns the hooks to put in once.Config.
func (m *Metrics) Hooks() once.Hooks { return once.Hooks{OnEvent: m.Observe} }

// Observe counts one observation.
func (m *Metrics) Observe(_ context.Context, o once.Observation) {
	k := o.Kind
	switch o.Type {
	case once.EventClaimed:
		m.claims.WithLabelValues(k).Inc()
	case once.EventReplayed:
		m.replays.WithLabelValues(k, string(o.From)).Inc()
	case once.EventConflict:
		m.conflicts.WithLabelValues(k).Inc()
	case once.EventFingerprintMismatch:
		m.mismatches.WithLabelValues(k).Inc()
	case once.EventLeaseExpired:
		m.expiries.WithLabelValues(k).Inc()
	case once.EventVerifyFailed:
		m.recoveries.WithLabelValues(k, o.Recovery.String(), "verify_failed").Inc()
		m.verify.WithLabelValues(k).Observe(o.Duration.Seconds())
	case once.EventResolved:
		m.resolutions.WithLabelValues(k, string(o.To)).Inc()
	case once.EventRedriven:
		m.redriven.WithLabelValues(k).Inc()
	case once.EventAwaitingApproval:
		m.waits.WithLabelValues(k).Inc()
	case once.EventApproved, once.EventRejected, once.EventExpired:
		m.decisions.WithLabelValues(k, string(o.Type)).Inc()
	default:
		// A worker's own outcome; not recovery's decision (a takeover, a
		// verifier's answer, a dead claim put up for review), which is
		// a recovery whoever made it.
		if o.Actor == once.ActorWorker && o.From == once.StatusInFlight && !o.Recovered {
			m.outcomes.WithLabelValues(k, string(o.To)).Inc()
			if o.Duration > 0 {
				m.effect.WithLabelValues(k, string(o.To)).Observe(o.Duration.Seconds())
			}
			return
		}
		if o.Type == once.EventReview || o.Type == once.EventReleased || o.Type == once.EventTakenOver || o.Type == once.EventVerified {
			m.recoveries.WithLabelValues(k, o.Recovery.String(), string(o.Type)).Inc()
		}
	}
}

// storeCollector counts the actions at scrape time.
type storeCollector struct{ m *Metrics }

func (c storeCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.m.actions }

func (c storeCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	src := c.m.stats
	c.m.mu.Unlock()
	if src == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stats, err := src.Stats(ctx)
	if err != nil {
		c.m.scrapeErr.Set(1)
		return
	}
	c.m.scrapeErr.Set(0)
	// Stats splits a kind's counts by the recovery its rows recorded;
	// the gauge is by kind and status.
	type cell struct {
		kind   string
		status once.Status
	}
	sum := map[cell]int64{}
	var order []cell
	for _, s := range stats {
		k := cell{s.Kind, s.Status}
		if _, seen := sum[k]; !seen {
			order = append(order, k)
		}
		sum[k] += s.Count
	}
	for _, k := range order {
		ch <- prometheus.MustNewConstMetric(c.m.actions, prometheus.GaugeValue, float64(sum[k]), k.kind, string(k.status))
	}
}
