package once_test

import (
	"go/version"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
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

// Every module in the tree, and each workspace, has the root go.mod's go
// and toolchain lines, so that no module builds with a Go the others were
// not tested with; and each module is used by the workspace it sits in,
// or the workspace's patterns would pass over it without a word.
func TestModulesShareGoLinesAndAreUsed(t *testing.T) {
	root, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	want := goLines(root)
	var mods []string
	works := map[string][]string{} // a go.work's directory: the directories it uses
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
			return filepath.SkipDir
		}
		if d.IsDir() || (d.Name() != "go.mod" && d.Name() != "go.work") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if got := goLines(b); got != want {
			t.Errorf("%s has %s; the root go.mod has %s", path, got, want)
		}
		dir := filepath.Dir(path)
		if d.Name() == "go.mod" {
			mods = append(mods, dir)
			return nil
		}
		for _, m := range regexp.MustCompile(`(?m)^\s*(?:use\s+)?(\.\S*)$`).FindAllSubmatch(b, -1) {
			works[dir] = append(works[dir], filepath.Join(dir, string(m[1])))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(mods) < 2 || works["."] == nil {
		t.Fatalf("found modules %q and workspaces %v: expected the root's go.work over several", mods, works)
	}
	for _, m := range mods {
		work := m
		for works[work] == nil && work != "." {
			work = filepath.Dir(work)
		}
		if !slices.Contains(works[work], m) {
			t.Errorf("module %s is not in the use list of %s", m, filepath.Join(work, "go.work"))
		}
	}
}

// goLines is a go.mod's or go.work's go and toolchain lines.
func goLines(b []byte) string {
	line := func(name string) string {
		if m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindSubmatch(b); m != nil {
			return name + " " + string(m[1])
		}
		return "no " + name + " line"
	}
	return line("go") + ", " + line("toolchain")
}
