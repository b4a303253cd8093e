package mcpgate

import (
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/oncehq/once"
)

func TestParsePolicyRefusesWhatItWouldMisread(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{`{}`, `"server" is required`},
		{`{"server": "a/b"}`, `no "/"`},
		{`{"server": "m", "tools": {"t": {"key": ["to"]}}}`, "must start with /"},
		{`{"server": "m", "tools": {"t": {"key": ["/a~2"]}}}`, "~0 or ~1"},
		{`{"server": "m", "tools": {"t": {"recovery": "retry"}}}`, "ask_person, retry_with_provider_key or verify_then_decide"},
		{`{"server": "m", "tools": {"t": {"recovery": "verify_then_decide"}}}`, `needs a "verifier"`},
		{`{"server": "m", "tools": {"t": {"verifier": {"tool": "f", "landed": "/found"}}}}`, "only with recovery verify_then_decide"},
		{`{"server": "m", "tools": {"t": {"recovery": "verify_then_decide", "verifier": {"tool": "f"}}}}`, `needs "landed"`},
		{`{"server": "m", "tools": {"t": {"lease": "soon"}}}`, "positive duration"},
		{`{"server": "m", "tools": {"t": {"wait": "1h"}}}`, "a caller waiting that long"},
		{`{"server": "m", "tools": {"t": {"read_only": true, "key": ["/a"]}}}`, "passes the tool through unclaimed"},
		{`{"server": "m", "tools": {"t": {"on_error": "retry"}}}`, "succeed or release"},
		{`{"server": "m", "tools": {"t": {"approval": {"expiry": "1h"}}}}`, `"always": true`},
		{`{"server": "m", "tools": {"t": {"provider_key": "/k"}}}`, "top-level argument"},
		{`{"server": "m", "tools": {"t": {"lease": "1m"}, "t": {}}}`, `names tool "t" twice`},
		{`{"server": "m", "tools": {"t": {"leese": "1m"}}}`, `unknown field "leese"`},
		{`{"server": "m", "default": {"key": ["/a"]}}`, "a tool's own"},
		{`{"server": "m"} {"server": "n"}`, "after top-level value"},
		{`{"server": "m", "tools": {"t": {"key": ["/a","/b","/c","/d","/e","/f","/g","/h","/i","/j","/k","/l","/m","/n","/o","/p","/q"]}}}`, "at most 16"},
	} {
		_, err := ParsePolicy(strings.NewReader(tc.file))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParsePolicy(%s): %v; want an error saying %q", tc.file, err, tc.want)
		}
	}
	if _, err := ParsePolicy(strings.NewReader(strings.Repeat(" ", MaxPolicyFile+1))); err == nil || !strings.Contains(err.Error(), "over") {
		t.Errorf("an oversized file: %v", err)
	}
}

func TestResolveTakesTheFileThenTheDefaultThenTheAnnotations(t *testing.T) {
	f, err := ParsePolicy(strings.NewReader(`{"server": "m", "trust_annotations": true,
	  "default": {"lease": "10s"},
	  "tools": {"charge": {"provider_key": "idempotency_key"}, "lookup": {"read_only": false}}}`))
	if err != nil {
		t.Fatal(err)
	}
	yes := true
	for _, tc := range []struct {
		tool *mcp.Tool
		pass bool
		rec  once.Recovery
	}{
		{&mcp.Tool{Name: "charge"}, false, once.RetryWithProviderKey},
		{&mcp.Tool{Name: "search", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, true, 0},
		// The file's word beats the annotation.
		{&mcp.Tool{Name: "lookup", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, false, once.AskPerson},
		{&mcp.Tool{Name: "put", Annotations: &mcp.ToolAnnotations{IdempotentHint: true}}, false, once.RetryWithProviderKey},
		{&mcp.Tool{Name: "delete", Annotations: &mcp.ToolAnnotations{DestructiveHint: &yes}}, false, once.AskPerson},
		{&mcp.Tool{Name: "unannotated"}, false, once.AskPerson},
	} {
		p := f.resolve(tc.tool)
		if p.pass != tc.pass || !p.pass && p.kind.Recovery != tc.rec {
			t.Errorf("%s: pass %v recovery %v; want pass %v recovery %v", tc.tool.Name, p.pass, p.kind.Recovery, tc.pass, tc.rec)
		}
		if !p.pass && p.kind.Lease.String() != "10s" {
			t.Errorf("%s: lease %v; want the default's 10s", tc.tool.Name, p.kind.Lease)
		}
	}
	untrusting, _ := ParsePolicy(strings.NewReader(`{"server": "m"}`))
	if p := untrusting.resolve(&mcp.Tool{Name: "search", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}); p.pass {
		t.Errorf("a read-only hint passed through although the file does not trust annotations")
	}
}

func TestPointerFindsValuesAsWritten(t *testing.T) {
	doc := []byte(`{"to": "a@example.com", "a/b": {"~x": [10, 2.50]}, "n": 1e2}`)
	for _, tc := range []struct{ ptr, want string }{
		{"/to", `"a@example.com"`}, {"/a~1b/~0x/1", `2.50`}, {"/n", `1e2`}, {"", string(doc)},
	} {
		p, err := parsePointer(tc.ptr)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := p.find(doc)
		if !ok || string(got) != tc.want {
			t.Errorf("%s: %s %v; want %s", tc.ptr, got, ok, tc.want)
		}
	}
	for _, miss := range []string{"/none", "/a~1b/~0x/2", "/a~1b/~0x/01", "/to/x"} {
		p, _ := parsePointer(miss)
		if _, ok := p.find(doc); ok {
			t.Errorf("%s found something", miss)
		}
	}
}
