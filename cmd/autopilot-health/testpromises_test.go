package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/syself/autopilot-health/internal/testenv"
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
	// The tests that start another process skip under qemu-user where
	// make test-arm64 sets testenv's variable: a name that is not the one
	// testenv reads leaves them running, and hanging now and then.
	if !regexp.MustCompile(`(?m)^test-arm64:\n(?:\t.*\n)*?\t.*\b` + testenv.NoExecEnv + `=`).Match(mk) {
		t.Errorf("make test-arm64 does not set %s (testenv.NoExecEnv)", testenv.NoExecEnv)
	}
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
	words := []string{"", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen"}
	if len(names) >= len(words) {
		t.Fatalf("ARM64_SKIP names %d tests", len(names))
	}
	flat := strings.Join(strings.Fields(string(readme)), " ")
	if want := "the unit tests of `" + string(pkgs[1]) + "`"; !strings.Contains(flat, want) {
		t.Errorf("README does not say %q (ARM64_PKGS)", want)
	}
	if want := words[len(names)] + " tests of this machine's kernel that qemu-user cannot run are skipped there by name"; !strings.Contains(flat, want) {
		t.Errorf("README does not say %q: ARM64_SKIP names %d tests (%s)", want, len(names), skip[1])
	}
	flatMk := strings.Join(strings.Fields(string(mk)), " ")
	if want := strings.ToUpper(words[len(names)][:1]) + words[len(names)][1:] + " tests of this machine's kernel cannot run there"; !strings.Contains(flatMk, want) {
		t.Errorf("the Makefile's comment above ARM64_SKIP does not say %q", want)
	}
	// The reasons, "two need openat2, one a user namespace, ...", add up
	// to the count, in README and in the Makefile's comment: a test added
	// to ARM64_SKIP comes with its reason, not only a new number.
	for _, doc := range []struct{ name, text, from, to string }{
		{"README", flat, "tests of this machine's kernel that qemu-user cannot run are skipped there by name (", "), each with its reason in the Makefile"},
		{"the Makefile's comment", flatMk, "tests of this machine's kernel cannot run there:", " All " + words[len(names)] + " run natively"},
	} {
		_, rest, ok := strings.Cut(doc.text, doc.from)
		reasons, _, ok2 := strings.Cut(rest, doc.to)
		if !ok || !ok2 {
			t.Errorf("%s has no list of reasons between %q and %q", doc.name, doc.from, doc.to)
			continue
		}
		sum := 0
		for _, w := range regexp.MustCompile(`[a-z]+`).FindAllString(reasons, -1) {
			if i := slices.Index(words, w); i > 0 {
				sum += i
			}
		}
		if sum != len(names) {
			t.Errorf("%s's reasons count %d tests, ARM64_SKIP names %d (%s): %q", doc.name, sum, len(names), skip[1], reasons)
		}
	}
}

// A test that cannot run on this machine skips through testenv.Skip, which
// fails it under CI=true (README, "Tests": "skip where it is missing, and
// fail instead under CI=true"; the tiers in tests/ are never skipped): a
// plain t.Skip is a skip that CI takes silently. The only plain skips are
// those of a helper test that another test runs in a process of its own
// (its reason says "run by ..."), a benchmark's (b.Skip: make test runs
// no benchmark), and the upgrade test's where the checkout has no git
// history to build the previous release from ("needs the git history: ...":
// a shallow clone; README says so). Nor is testing.Short used: CI runs no -short.
func TestSkipsFailUnderCI(t *testing.T) {
	skip := regexp.MustCompile(`\b(?:t|tb|testing\.TB)\.(?:Skip|Skipf|SkipNow)\(([^\n]*)`)
	short := regexp.MustCompile(`\btesting\.Short\(\)`)
	runBy := regexp.MustCompile(`\.Skipf?\("run by ((?:Test|Benchmark)\w+)`)
	declared := declaredTests(t)
	// A test that returns where it is not root passes without what it
	// would have asserted, and CI=true takes that silently too.
	notRoot := regexp.MustCompile(`\bif os\.Gete?uid\(\) != 0 \{\n\s*return\n`)
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
		if strings.HasSuffix(p, "_test.go") {
			for _, loc := range notRoot.FindAllIndex(b, -1) {
				t.Errorf("%s:%d: a test that returns where it is not root: a pass CI=true would take silently; use testenv.Skip", rel, 1+strings.Count(string(b[:loc[0]]), "\n"))
			}
		}
		for i, line := range strings.Split(string(b), "\n") {
			if m := skip.FindStringSubmatch(line); m != nil && !strings.HasPrefix(m[1], `"run by `) && !strings.HasPrefix(m[1], `"needs the git history: `) {
				t.Errorf("%s:%d: %s: a skip that CI=true would take silently; use testenv.Skip", rel, i+1, strings.TrimSpace(line))
			}
			// "run by TestX": TestX is a test of the module, which runs
			// this one; a renamed TestX leaves a helper no test runs.
			if m := runBy.FindStringSubmatch(line); m != nil && len(declared[m[1]]) == 0 {
				t.Errorf("%s:%d: %s: skips as run by %s, which is no test of the module", rel, i+1, strings.TrimSpace(line), m[1])
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

// Every test, benchmark and fuzz target README names is one the module
// has (a name in a -run pattern, 'TestSoak', may be a prefix of some), a
// `go test ... -run '^TestX$' ... ./pkg` that README quotes runs TestX in
// one of the packages it names, each VMTEST_RUN=name a scenario of the VM
// tier, and each environment variable a test reads (SOAK_FLOOD, VMTEST_ECHO,
// ...) one that some test does read: a renamed test or variable leaves
// README's command running nothing, and go test says ok.
func TestREADMENamesTestsThatExist(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	declared := declaredTests(t)
	prefix := func(p string) bool {
		for n := range declared {
			if strings.HasPrefix(n, p) {
				return true
			}
		}
		return false
	}
	for _, m := range regexp.MustCompile(`(-run |-bench |-fuzz )?'?\^?\b((?:Test|Benchmark|Fuzz)[A-Z]\w*)`).FindAllStringSubmatch(readme, -1) {
		if _, ok := declared[m[2]]; ok || (m[1] != "" || strings.Contains(m[0], "'")) && prefix(m[2]) {
			continue
		}
		t.Errorf("README names %s (%q), which is no test, benchmark or fuzz target of the module", m[2], m[0])
	}
	// go test ... -run '^TestX$' ... ./a ./b: TestX is in ./a or ./b.
	for _, m := range regexp.MustCompile("go test [^`]*?-run '\\^(Test\\w+)\\$'[^`]*?((?: \\./[\\w/.]+)+)`").FindAllStringSubmatch(readme, -1) {
		in := false
		for _, pkg := range strings.Fields(m[2]) {
			in = in || slices.Contains(declared[m[1]], strings.TrimSuffix(pkg, "/..."))
		}
		if !in {
			t.Errorf("README runs %s in %s; it is in %q", m[1], strings.TrimSpace(m[2]), declared[m[1]])
		}
	}
	table, err := os.ReadFile("../../tests/vm/scenarios/table.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`VMTEST_RUN=([\w,]+)`).FindAllStringSubmatch(readme, -1) {
		for _, s := range strings.Split(m[1], ",") {
			if !strings.Contains(string(table), `{Name: "`+s+`"`) {
				t.Errorf("README runs VMTEST_RUN=%s: no VM scenario has that name", s)
			}
		}
	}
	// The variables that README sets for a test (SOAK_*, VMTEST_*, IDLE_*,
	// KMSG_*): some Go file of the module reads each.
	read := map[string]bool{}
	err = filepath.WalkDir("../..", func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == ".cache") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range regexp.MustCompile(`"([A-Z][A-Z0-9]*_[A-Z0-9_]+)"`).FindAllSubmatch(b, -1) {
			read[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	vars := 0
	for _, m := range regexp.MustCompile(`\b((?:SOAK|VMTEST|IDLE|KMSG)_[A-Z0-9_]+)=`).FindAllStringSubmatch(readme, -1) {
		vars++
		if !read[m[1]] {
			t.Errorf("README sets %s for a test; no Go file of the module reads it", m[1])
		}
	}
	// And each AUTOPILOT_HEALTH_ variable README names (the tests'
	// AUTOPILOT_HEALTH_TEST_NO_EXEC, the daemon's own).
	for _, m := range regexp.MustCompile("`(AUTOPILOT_HEALTH_[A-Z0-9_]+)[`=]").FindAllStringSubmatch(readme, -1) {
		vars++
		if !read[m[1]] {
			t.Errorf("README names %s; no Go file of the module reads it", m[1])
		}
	}
	if vars < 7 {
		t.Errorf("found %d test variables in README (SOAK_FLOOD, SOAK_RESTARTS, SOAK_APIDOWN, SOAK_HOURS, VMTEST_RUN, VMTEST_ECHO at least): the pattern is broken", vars)
	}
}

// The API server binaries in tests/.cache are rebuilt when tests/tools/k8s
// changes (README, "Tests"): build.sh itself included, which holds the
// version baked into kube-apiserver; its stamp left it out, so a new
// version there kept the old binaries. Run on a copy of the folder with a
// `go` of the test's that only says it was called.
func TestK8sBinariesRebuiltWhenBuildScriptChanges(t *testing.T) {
	src := "../../tests/tools/k8s"
	dir := t.TempDir()
	for _, f := range []string{"build.sh", "go.mod", "go.sum", "cmd/etcd/main.go"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		os.MkdirAll(filepath.Dir(filepath.Join(dir, f)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	out, bin := filepath.Join(dir, "out"), filepath.Join(dir, "fakebin")
	os.MkdirAll(out, 0o755)
	os.MkdirAll(bin, 0o755)
	calls := filepath.Join(dir, "go-calls")
	os.WriteFile(filepath.Join(bin, "go"), fmt.Appendf(nil, "#!/bin/sh\necho built >> %q\n", calls), 0o755)
	for _, f := range []string{"kube-apiserver", "etcd"} {
		os.WriteFile(filepath.Join(out, f), []byte("#!/bin/sh\n"), 0o755)
	}
	build := func() int {
		t.Helper()
		cmd := exec.Command("bash", filepath.Join(dir, "build.sh"), out)
		cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"))
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build.sh: %v\n%s", err, b)
		}
		b, _ := os.ReadFile(calls)
		return strings.Count(string(b), "built")
	}
	if n := build(); n != 1 {
		t.Fatalf("first build: go called %d times, want 1", n)
	}
	if n := build(); n != 1 {
		t.Fatalf("nothing changed: go called again (%d in all)", n)
	}
	script, _ := os.ReadFile(filepath.Join(dir, "build.sh"))
	os.WriteFile(filepath.Join(dir, "build.sh"), append(script, []byte("\n# the version baked in changed\n")...), 0o755)
	if n := build(); n != 2 {
		t.Errorf("build.sh changed: go called %d times in all, want 2 (the binaries rebuilt)", n)
	}
}

// numberWord is n in words as README writes counts: "twenty-eight".
func numberWord(n int) string {
	ones := []string{"zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"}
	tens := []string{"", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"}
	switch {
	case n < 20:
		return ones[n]
	case n%10 == 0:
		return tens[n/10]
	default:
		return tens[n/10] + "-" + ones[n%10]
	}
}

// README says how many tests of tests/ run side by side
// (harness.Parallel): "twenty-eight long ones that mostly wait". Each
// test that calls harness.Parallel is one; a test made Parallel, or
// serial again, changes the count (it stood at twenty-two while six more
// were made Parallel).
func TestREADMECountsTheParallelTests(t *testing.T) {
	call := regexp.MustCompile(`(?m)^\s+harness\.Parallel\(t\b`)
	fn := regexp.MustCompile(`(?m)^func (Test\w+)\(`)
	var parallel []string
	err := filepath.WalkDir("../../tests", func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".cache" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, loc := range call.FindAllIndex(b, -1) {
			// The test whose body holds the call: the last func before it.
			fns := fn.FindAllSubmatch(b[:loc[0]], -1)
			if len(fns) == 0 {
				return fmt.Errorf("%s: harness.Parallel outside a test", p)
			}
			parallel = append(parallel, string(fns[len(fns)-1][1]))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(parallel)
	if len(parallel) < 10 || len(parallel) != len(slices.Compact(slices.Clone(parallel))) {
		t.Fatalf("found %d calls of harness.Parallel in tests/ (%v): the walk is broken, or a test calls it twice", len(parallel), parallel)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	flat := strings.Join(strings.Fields(string(readme)), " ")
	if want := "Most tiers run one after another; " + numberWord(len(parallel)) + " long ones that mostly wait (`tests/harness/parallel.go`"; !strings.Contains(flat, want) {
		t.Errorf("README does not say %q: %d tests call harness.Parallel (%s)", want, len(parallel), strings.Join(parallel, ", "))
	}
	// "at most 3 at once (-parallel defaults to 3 in tests/ unless given;
	// as many namespaced systemds at most)": harness.MaxNamespaces, which
	// tests/kube_test.go sets -test.parallel to.
	h, err := os.ReadFile("../../tests/harness/parallel.go")
	if err != nil {
		t.Fatal(err)
	}
	maxNS := regexp.MustCompile(`(?m)^const MaxNamespaces = (\d+)$`).FindSubmatch(h)
	if maxNS == nil {
		t.Fatal("tests/harness/parallel.go has no const MaxNamespaces = N")
	}
	if want := fmt.Sprintf("at most %s at once (`-parallel` defaults to %s in `tests/` unless given", maxNS[1], maxNS[1]); !strings.Contains(flat, want) {
		t.Errorf("README does not say %q (harness.MaxNamespaces)", want)
	}
}

// Every `make TARGET` README names ("`make soak`", "$ make run") is a
// target of the Makefile, and .PHONY: a renamed target leaves README's
// command failing with "No rule to make target".
func TestREADMEMakeTargetsExist(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	mk, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	phony := regexp.MustCompile(`(?m)^\.PHONY:(.*)$`).FindSubmatch(mk)
	if phony == nil {
		t.Fatal("the Makefile has no .PHONY line")
	}
	named := map[string]bool{}
	for _, m := range regexp.MustCompile("(?:`|\\$ )make ([a-z][a-z0-9-]*)").FindAllSubmatch(readme, -1) {
		named[string(m[1])] = true
	}
	if len(named) < 10 {
		t.Fatalf("README names %d make targets: the pattern is broken", len(named))
	}
	for target := range named {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(target) + `:`).Match(mk) {
			t.Errorf("README runs `make %s`: the Makefile has no such target", target)
		}
		if !slices.Contains(strings.Fields(string(phony[1])), target) {
			t.Errorf("README runs `make %s`: not in .PHONY (a file of that name would make it do nothing)", target)
		}
	}
}

// .ci/run installs on a fresh Debian machine what the tests need: each
// package a test's message names where its tool is missing ("(apt install
// squashfs-tools systemd-container)", "(Debian package gcc)") is one it
// installs, or one Debian always has, or one a package it installs pulls
// in; and README's "Tests" names each package .ci/run installs, so that a
// developer's machine can be made ready from README alone.
func TestCIRunInstallsWhatTheTestsName(t *testing.T) {
	ci, err := os.ReadFile("../../.ci/run")
	if err != nil {
		t.Fatal(err)
	}
	installed := map[string]bool{}
	for _, m := range regexp.MustCompile(`need\+?=\(([^)]*)\)`).FindAllSubmatch(ci, -1) {
		for _, p := range strings.Fields(string(m[1])) {
			if p != "apt-lists" { // a marker: apt-get update only
				installed[p] = true
			}
		}
	}
	for _, m := range regexp.MustCompile(`apt-get download -qq ([a-z0-9][a-z0-9.+-]*)`).FindAllSubmatch(ci, -1) {
		installed[string(m[1])] = true
	}
	if len(installed) < 15 {
		t.Fatalf(".ci/run installs %d packages (%v): the pattern is broken", len(installed), installed)
	}
	// It runs make build, make test, ...: Debian's make is optional, not
	// on a fresh machine.
	if regexp.MustCompile(`(?m)^(?:time )?make `).Match(ci) && !installed["make"] {
		t.Errorf(".ci/run runs make but does not install it where it is missing")
	}
	// Priority: required (on every Debian machine), or pulled in by a
	// package .ci/run installs.
	always := map[string]string{"apt": "required", "coreutils": "required", "mount": "required", "libc-bin": "required", "dmsetup": "a dependency of lvm2"}
	hint := regexp.MustCompile(`\((?:apt install|Debian packages?) ([a-z0-9][a-z0-9.+, -]*)\)`)
	named := 0
	err = filepath.WalkDir("../..", func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == ".cache" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		rel := filepath.ToSlash(strings.TrimPrefix(p, "../../"))
		if d.IsDir() || !strings.HasSuffix(p, ".go") || rel == "internal/testenv/testenv_test.go" { // its "apt install frob" is testenv.Skip's own test
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range hint.FindAllSubmatch(b, -1) {
			for _, pkg := range strings.FieldsFunc(string(m[1]), func(r rune) bool { return r == ' ' || r == ',' }) {
				named++
				if !installed[pkg] && always[pkg] == "" {
					t.Errorf("%s: %q names the package %s, which .ci/run does not install", rel, m[0], pkg)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if named < 20 {
		t.Fatalf("found %d packages named in the tests' messages: the pattern is broken", named)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, tests, _ := strings.Cut(string(readme), "\n## The two commands\n")
	tests, _, _ = strings.Cut(tests, "\n### Soak")
	for pkg := range installed {
		if !strings.Contains(tests, "`"+pkg+"`") {
			t.Errorf(".ci/run installs %s; README's \"The two commands\" and \"Tests\" do not name it (`%s`)", pkg, pkg)
		}
	}
}

// Each make target that runs the integration tiers gives go test a
// -timeout of 30 minutes at least: tests/ alone took 820.8 s side by side
// in CI and 1308.6 s on the 2-core machine (README, "Tests"), and go
// test's default, 10 minutes, panics the whole package midway. make
// test-race had none.
func TestMakeIntegrationRunsHaveTheirTimeout(t *testing.T) {
	mk, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	runs := regexp.MustCompile(`(?m)^\t.*\$\(GO\) test \$\(INTEGRATION\)(.*)$`).FindAllSubmatch(mk, -1)
	if len(runs) < 4 {
		t.Fatalf("found %d integration runs of go test in the Makefile: the pattern is broken", len(runs))
	}
	for _, r := range runs {
		m := regexp.MustCompile(`-timeout (\d+)m\b`).FindSubmatch(r[1])
		if m == nil {
			t.Errorf("the Makefile runs go test $(INTEGRATION)%s without -timeout: go test's 10 minutes end tests/ midway", r[1])
			continue
		}
		if n, _ := strconv.Atoi(string(m[1])); n < 30 {
			t.Errorf("the Makefile runs go test $(INTEGRATION)%s: -timeout %sm, under 30m", r[1], m[1])
		}
	}
}

// README's "Soak and endurance": make soak runs the TestSoak tests of
// ./tests and ./internal/daemon, as many as it says, each named in its
// table, whose short form (the test's default) and `make soak` size are
// the test's default and the Makefile's value of each SOAK_ variable.
func TestREADMESoakTableIsWhatRuns(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	mk, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	_, soak, _ := strings.Cut(string(readme), "\n### Soak and endurance\n")
	soak, _, _ = strings.Cut(soak, "\n## ")
	if !strings.Contains(string(mk), "-run '^TestSoak' -v ./tests ./internal/daemon") {
		t.Fatal("make soak no longer runs -run '^TestSoak' in ./tests ./internal/daemon: change this test with it")
	}
	var src []byte
	var scenarios []string
	for _, f := range []string{"../../tests/soak_test.go", "../../internal/daemon/soak_test.go"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src = append(src, b...)
	}
	for _, pkg := range []string{"../../tests", "../../internal/daemon"} {
		files, _ := filepath.Glob(pkg + "/*_test.go")
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range regexp.MustCompile(`(?m)^func (TestSoak\w*)\(`).FindAllSubmatch(b, -1) {
				scenarios = append(scenarios, string(m[1]))
			}
		}
	}
	flat := strings.Join(strings.Fields(soak), " ")
	if want := "`make soak` runs " + numberWord(len(scenarios)) + " endurance scenarios"; !strings.Contains(flat, want) {
		t.Errorf("README does not say %q: %s", want, strings.Join(scenarios, ", "))
	}
	for _, s := range scenarios {
		if !strings.Contains(soak, "(`"+s+"`") {
			t.Errorf("%s runs in make soak; README's table does not name it", s)
		}
	}
	// The code's defaults: soakInt(t, "SOAK_RESTARTS", 10),
	// soakDuration(t, "SOAK_APIDOWN", 30*time.Second), and SOAK_HOURS's
	// `return 3` where the variable is unset.
	defaults := map[string]string{}
	for _, m := range regexp.MustCompile(`soak(?:Int|Duration)\(t, "(SOAK_\w+)", (\d+)(\*time\.(Second|Minute))?\)`).FindAllSubmatch(src, -1) {
		defaults[string(m[1])] = string(m[2]) + map[string]string{"Second": "s", "Minute": "m", "": ""}[string(m[4])]
	}
	if m := regexp.MustCompile(`os\.Getenv\("(SOAK_HOURS)"\)\s+if v == "" \{\s+return (\d+)`).FindSubmatch(src); m != nil {
		defaults[string(m[1])] = string(m[2])
	}
	rows := regexp.MustCompile("\\| `(SOAK_\\w+)=(\\w+)` \\| `(\\w+)` \\|").FindAllStringSubmatch(soak, -1)
	if len(rows) != len(scenarios) || len(defaults) != len(scenarios) {
		t.Fatalf("README's soak table has %d rows with a size, the tests read %d SOAK_ variables with a default (%v), %d scenarios run", len(rows), len(defaults), defaults, len(scenarios))
	}
	for _, r := range rows {
		if defaults[r[1]] != r[2] {
			t.Errorf("README's short form is %s=%s; the test's default is %q", r[1], r[2], defaults[r[1]])
		}
		m := regexp.MustCompile(`(?m)^` + r[1] + ` +\?= (\S+)$`).FindStringSubmatch(string(mk))
		if m == nil || m[1] != r[3] {
			t.Errorf("README's make soak sets %s=%s; the Makefile: %q", r[1], r[3], m)
		}
		if !strings.Contains(string(mk), r[1]+"=$("+r[1]+")") {
			t.Errorf("make soak does not pass %s to go test", r[1])
		}
	}
}
