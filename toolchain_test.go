package once_test

import (
	"go/version"
	"os"
	"regexp"
	"testing"
)

// patchedGo is the first toolchain the project builds with: Go 1.26.8's
// standard library has vulnerabilities in net/http, html/template and
// crypto that the console reaches, fixed in later patch releases.
const patchedGo = "go1.26.11"

// go.mod names a patched toolchain, at least patchedGo, so that Go's
// default GOTOOLCHAIN=auto builds with it and CI tests with it, while
// its go line stays low enough for the Go a machine has.
func TestGoModNamesPatchedToolchain(t *testing.T) {
	mod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^toolchain (go\S+)$`).FindSubmatch(mod)
	if m == nil {
		t.Fatalf("go.mod names no toolchain; name %s or later", patchedGo)
	}
	if tc := string(m[1]); version.Compare(tc, patchedGo) < 0 {
		t.Fatalf("go.mod's toolchain is %s; it must be %s or later", tc, patchedGo)
	}
	goLine := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(mod)
	if goLine == nil || version.Compare("go"+string(goLine[1]), string(m[1])) > 0 {
		t.Fatalf("go.mod's go line %q is above its toolchain", goLine)
	}
}
