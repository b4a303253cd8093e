package bench

import (
	"slices"
	"time"
)

// rotate returns s started at its r-th element, wrapping round: round r
// of a run takes the arms in rotate(arms, r), so each arm runs in each
// position as often as the rounds allow, and none always runs first on a
// cold cache or last on a table the others filled.
func rotate[T any](s []T, r int) []T {
	out := make([]T, 0, len(s))
	if len(s) == 0 {
		return out
	}
	k := r % len(s)
	if k < 0 {
		k += len(s)
	}
	return append(append(out, s[k:]...), s[:k]...)
}

// median returns the middle value of xs (the mean of the two middle ones
// for an even count), and 0 for none. xs is not changed.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// ratioMedian returns the median over rounds of a[i]/b[i], the two arms'
// figures in the same round: a round in which the machine was slow for
// both counts as much as any other, where a ratio of totals would weigh
// it by its length. Rounds where either arm has no figure, or b's is 0,
// are left out; ok is false when none is left.
func ratioMedian(a, b []float64) (r float64, ok bool) {
	var rs []float64
	for i := range min(len(a), len(b)) {
		if b[i] > 0 && a[i] >= 0 {
			rs = append(rs, a[i]/b[i])
		}
	}
	if len(rs) == 0 {
		return 0, false
	}
	return median(rs), true
}

// percentile returns the p-th percentile (0 < p <= 100) of sorted by the
// nearest-rank method: the smallest value at or below which p percent of
// them lie. It is 0 for none.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	// The rank is ceil(p/100 * n), from 1.
	rank := int(p / 100 * float64(len(sorted)))
	if float64(rank) < p/100*float64(len(sorted)) {
		rank++
	}
	rank = max(rank, 1)
	return sorted[min(rank, len(sorted))-1]
}
