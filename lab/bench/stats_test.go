package bench

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

func TestRotate(t *testing.T) {
	arms := []string{"a", "b", "c"}
	for _, tc := range []struct {
		round int
		want  []string
	}{
		{0, []string{"a", "b", "c"}},
		{1, []string{"b", "c", "a"}},
		{2, []string{"c", "a", "b"}},
		{3, []string{"a", "b", "c"}},
		{7, []string{"b", "c", "a"}},
		{-1, []string{"c", "a", "b"}},
	} {
		if got := rotate(arms, tc.round); !slices.Equal(got, tc.want) {
			t.Errorf("rotate(%v, %d) = %v, want %v", arms, tc.round, got, tc.want)
		}
	}
	if !slices.Equal(arms, []string{"a", "b", "c"}) {
		t.Errorf("rotate changed its argument: %v", arms)
	}
	if got := rotate([]string(nil), 3); len(got) != 0 {
		t.Errorf("rotate(nil, 3) = %v, want none", got)
	}
}

// TestRotateEveryPosition: over as many rounds as there are arms, each
// arm runs once in each position.
func TestRotateEveryPosition(t *testing.T) {
	arms := Arms()
	seen := map[string]map[int]bool{}
	for round := range len(arms) {
		for pos, a := range rotate(arms, round) {
			if seen[a] == nil {
				seen[a] = map[int]bool{}
			}
			seen[a][pos] = true
		}
	}
	for _, a := range arms {
		if len(seen[a]) != len(arms) {
			t.Errorf("arm %s ran in positions %v over %d rounds, want each of 0..%d once", a, seen[a], len(arms), len(arms)-1)
		}
	}
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		xs   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{4}, 4},
		{[]float64{3, 1, 2}, 2},
		{[]float64{4, 1, 3, 2}, 2.5},
		{[]float64{5, 5, 1, 9, 9}, 5},
	} {
		in := slices.Clone(tc.xs)
		if got := median(tc.xs); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.xs, got, tc.want)
		}
		if !slices.Equal(in, tc.xs) {
			t.Errorf("median sorted its argument: %v", tc.xs)
		}
	}
}

// TestRatioMedian: the median of per-round ratios, not the ratio of
// medians or of totals, and rounds without a figure left out.
func TestRatioMedian(t *testing.T) {
	for _, tc := range []struct {
		a, b   []float64
		want   float64
		wantOK bool
	}{
		{[]float64{1, 2, 3}, []float64{2, 2, 2}, 1, true},
		// A slow round for both (the second) is one ratio among three.
		{[]float64{100, 10, 100}, []float64{200, 10, 200}, 0.5, true},
		// The ratio of totals would be 0.55, of medians 0.5.
		{[]float64{10, 100, 10}, []float64{10, 200, 40}, 0.5, true},
		{[]float64{1, 2}, []float64{0, 4}, 0.5, true},
		{[]float64{1, 2, 3}, []float64{1}, 1, true},
		{[]float64{1}, []float64{0}, 0, false},
		{nil, nil, 0, false},
	} {
		got, ok := ratioMedian(tc.a, tc.b)
		if got != tc.want || ok != tc.wantOK {
			t.Errorf("ratioMedian(%v, %v) = %v, %v; want %v, %v", tc.a, tc.b, got, ok, tc.want, tc.wantOK)
		}
	}
}

func TestPercentile(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 100; i++ {
		ds = append(ds, time.Duration(i))
	}
	for _, tc := range []struct {
		ds   []time.Duration
		p    float64
		want time.Duration
	}{
		{ds, 50, 50},
		{ds, 99, 99},
		{ds, 100, 100},
		{ds, 0.5, 1},
		{ds[:10], 99, 10},
		{ds[:10], 50, 5},
		{ds[:1], 99, 1},
		{nil, 50, 0},
	} {
		if got := percentile(tc.ds, tc.p); got != tc.want {
			t.Errorf("percentile(%d values, %v) = %v, want %v", len(tc.ds), tc.p, got, tc.want)
		}
	}
}

// TestSummarize: rates, per-action figures and ratios are medians over
// rounds; SQLite arms have no commits or WAL; full-page images are
// given only for an arm whose every round could read them.
func TestSummarize(t *testing.T) {
	o := Options{Workers: []int{2}, Rounds: 3, Duration: time.Second, Arms: []string{ArmRaw, ArmDo, ArmSQLiteRaw, ArmSQLiteDo}}
	pg := func(actions int64, commits, wal int64) sample {
		return sample{actions: actions, elapsed: time.Second, pg: true, commits: commits, wal: wal, mallocs: uint64(actions) * 10,
			lat: []time.Duration{time.Millisecond, 3 * time.Millisecond}, fpi: wal / 10, fpiKnown: true}
	}
	unread := func(s sample) sample { s.fpi, s.fpiKnown = 0, false; return s }
	lite := func(actions int64) sample {
		return sample{actions: actions, elapsed: time.Second, mallocs: uint64(actions), lat: []time.Duration{2 * time.Millisecond}}
	}
	all := samples{
		ArmRaw:       {2: {pg(100, 200, 1000), pg(50, 100, 500), pg(100, 200, 1000)}},
		ArmDo:        {2: {pg(50, 100, 3000), unread(pg(10, 30, 300)), pg(40, 80, 2000)}},
		ArmSQLiteRaw: {2: {lite(10), lite(10), lite(10)}},
		ArmSQLiteDo:  {2: {lite(5), lite(20), lite(1)}},
	}
	rep := summarize(o, all)
	if len(rep.Arms) != 4 {
		t.Fatalf("%d results, want 4: %+v", len(rep.Arms), rep.Arms)
	}
	raw, do, lite0 := rep.Arms[0], rep.Arms[1], rep.Arms[2]
	if raw.Name != ArmRaw || raw.Actions != 250 || raw.ActionsPerS != 100 || *raw.CommitsPerAction != 2 || *raw.WALBytesPerAction != 10 || raw.AllocsPerAction != 10 {
		t.Errorf("raw: %+v", raw)
	}
	if raw.WALFPIBytesPerAction == nil || *raw.WALFPIBytesPerAction != 1 {
		t.Errorf("raw's full-page images per action: %v, want 1", raw.WALFPIBytesPerAction)
	}
	if do.ActionsPerS != 40 || *do.CommitsPerAction != 2 || *do.WALBytesPerAction != 50 {
		t.Errorf("do: %+v (commits %v, WAL %v)", do, *do.CommitsPerAction, *do.WALBytesPerAction)
	}
	if do.WALFPIBytesPerAction != nil {
		t.Errorf("do's full-page images per action: %v, want none, as one round could not read them", *do.WALFPIBytesPerAction)
	}
	if raw.P50us != 1000 || raw.P99us != 3000 {
		t.Errorf("raw latencies: p50 %v p99 %v, want 1000 and 3000", raw.P50us, raw.P99us)
	}
	if lite0.CommitsPerAction != nil || lite0.WALBytesPerAction != nil || lite0.WALFPIBytesPerAction != nil {
		t.Errorf("sqlite_raw has commits or WAL: %+v", lite0)
	}
	// Rounds: do/raw 0.5, 0.2, 0.4; sqlite 0.5, 2, 0.1.
	want := map[string]float64{"do/raw@2": 0.4, "sqlite_do/sqlite_raw@2": 0.5}
	if fmt.Sprint(rep.Ratios) != fmt.Sprint(want) {
		t.Errorf("ratios %v, want %v", rep.Ratios, want)
	}
}
