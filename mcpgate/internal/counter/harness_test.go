package counter_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncehq/once/internal/npmlock"

	"github.com/oncehq/once/mcpgate/internal/counter"
)

// tsDir is the TypeScript harness, relative to this package.
const tsDir = "../../test/ts"

var (
	npmOnce sync.Once
	npmErr  error
)

// harness makes sure node and the harness's packages are there. Without
// node the test is skipped, except in CI, where a skip would hide that
// the hosts' SDKs were never tried.
func harness(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is missing, and CI=true: the TypeScript harness must run in CI", tool)
			}
			t.Skipf("%s is missing: skipping the TypeScript harness (install Node.js 20+ to run it)", tool)
		}
	}
	npmlock.Hold(t, tsDir)
	npmOnce.Do(func() {
		cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund", "--prefer-offline")
		cmd.Dir = tsDir
		if out, err := cmd.CombinedOutput(); err != nil {
			npmErr = fmt.Errorf("npm ci: %v\n%s", err, out)
		}
	})
	if npmErr != nil {
		t.Fatal(npmErr)
	}
}

type line struct {
	Connected *struct {
		SDK             string `json:"sdk"`
		ProtocolVersion string `json:"protocolVersion"`
	} `json:"connected"`
	Progress map[string]any `json:"progress"`
	OK       bool           `json:"ok"`
	Result   *struct {
		IsError           bool            `json:"isError"`
		StructuredContent json.RawMessage `json:"structuredContent"`
	} `json:"result"`
	Error map[string]any `json:"error"`
}

// callTS runs call.mjs and parses its lines.
func callTS(t *testing.T, args ...string) []line {
	t.Helper()
	cmd := exec.Command("node", append([]string{"call.mjs"}, args...)...)
	cmd.Dir = tsDir
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Errorf("call.mjs %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	var lines []line
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var l line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("call.mjs printed %q: %v", sc.Text(), err)
		}
		lines = append(lines, l)
	}
	return lines
}

// TestTypeScriptHarness calls the counter directly with both TypeScript
// SDKs over stdio and HTTP, so that later tests can put the gateway
// between them and trust the harness.
func TestTypeScriptHarness(t *testing.T) {
	harness(t)
	bin := counterBin(t)
	for _, sdk := range []string{"new", "old"} {
		for _, transport := range []string{"stdio", "http"} {
			t.Run(sdk+"/"+transport, func(t *testing.T) {
				effects := filepath.Join(t.TempDir(), "effects.jsonl")
				target := []string{"--stdio", bin + " --effects " + effects}
				if transport == "http" {
					url, _ := startHTTP(t, effects)
					target = []string{"--http", url}
				}
				base := append([]string{"--sdk", sdk}, target...)

				lines := callTS(t, append(base, "--tool", "send_message",
					"--args", `{"to":"ann@example.com","subject":"hi","sleep_ms":450}`,
					"--meta", `{"once.dev/run":"r1"}`, "--progress", "--repeat", "2")...)
				want := map[string]string{"new": "2026-07-28", "old": "2025-11-25"}[sdk]
				if len(lines) == 0 || lines[0].Connected == nil || lines[0].Connected.ProtocolVersion != want {
					t.Fatalf("first line = %+v, want connected at %s", lines, want)
				}
				results, progress := 0, 0
				for _, l := range lines[1:] {
					switch {
					case l.Progress != nil:
						progress++
					case l.OK && l.Result != nil && !l.Result.IsError:
						results++
					default:
						t.Errorf("line %+v", l)
					}
				}
				if results != 2 || progress == 0 {
					t.Errorf("%d results and %d progress lines, want 2 and some", results, progress)
				}
				wantCount(t, effects, "send_message", 2)
				es, err := counter.Effects(effects)
				if err != nil || len(es) == 0 || es[0].Meta["once.dev/run"] != "r1" {
					t.Errorf("effects %+v, %v: want the call's _meta recorded", es, err)
				}

				lines = callTS(t, append(base, "--tool", "charge",
					"--args", `{"customer":"c1","amount":5,"idempotency_key":"k1"}`, "--concurrent", "3")...)
				if n := len(lines); n != 4 {
					t.Errorf("charge printed %d lines, want 4", n)
				}
				wantCount(t, effects, "charge", 1)

				lines = callTS(t, append(base, "--tool", "fail_tool")...)
				if len(lines) != 2 || !lines[1].OK || !lines[1].Result.IsError {
					t.Errorf("fail_tool = %+v, want ok with isError", lines)
				}
			})
		}
	}
}

// TestHostKilledMidCall kills the TypeScript host while the counter
// waits in sleep_ms, and records what a server hears of it. Over stdio
// the handler's context ends (cause io.EOF) and nothing happens. Over
// HTTP it depends on the protocol: at 2026-07-28 the POST is the call,
// and with PropagateRequestCancellation its end cancels the handler; at
// 2025-11-25 the handler runs on and the effect happens with no one to
// tell. A gateway must expect both.
func TestHostKilledMidCall(t *testing.T) {
	harness(t)
	bin := counterBin(t)
	cases := []struct {
		sdk, transport string
		want           int
	}{
		{"new", "stdio", 0},
		{"old", "stdio", 0},
		{"new", "http", 0},
		{"old", "http", 1},
		{"new", "http-stateful", 1},
		{"old", "http-stateful", 1},
	}
	for _, c := range cases {
		t.Run(c.sdk+"/"+c.transport, func(t *testing.T) {
			effects := filepath.Join(t.TempDir(), "effects.jsonl")
			target := []string{"--stdio", bin + " --effects " + effects}
			switch c.transport {
			case "http":
				url, _ := startHTTP(t, effects)
				target = []string{"--http", url}
			case "http-stateful":
				url, _ := startHTTP(t, effects, "--stateful")
				target = []string{"--http", url}
			}
			cmd := exec.Command("node", append(append([]string{"call.mjs", "--sdk", c.sdk}, target...),
				"--tool", "send_message", "--args", `{"to":"a","subject":"s","sleep_ms":1000}`, "--progress")...)
			cmd.Dir = tsDir
			cmd.Stderr = os.Stderr
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Wait()
			// The first progress line says the counter is in sleep_ms.
			r := bufio.NewReader(stdout)
			for {
				s, err := r.ReadString('\n')
				if err != nil {
					t.Fatalf("no progress line: %v", err)
				}
				if strings.HasPrefix(s, `{"progress"`) {
					break
				}
			}
			cmd.Process.Kill()
			time.Sleep(1500 * time.Millisecond) // past sleep_ms
			wantCount(t, effects, "send_message", c.want)
		})
	}
}
