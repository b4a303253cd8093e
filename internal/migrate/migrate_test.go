package migrate

import (
	"strings"
	"testing"
	"testing/fstest"
)

var names = Names{Schema: "s", Prefix: "p_", Quote: func(s string) string { return `"` + s + `"` }}

func TestLoadRendersInOrder(t *testing.T) {
	fsys := fstest.MapFS{
		"m/002_more.sql":   {Data: []byte(`ALTER TABLE {{.Table "action"}} ADD x int;`)},
		"m/001_action.sql": {Data: []byte(`CREATE TABLE {{.Table "action"}} (k text); CREATE INDEX {{.Index "a"}} ON {{.Table "action"}} (k);`)},
		"m/README":         {Data: []byte("not a migration")},
	}
	ms, err := Load(fsys, "m", names)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 || ms[0].Version != 1 || ms[1].Name != "more" {
		t.Fatalf("loaded %+v", ms)
	}
	if !strings.Contains(ms[0].SQL, `CREATE TABLE "s"."p_action"`) || !strings.Contains(ms[0].SQL, `INDEX "p_a_idx"`) {
		t.Fatalf("rendered %q", ms[0].SQL)
	}
}

func TestLoadRefusesGaps(t *testing.T) {
	fsys := fstest.MapFS{
		"m/001_a.sql": {Data: []byte(`SELECT 1;`)},
		"m/003_c.sql": {Data: []byte(`SELECT 3;`)},
	}
	if _, err := Load(fsys, "m", names); err == nil || !strings.Contains(err.Error(), "version 2") {
		t.Fatalf("Load with a gap = %v", err)
	}
	bad := fstest.MapFS{"m/001_a.sql": {Data: []byte(`{{.Nope}}`)}}
	if _, err := Load(bad, "m", names); err == nil {
		t.Fatal("a template naming an unknown field was accepted")
	}
}

func TestStatements(t *testing.T) {
	got := Statements("-- comment\nCREATE TABLE a (\n  x int\n);\n\nCREATE INDEX b ON a (x);\nSELECT 1")
	if len(got) != 3 || !strings.HasPrefix(got[0], "CREATE TABLE a") || got[2] != "SELECT 1" {
		t.Fatalf("Statements = %q", got)
	}
}

func TestCheckIdent(t *testing.T) {
	for _, ok := range []string{"once_", "public", "_x9"} {
		if err := CheckIdent("f", ok, false); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "9a", `a"b`, "a b", "a;drop", strings.Repeat("a", 41)} {
		if err := CheckIdent("Config.Prefix", bad, false); err == nil || !strings.Contains(err.Error(), "Config.Prefix") {
			t.Errorf("%q accepted or unnamed: %v", bad, err)
		}
	}
	if err := CheckIdent("f", "", true); err != nil {
		t.Error(err)
	}
}
