package cli

import (
	"slices"
	"testing"
)

// TestAllowedHosts: the names `once serve` answers for each kind of
// bind address.
func TestAllowedHosts(t *testing.T) {
	loop := []string{"127.0.0.1", "::1", "localhost"}
	tests := []struct {
		host  string
		extra []string
		want  []string
	}{
		{"127.0.0.1", nil, loop},
		{"localhost", nil, loop},
		{"::1", []string{"console.test"}, append(slices.Clone(loop), "console.test")},
		{"127.0.0.2", nil, append(slices.Clone(loop), "127.0.0.2")},
		{"10.1.2.3", nil, []string{"10.1.2.3"}},
		{"Ops.Example", []string{"10.1.2.3"}, []string{"ops.example", "10.1.2.3"}},
		// Every interface: any name (the token guards it), unless names
		// are given; then those and loopback.
		{"0.0.0.0", nil, nil},
		{"", nil, nil},
		{"::", []string{"ops.example"}, append(slices.Clone(loop), "ops.example")},
	}
	for _, tt := range tests {
		if got := allowedHosts(tt.host, tt.extra); !slices.Equal(got, tt.want) {
			t.Errorf("allowedHosts(%q, %q) = %q, want %q", tt.host, tt.extra, got, tt.want)
		}
	}
	var l hostList
	for _, bad := range []string{"", "http://x", "x:80", "a b"} {
		if err := l.Set(bad); err == nil {
			t.Errorf("--allow-host %q accepted", bad)
		}
	}
	for _, good := range []string{"Console.Example", "[::1]", "10.0.0.1"} {
		if err := l.Set(good); err != nil {
			t.Errorf("--allow-host %q: %v", good, err)
		}
	}
	if want := []string{"console.example", "::1", "10.0.0.1"}; !slices.Equal(l, want) {
		t.Errorf("--allow-host values %q, want %q", l, want)
	}
}
