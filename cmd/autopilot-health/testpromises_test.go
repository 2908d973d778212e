package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// declaredTests is every Test, Benchmark and Fuzz function of the module's
// test files, by name, with the package directory ("./checks") it is in.
func declaredTests(t *testing.T) map[string][]string {
	t.Helper()
	decl := regexp.MustCompile(`(?m)^func ((?:Test|Benchmark|Fuzz)\w*)\(`)
	found := map[string][]string{}
	err := filepath.WalkDir("../..", func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == ".cache" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		pkg := "./" + filepath.ToSlash(filepath.Dir(strings.TrimPrefix(p, "../../")))
		for _, m := range decl.FindAllSubmatch(b, -1) {
			found[string(m[1])] = append(found[string(m[1])], pkg)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(found) < 500 {
		t.Fatalf("found %d test functions in the module; the walk is broken", len(found))
	}
	return found
}

// `make test-arm64` skips by name the tests qemu-user cannot run, each with
// its reason in the Makefile, and README says how many: a test that skips
// itself under qemu-user instead is a skip CI takes silently (the seccomp
// test was one), and a name in ARM64_SKIP that is no test's skips nothing.
func TestMakeTestArm64SkipsWhatREADMESays(t *testing.T) {
	mk, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	skip := regexp.MustCompile(`(?m)^ARM64_SKIP := \^\(([\w|]+)\)\$\$$`).FindSubmatch(mk)
	pkgs := regexp.MustCompile(`(?m)^ARM64_PKGS := (.+)$`).FindSubmatch(mk)
	if skip == nil || pkgs == nil {
		t.Fatal("the Makefile has no ARM64_SKIP := ^(A|B)$$ or ARM64_PKGS line")
	}
	names := strings.Split(string(skip[1]), "|")
	declared := declaredTests(t)
	for _, n := range names {
		in := false
		for _, p := range declared[n] {
			in = in || strings.Contains(" "+string(pkgs[1])+" ", " "+p+" ")
		}
		if !in {
			t.Errorf("ARM64_SKIP names %s, which is no test of %s (it is in %q)", n, pkgs[1], declared[n])
		}
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	words := []string{"", "one", "two", "three", "four", "five", "six"}
	if len(names) >= len(words) {
		t.Fatalf("ARM64_SKIP names %d tests", len(names))
	}
	flat := strings.Join(strings.Fields(string(readme)), " ")
	if want := words[len(names)] + " tests of this machine's kernel that qemu-user cannot run are skipped there by name"; !strings.Contains(flat, want) {
		t.Errorf("README does not say %q: ARM64_SKIP names %d tests (%s)", want, len(names), skip[1])
	}
	if want := strings.ToUpper(words[len(names)][:1]) + words[len(names)][1:] + " tests of this machine's kernel cannot run there"; !strings.Contains(strings.Join(strings.Fields(string(mk)), " "), want) {
		t.Errorf("the Makefile's comment above ARM64_SKIP does not say %q", want)
	}
}

// A test that cannot run on this machine skips through testenv.Skip, which
// fails it under CI=true (README, "Tests": "skip where it is missing, and
// fail instead under CI=true"; the tiers in tests/ are never skipped): a
// plain t.Skip is a skip that CI takes silently. The only plain skips are
// those of a helper test that another test runs in a process of its own
// (its reason says "run by ..."), and a benchmark's (b.Skip: make test runs
// no benchmark). Nor is testing.Short used: CI runs no -short.
func TestSkipsFailUnderCI(t *testing.T) {
	skip := regexp.MustCompile(`\b(?:t|tb|testing\.TB)\.(?:Skip|Skipf|SkipNow)\(([^\n]*)`)
	short := regexp.MustCompile(`\btesting\.Short\(\)`)
	n := 0
	err := filepath.WalkDir("../..", func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == ".cache" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		rel := filepath.ToSlash(strings.TrimPrefix(p, "../../"))
		if d.IsDir() || !strings.HasSuffix(p, ".go") || rel == "internal/testenv/testenv.go" {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		n++
		for i, line := range strings.Split(string(b), "\n") {
			if m := skip.FindStringSubmatch(line); m != nil && !strings.HasPrefix(m[1], `"run by `) {
				t.Errorf("%s:%d: %s: a skip that CI=true would take silently; use testenv.Skip", rel, i+1, strings.TrimSpace(line))
			}
			if short.MatchString(line) {
				t.Errorf("%s:%d: %s: CI runs no -short; a test that leaves a part out in a -short run has no run in make test that is not -short", rel, i+1, strings.TrimSpace(line))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 200 {
		t.Fatalf("read %d Go files; the walk is broken", n)
	}
}
