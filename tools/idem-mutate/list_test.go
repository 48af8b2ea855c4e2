package main

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseList(t *testing.T) {
	t.Parallel()
	list := "# a comment\n\n" +
		"=== drop-line\npromise: p\nfile: a.go\ntest: ./x ./y\n--- find\n\tkeep()\n\tdrop()\n\n--- replace\n\tkeep()\n\n\n" +
		"=== remove\nfile: b.sql\ntest: ./z\n--- find\nWHERE a\n  AND b\n\n--- replace\n"
	ms, err := parseList(strings.NewReader(list))
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 {
		t.Fatalf("%d mutations, want 2", len(ms))
	}
	a, b := ms[0], ms[1]
	if a.name != "drop-line" || a.promise != "p" || a.file != "a.go" || strings.Join(a.pkgs, ",") != "./x,./y" {
		t.Fatalf("first: %+v", a)
	}
	if a.find != "\tkeep()\n\tdrop()\n" || a.replace != "\tkeep()" {
		t.Fatalf("first: find %q replace %q", a.find, a.replace)
	}
	got, err := a.apply("func f() {\n\tkeep()\n\tdrop()\n}\n")
	if err != nil || got != "func f() {\n\tkeep()}\n" {
		t.Fatalf("apply: %q, %v", got, err)
	}
	if b.find != "WHERE a\n  AND b\n" || b.replace != "" {
		t.Fatalf("second: find %q replace %q", b.find, b.replace)
	}
	if _, err := b.apply("WHERE a\n  AND b\nWHERE a\n  AND b\n"); err == nil {
		t.Fatal("a find text that occurs twice applied")
	}
	if _, err := b.apply("nothing here"); err == nil {
		t.Fatal("a find text that is not there applied")
	}
}

func TestParseListRefusesMistakes(t *testing.T) {
	t.Parallel()
	for name, list := range map[string]string{
		"no file":            "=== a\ntest: ./x\n--- find\nx\n--- replace\ny\n",
		"no test":            "=== a\nfile: f\n--- find\nx\n--- replace\ny\n",
		"no find":            "=== a\nfile: f\ntest: ./x\n",
		"no change":          "=== a\nfile: f\ntest: ./x\n--- find\nx\n--- replace\nx\n",
		"named twice":        "=== a\nfile: f\ntest: ./x\n--- find\nx\n--- replace\ny\n=== a\nfile: f\ntest: ./x\n--- find\nx\n--- replace\nz\n",
		"unknown key":        "=== a\nfiles: f\n",
		"stray text":         "text\n",
		"replace first":      "=== a\nfile: f\ntest: ./x\n--- replace\ny\n",
		"spaced name":        "=== a b\n",
		"comment in a block": "=== a\nfile: f\ntest: ./x\n--- find\nx\n--- replace\ny\n\n# the next ones\n",
	} {
		if _, err := parseList(strings.NewReader(list)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// The repository's own list parses; whether each mutation still applies is
// checked by idem-mutate -check, which reads the code.
func TestRepositoryListParses(t *testing.T) {
	t.Parallel()
	f, err := os.Open("../../scripts/mutations/mutations.txt")
	if errors.Is(err, os.ErrNotExist) {
		t.Skip("no mutation list")
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ms, err := parseList(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) == 0 {
		t.Fatal("empty list")
	}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	fail := errors.New("exit status 1")
	for _, c := range []struct {
		out    string
		err    error
		status string
		by     string
	}{
		{"ok  \tpkg\t1s\n", nil, "survived", ""},
		{"--- FAIL: TestA (0.1s)\n    --- FAIL: TestA/sub (0.1s)\n--- FAIL: TestB (0s)\nFAIL\npkg\n", fail, "caught", "TestA,TestB"},
		{"panic: test timed out after 5m0s\n\trunning tests:\n\t\tTestC (5m0s)\nFAIL\tpkg\t300s\n", fail, "hang", ""},
		{"# pkg\n./x.go:1: syntax error\nFAIL\tpkg [build failed]\n", fail, "invalid", ""},
	} {
		status, by := classify([]byte(c.out), c.err)
		if status != c.status || strings.Join(by, ",") != c.by {
			t.Errorf("classify(%q) = %s %v, want %s %s", c.out, status, by, c.status, c.by)
		}
	}
}

// A package of a nested module is tested from that module's folder; the
// flags go to every go test.
func TestSplitByModule(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "nested", "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "nested", "go.mod"), []byte("module x/nested\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	flags, modules, by := splitByModule(dir, []string{"-run", "TestA|TestB", "./idem", "./nested/...", "./integration_test", "./nested/sub", "./nested"})
	if !slices.Equal(flags, []string{"-run", "TestA|TestB"}) || !slices.Equal(modules, []string{".", "nested"}) ||
		!slices.Equal(by["."], []string{"./idem", "./integration_test"}) || !slices.Equal(by["nested"], []string{"./...", "./sub", "."}) {
		t.Fatalf("flags %v, modules %v, packages %v", flags, modules, by)
	}
}
