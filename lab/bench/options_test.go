package bench

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseWorkers(t *testing.T) {
	ws, err := ParseWorkers(" 1, 16,64")
	if err != nil || !slices.Equal(ws, []int{1, 16, 64}) {
		t.Errorf("ParseWorkers = %v, %v; want [1 16 64]", ws, err)
	}
	for in, want := range map[string]string{
		"1,x":   `"x" is not a number`,
		"":      `"" is not a number`,
		"1,,2":  `"" is not a number`,
		"0":     "between 1 and 512, not 0",
		"-4":    "between 1 and 512, not -4",
		"1000":  "between 1 and 512, not 1000",
		"4,8,4": "4 is listed twice",
		"1.5":   `"1.5" is not a number`,
	} {
		if _, err := ParseWorkers(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseWorkers(%q) = %v, want an error saying %q", in, err, want)
		}
	}
}

func TestParseArms(t *testing.T) {
	arms, err := ParseArms("do, raw,sqlite_do")
	if err != nil || !slices.Equal(arms, []string{ArmRaw, ArmDo, ArmSQLiteDo}) {
		t.Errorf("ParseArms = %v, %v; want them in report order", arms, err)
	}
	if arms, err := ParseArms(""); err != nil || !slices.Equal(arms, Arms()) {
		t.Errorf(`ParseArms("") = %v, %v; want every arm`, arms, err)
	}
	_, err = ParseArms("raw,fast")
	if err == nil || !strings.Contains(err.Error(), `no arm "fast"; the arms are raw, raw_batched,`) {
		t.Errorf(`ParseArms("raw,fast") = %v; want it to name the arm and list the arms`, err)
	}
}

// TestOptionsRefused: every mistake is an error naming it, found before
// anything connects.
func TestOptionsRefused(t *testing.T) {
	ok := Options{DB: "postgres://u@127.0.0.1:1/db", Workers: []int{1}}
	if _, err := ok.withDefaults(); err != nil {
		t.Fatalf("valid options refused: %v", err)
	}
	for _, tc := range []struct {
		change func(*Options)
		want   string
	}{
		{func(o *Options) { o.Rounds = -1 }, "rounds must be between 1 and 1000, not -1"},
		{func(o *Options) { o.Duration = time.Millisecond }, "duration must be between 10ms and 1h0m0s, not 1ms"},
		{func(o *Options) { o.Scale = -5 }, "scale must be between"},
		{func(o *Options) { o.Workers = nil }, "give at least one worker count"},
		{func(o *Options) { o.Workers = []int{0} }, "between 1 and 512, not 0"},
		{func(o *Options) { o.Arms = []string{"raw", "fastest"} }, `no arm "fastest"`},
		{func(o *Options) { o.DB = "once.db" }, "must be PostgreSQL (--db postgres://user@host:5432/db), not a SQLite file"},
		{func(o *Options) { o.DB = "sqlite:/tmp/x.db" }, "not a SQLite file"},
		{func(o *Options) { o.DB = "mysql://u@h/db" }, "must be PostgreSQL"},
		{func(o *Options) { o.DB = "postgres://u@h/db?once_schema=mine" }, "leave once_schema and once_prefix out"},
	} {
		o := ok
		tc.change(&o)
		if _, err := o.withDefaults(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v; want an error saying %q", o, err, tc.want)
		}
	}
}
