package checks

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/syself/autopilot-health/internal/config"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

// cdiReference is the CDI project's own reading of spec directories, file
// by file (cdi.ReadSpec: the YAML/JSON decoding with unknown fields refused,
// the version, the kind's vendor and class, the device names and the edits
// validated), put together by the rules of the project's cache
// (pkg/cdi/spec-dirs.go scanSpecDirs, cache.go refresh): the files of each
// directory that are not directories and end in .json or .yaml are specs; a
// later directory has the higher priority, and its device replaces one of
// the same qualified name; two of the same priority are a conflict, named
// for both specs, and the name is dropped, whichever came after.
type cdiReference struct {
	byName  map[string]string // a device name of the kind: its spec's host path
	refused map[string]bool   // the host paths of specs refused, or in a conflict
	specs   map[string]bool   // the host paths of the files read as specs
	// panics are the host paths of the specs cdi.ReadSpec panics on, in
	// the order the cache reads them: the check refuses the first.
	panics []string
}

// readSpecRecovered is cdi.ReadSpec, its panic an error.
func readSpecRecovered(path string, prio int) (spec *cdi.Spec, panicked bool, err error) {
	defer func() {
		if p := recover(); p != nil {
			spec, panicked, err = nil, true, fmt.Errorf("panic: %v", p)
		}
	}()
	spec, err = cdi.ReadSpec(path, prio)
	return spec, false, err
}

func readCDIReference(t *testing.T, root string, dirs []string, kind string) cdiReference {
	t.Helper()
	type dev struct {
		path string
		prio int
	}
	ref := cdiReference{byName: map[string]string{}, refused: map[string]bool{}, specs: map[string]bool{}}
	devices := map[string]dev{}
	conflicts := map[string]bool{}
	for prio, d := range dirs {
		ents, err := os.ReadDir(filepath.Join(root, d))
		if err != nil {
			continue
		}
		for _, e := range ents {
			if ext := filepath.Ext(e.Name()); e.IsDir() || (ext != ".json" && ext != ".yaml") {
				continue
			}
			host := filepath.Join(d, e.Name())
			ref.specs[host] = true
			spec, panicked, err := readSpecRecovered(filepath.Join(root, host), prio)
			if panicked {
				ref.panics = append(ref.panics, host)
			}
			if err != nil {
				ref.refused[host] = true
				continue
			}
			for _, dv := range spec.Devices {
				q := spec.Kind + "=" + dv.Name
				if old, ok := devices[q]; ok {
					if prio == old.prio {
						ref.refused[host], ref.refused[old.path] = true, true
						conflicts[q] = true
					}
					if prio <= old.prio {
						continue
					}
				}
				devices[q] = dev{host, prio}
			}
		}
	}
	for q, d := range devices {
		if name, ok := strings.CutPrefix(q, kind+"="); ok && !conflicts[q] {
			ref.byName[name] = d.path
		}
	}
	return ref
}

// mentions reports whether an error message of loadCDI names the host path
// p, as it is or quoted.
func mentions(msg, p string) bool {
	return strings.Contains(msg, strconv.Quote(p)) || strings.HasPrefix(msg, p+": ")
}

// cdiFileName makes a fuzzed string a file name: no '/', no NUL, not
// empty, "." or "..".
func cdiFileName(s string) string {
	s = strings.NewReplacer("/", "_", "\x00", "_").Replace(s)
	if s == "" || s == "." || s == ".." {
		s = "x.yaml"
	}
	return s
}

// The GPU activation check's reading of the CDI spec directories (under a
// host root) against the CDI project's own reading: three spec files, two
// in /etc/cdi and one in /var/run/cdi (the higher priority), of fuzzed names
// and contents. Which files are specs, the device names of the kind and
// the spec each comes from, and which specs are refused, must agree.
func FuzzCDISpecReference(f *testing.F) {
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join("testdata/cdi", name))
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	one, four, uuid, torn := read("nvidia-1-gpu.json"), read("nvidia-4-gpus.yaml"), read("nvidia-4-gpus-uuid.yaml"), read("nvidia-torn.yaml")
	f.Add(one, "nvidia.json", four, "nvidia.yaml", uuid, "nvidia.yaml")
	f.Add(four, "a.yaml", four, "b.yaml", torn, "c.yaml")
	f.Add(one, "nvidia.yml", []byte(`{"cdiVersion":"0.5.0","kind":"other.com/dev","devices":[{"name":"0","containerEdits":{}}]}`), "other.json",
		[]byte(`{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[{"name":"0","containerEdits":{"env":["A=1"]}}]}`), "z.json")
	f.Fuzz(func(t *testing.T, spec1 []byte, name1 string, spec2 []byte, name2 string, spec3 []byte, name3 string) {
		root := t.TempDir()
		dirs := []string{"/etc/cdi", "/var/run/cdi"}
		for _, d := range dirs {
			if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		name1, name2, name3 = cdiFileName(name1), cdiFileName(name2), cdiFileName(name3)
		if name2 == name1 {
			name2 += ".yaml"
		}
		for _, w := range []struct {
			dir, name string
			b         []byte
		}{{dirs[0], name1, spec1}, {dirs[0], name2, spec2}, {dirs[1], name3, spec3}} {
			if err := os.WriteFile(filepath.Join(root, w.dir, w.name), w.b, 0o644); err != nil {
				return // a name too long for the file system: nothing to compare
			}
		}
		const kind = "nvidia.com/gpu"
		c := &gpuActivationCheck{env: &Env{Config: &config.Config{HostRoot: root}}, dirs: dirs, kind: kind}
		got, err := c.loadCDI()
		ref := readCDIReference(t, root, dirs, kind)
		if len(ref.panics) > 0 {
			// The CDI loader panics on a spec: the check refuses it,
			// naming it, as it refuses a FIFO.
			if err == nil || !strings.HasPrefix(err.Error(), "CDI spec "+ref.panics[0]+": ") {
				t.Fatalf("the CDI loader panics on %q; loadCDI: %v", ref.panics, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("loadCDI: %v", err)
		}
		for name, p := range ref.byName {
			if got.byName[name] != p {
				t.Errorf("device %q: the CDI loader has it from %q, the check from %q", name, p, got.byName[name])
			}
		}
		for name, p := range got.byName {
			if _, ok := ref.byName[name]; !ok {
				t.Errorf("device %q from %q: the CDI loader has no such device", name, p)
			}
		}
		for p := range ref.refused {
			if !slicesAny(got.errs, func(e string) bool { return mentions(e, p) }) {
				t.Errorf("the CDI loader refuses %q; the check's errors do not name it: %q", p, got.errs)
			}
		}
		for _, e := range got.errs {
			if !anyKey(ref.refused, func(p string) bool { return mentions(e, p) }) {
				t.Errorf("the check's error %q names no spec the CDI loader refuses (%v; specs %v)", e, ref.refused, ref.specs)
			}
		}
	})
}

func slicesAny(s []string, f func(string) bool) bool {
	for _, v := range s {
		if f(v) {
			return true
		}
	}
	return false
}

func anyKey(m map[string]bool, f func(string) bool) bool {
	for k := range m {
		if f(k) {
			return true
		}
	}
	return false
}
