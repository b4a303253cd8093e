package view

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/oncehq/once"
)

// TimeLayout is how times are shown to people: UTC, to the second,
// sortable.
const TimeLayout = "2006-01-02 15:04:05"

// Time formats t in TimeLayout, in UTC; a zero time is "".
func Time(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(TimeLayout)
}

// Ago says how far t is from now, in the coarse words an operator scans
// for: "5m 3s ago", "in 2m 0s"; a zero time is "".
func Ago(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	d := time.Since(t)
	if d < 0 {
		return "in " + Duration(-d)
	}
	if d < time.Second {
		return "just now"
	}
	return Duration(d) + " ago"
}

// Duration rounds d to its two largest units: "42s", "5m 3s", "2h 10m",
// "3d 4h".
func Duration(d time.Duration) string {
	switch {
	case d < time.Second:
		return "<1s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm %ds", int(d/time.Minute), int(d%time.Minute/time.Second))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh %dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
	default:
		return fmt.Sprintf("%dd %dh", int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour))
	}
}

// ShortKeyLen is how much of a key lists show: enough to tell keys apart
// by eye and to find one again (a key prefix of 8 or more characters
// names it).
const ShortKeyLen = 12

// ShortKey is the first ShortKeyLen characters of k.
func ShortKey(k once.Key) string {
	if len(k) > ShortKeyLen {
		return string(k[:ShortKeyLen])
	}
	return string(k)
}

// StatusList names every status, comma-separated, for messages that say
// which values are accepted.
func StatusList() string {
	ss := make([]string, len(once.Statuses()))
	for i, s := range once.Statuses() {
		ss[i] = string(s)
	}
	return strings.Join(ss, ", ")
}

// Encode writes v as indented JSON and a newline: the form both the
// command and the console's API print.
func Encode(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
