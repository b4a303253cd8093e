package cli_test

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/oncehq/once/lab/cli"
)

// keySpecVector is one test vector of KEYS.md, as the repository's
// testdata/keys/vectors.json holds it.
type keySpecVector struct {
	Name   string `json:"name"`
	Intent struct {
		Run     string `json:"run"`
		Step    int64  `json:"step"`
		Kind    string `json:"kind"`
		Target  string `json:"target"`
		Payload *struct {
			JSON   *string `json:"json"`
			RawHex *string `json:"raw_hex"`
		} `json:"payload"`
		PayloadInKey bool `json:"payload_in_key"`
	} `json:"intent"`
	Fingerprint string `json:"fingerprint"`
	Key         string `json:"key"`
}

// TestKeyReproducesSpecVectors: `once key` gives every key and fingerprint
// of KEYS.md, so a program in another language can check its own against
// the command as well as against the document. JSON payloads go in as a
// file, raw ones as a file with --raw.
func TestKeyReproducesSpecVectors(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "testdata", "keys", "vectors.json"))
	if err != nil {
		t.Fatal(err)
	}
	var f struct{ Vectors []keySpecVector }
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Vectors) < 10 {
		t.Fatalf("%d vectors; the file is cut short", len(f.Vectors))
	}
	dir := t.TempDir()
	for i, v := range f.Vectors {
		t.Run(v.Name, func(t *testing.T) {
			in := v.Intent
			args := []string{"key", "--json", "--run", in.Run, "--step", strconv.FormatInt(in.Step, 10), "--kind", in.Kind, "--target", in.Target}
			if in.PayloadInKey {
				args = append(args, "--payload-in-key")
			}
			if p := in.Payload; p != nil {
				file := filepath.Join(dir, strconv.Itoa(i))
				var data []byte
				switch {
				case p.JSON != nil:
					data = []byte(*p.JSON)
				case p.RawHex != nil:
					if data, err = hex.DecodeString(*p.RawHex); err != nil {
						t.Fatal(err)
					}
					args = append(args, "--raw")
				default:
					t.Fatal("a payload with neither json nor raw_hex")
				}
				if err := os.WriteFile(file, data, 0o644); err != nil {
					t.Fatal(err)
				}
				args = append(args, "--payload-file", file)
			}
			var out, errOut bytes.Buffer
			if code := cli.Main(args, &out, &errOut); code != 0 {
				t.Fatalf("once %s: exit %d: %s", strings.Join(args, " "), code, errOut.String())
			}
			var got struct{ Key, Fingerprint string }
			if err := json.Unmarshal(out.Bytes(), &got); err != nil {
				t.Fatalf("once key --json printed %q: %v", out.String(), err)
			}
			if got.Key != v.Key || got.Fingerprint != v.Fingerprint {
				t.Fatalf("once key = %s / %s, want %s / %s", got.Key, got.Fingerprint, v.Key, v.Fingerprint)
			}
		})
	}
}

// TestKeyRefusesLossyPayload: a payload file that canonical JSON could not
// keep apart from another is one clear error, not a key.
func TestKeyRefusesLossyPayload(t *testing.T) {
	dir := t.TempDir()
	for name, c := range map[string]struct{ payload, says string }{
		"invalid UTF-8":       {"{\"a\":\"caf\xe9\"}", "not valid UTF-8"},
		"duplicate keys":      {`{"a":1,"a":2}`, "Duplicate key"},
		"a number it changes": {`{"id":12345678901234567891}`, "would change to 12345678901234567000"},
	} {
		t.Run(name, func(t *testing.T) {
			file := filepath.Join(dir, strings.ReplaceAll(name, " ", "-"))
			if err := os.WriteFile(file, []byte(c.payload), 0o644); err != nil {
				t.Fatal(err)
			}
			var out, errOut bytes.Buffer
			code := cli.Main([]string{"key", "--run", "r", "--kind", "k", "--payload-file", file}, &out, &errOut)
			if code == 0 || out.Len() != 0 || !strings.Contains(errOut.String(), c.says) {
				t.Fatalf("exit %d, printed %q, said %q; want a refusal saying %q", code, out.String(), errOut.String(), c.says)
			}
		})
	}
}
