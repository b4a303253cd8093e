package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oncehq/once/internal/testdb"
)

// setUpOnly runs a run's setup (schemas, fills, prefills) and returns
// the runner, closed at the end of the test.
func setUpOnly(t *testing.T, o Options) *runner {
	t.Helper()
	o, err := o.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	var b [4]byte
	rand.Read(b[:])
	r := &runner{opts: o, tag: hex.EncodeToString(b[:])}
	r.schema = "once_bench_" + r.tag
	t.Cleanup(r.close)
	if err := r.setUp(context.Background()); err != nil {
		t.Fatal(err)
	}
	return r
}

// With a scale, the replay arms read rows of the fill spread evenly over
// all of it, also when the fill is less than twice the replay keys (a
// stride rounded down to 1 once read only the fill's first rows).
func TestScaleReplaysSpreadOverTheFill(t *testing.T) {
	url := testdb.RequirePostgres(t)
	const scale, keys = 1999, 1000
	r := setUpOnly(t, Options{DB: url, Workers: []int{1}, Rounds: 1, Duration: 10 * time.Millisecond,
		Arms: []string{ArmReplayDo}, Scale: scale, ReplayKeys: keys})
	last := slices.Max(r.log.replaySteps)
	if len(r.log.replaySteps) != keys || last < scale*9/10 {
		t.Errorf("replay_do on the filled log reads %d rows of %d, the last at step %d: not spread over the fill", len(r.log.replaySteps), scale, last)
	}
}

// With a scale below the replay keys, an arm and its twin on the empty
// log read as many rows, so that replay_do/replay_do_empty compares logs
// of different sizes, not working sets.
func TestScaleReplayTwinsReadAsManyRows(t *testing.T) {
	url := testdb.RequirePostgres(t)
	r := setUpOnly(t, Options{DB: url, Workers: []int{1}, Rounds: 1, Duration: 10 * time.Millisecond,
		Arms: []string{ArmReplayDo, ArmReplayRaw}, Scale: 50, ReplayKeys: 200})
	if a, b := len(r.log.replaySteps), len(r.empty.replaySteps); a != b {
		t.Errorf("replay_do reads %d keys on the filled log, replay_do_empty %d on the empty one", a, b)
	}
	if a, b := len(r.log.replayKeys), len(r.empty.replayKeys); a != b {
		t.Errorf("replay_raw reads %d keys on the filled log, replay_raw_empty %d on the empty one", a, b)
	}
}

// With only SQLite arms, a scale would fill PostgreSQL tables no arm
// reads: it is refused, naming what to do, before anything runs.
func TestScaleWithOnlySQLiteArms(t *testing.T) {
	_, err := Run(context.Background(), Options{DB: "postgres://nobody@127.0.0.1:1/none", Workers: []int{1}, Rounds: 1,
		Duration: 20 * time.Millisecond, Arms: []string{ArmSQLiteRaw}, Scale: 10})
	if err == nil || !strings.Contains(err.Error(), "only SQLite arms") {
		t.Errorf("a scale with only SQLite arms: %v, want it refused", err)
	}
}
