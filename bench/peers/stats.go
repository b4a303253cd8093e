package main

import (
	"math"
	"slices"
	"time"
)

// median returns the middle value of xs (the mean of the two middle ones
// for an even count), or 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

// percentile returns the p-quantile (0 < p ≤ 1) of ds by the nearest-rank
// method, or 0 for none.
func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return percentileSorted(s, p)
}

// percentileSorted is percentile of ds already in ascending order.
func percentileSorted(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(ds)))) - 1
	return ds[max(0, min(i, len(ds)-1))]
}

// micros is d in microseconds.
func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// round rounds x to the given number of decimals, so the JSON does not
// print digits that mean nothing.
func round(x float64, decimals int) float64 {
	f := math.Pow(10, float64(decimals))
	return math.Round(x*f) / f
}
