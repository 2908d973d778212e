package vmhost

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// CPIO writes a cpio archive in the "newc" format the kernel unpacks as an
// initramfs (Documentation/driver-api/early-userspace/buffer-format.rst):
// a 110-byte ASCII header, the NUL-terminated name, the data, each padded
// to 4 bytes. Parent directories are created as needed; a path is written
// once (the first entry wins).
type CPIO struct {
	w    io.Writer
	ino  uint32
	seen map[string]bool
	err  error
}

// NewCPIO starts an archive on w; Close writes the trailer.
func NewCPIO(w io.Writer) *CPIO { return &CPIO{w: w, seen: map[string]bool{}} }

const (
	modeDir     = 0o040000
	modeFile    = 0o100000
	modeSymlink = 0o120000
	modeChar    = 0o020000
)

func (c *CPIO) entry(name string, mode uint32, data []byte, rmajor, rminor uint32) error {
	if c.err != nil {
		return c.err
	}
	name = strings.TrimPrefix(path.Clean("/"+name), "/")
	if name == "" || c.seen[name] {
		return nil
	}
	c.seen[name] = true
	c.ino++
	nlink := 1
	if mode&0o170000 == modeDir {
		nlink = 2
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rmajor, rminor, len(name)+1, 0)
	b.WriteString(name)
	b.WriteByte(0)
	pad(&b)
	b.Write(data)
	pad(&b)
	_, c.err = c.w.Write(b.Bytes())
	return c.err
}

func pad(b *bytes.Buffer) {
	for b.Len()%4 != 0 {
		b.WriteByte(0)
	}
}

// Dir adds a directory and its parents.
func (c *CPIO) Dir(name string) error {
	name = path.Clean("/" + name)
	if name == "/" {
		return nil
	}
	if err := c.Dir(path.Dir(name)); err != nil {
		return err
	}
	return c.entry(name, modeDir|0o755, nil, 0, 0)
}

// File adds a regular file.
func (c *CPIO) File(name string, data []byte, perm uint32) error {
	if err := c.Dir(path.Dir(path.Clean("/" + name))); err != nil {
		return err
	}
	return c.entry(name, modeFile|perm&0o7777, data, 0, 0)
}

// Symlink adds a symbolic link.
func (c *CPIO) Symlink(name, target string) error {
	if err := c.Dir(path.Dir(path.Clean("/" + name))); err != nil {
		return err
	}
	return c.entry(name, modeSymlink|0o777, []byte(target), 0, 0)
}

// CharDev adds a character device node.
func (c *CPIO) CharDev(name string, major, minor uint32) error {
	if err := c.Dir(path.Dir(path.Clean("/" + name))); err != nil {
		return err
	}
	return c.entry(name, modeChar|0o600, nil, major, minor)
}

// Close writes the trailer.
func (c *CPIO) Close() error {
	if c.err != nil {
		return c.err
	}
	delete(c.seen, "TRAILER!!!")
	return c.entry("TRAILER!!!", 0, nil, 0, 0)
}

// Module is one kernel module file in load order.
type Module struct {
	Name string // as modules.dep names it, "-" spelled "_"
	Path string // relative to lib/modules/<version>
	Deps []string
}

// ModName is a module's name as the kernel spells it ("dm-mod" is dm_mod).
func ModName(s string) string {
	s = strings.TrimSuffix(path.Base(s), ".xz")
	s = strings.TrimSuffix(s, ".zst")
	s = strings.TrimSuffix(s, ".ko")
	return strings.ReplaceAll(s, "-", "_")
}

// ResolveModules reads modules.dep (depmod's "path: dep dep ...") and
// returns the named modules and everything they depend on, each after its
// dependencies. A name that modules.dep lacks (built in, or misspelt) is an
// error.
func ResolveModules(modulesDep io.Reader, names []string) ([]Module, error) {
	deps := map[string][]string{}
	byName := map[string]string{}
	sc := bufio.NewScanner(modulesDep)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			return nil, fmt.Errorf("modules.dep line %d: no colon: %q", n, line)
		}
		deps[k] = strings.Fields(v)
		byName[ModName(k)] = k
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	var out []Module
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(p string) error
	visit = func(p string) error {
		switch state[p] {
		case 1:
			return fmt.Errorf("modules.dep: dependency cycle at %s", p)
		case 2:
			return nil
		}
		state[p] = 1
		m := Module{Name: ModName(p), Path: p}
		for _, d := range deps[p] {
			if _, ok := deps[d]; !ok {
				return fmt.Errorf("modules.dep: %s depends on %s, which has no line", p, d)
			}
			if err := visit(d); err != nil {
				return err
			}
			m.Deps = append(m.Deps, ModName(d))
		}
		state[p] = 2
		out = append(out, m)
		return nil
	}
	for _, n := range names {
		p, ok := byName[ModName(n)]
		if !ok {
			return nil, fmt.Errorf("module %s is not in modules.dep (built into the kernel, or misspelt?)", n)
		}
		if err := visit(p); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Spec says what goes into the initramfs.
type Spec struct {
	Kernel *Kernel
	// Init is a static binary, the guest's /init.
	Init string
	// Files are put at their guest path (key) from a host file (value),
	// e.g. the daemon's binary at /usr/bin/autopilot-health.
	Files map[string]string
	// Modules are packed with their dependencies and listed, in load
	// order, in /etc/vmtest/modules ("name path dep,dep"); the guest loads
	// them.
	Modules []string
	// Tools are host programs copied to /usr/sbin with the shared
	// libraries ldd names for them.
	Tools []string
	// Busybox is a static busybox, installed as /bin/busybox with the
	// applets in BusyboxApplets linked to it.
	Busybox string
	// Config are extra files by guest path with their content.
	Config map[string]string
}

// BusyboxApplets are linked in /bin (a shell and the commands a person
// debugging a guest reaches for).
var BusyboxApplets = []string{"sh", "ls", "cat", "mount", "umount", "dmesg", "mkdir", "echo", "sleep", "ps", "dd", "sync", "hexdump", "grep", "head", "tail"}

// Build writes the initramfs (an uncompressed cpio: unpacking it is a
// copy, faster under TCG than inflating) to out.
func Build(s Spec, out string) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	c := NewCPIO(bw)
	for _, d := range []string{"dev", "proc", "sys", "tmp", "run", "mnt", "etc", "bin", "sbin", "usr/bin", "usr/sbin", "var/lib", "lib64", "lib/x86_64-linux-gnu"} {
		c.Dir(d)
	}
	c.CharDev("dev/console", 5, 1)
	c.CharDev("dev/null", 1, 3)
	copyIn := func(dst, src string, perm uint32) error {
		b, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		return c.File(dst, b, perm)
	}
	if err := copyIn("init", s.Init, 0o755); err != nil {
		return err
	}
	keys := make([]string, 0, len(s.Files))
	for k := range s.Files {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if err := copyIn(k, s.Files[k], 0o755); err != nil {
			return err
		}
	}

	if s.Kernel != nil {
		dep, err := os.Open(filepath.Join(s.Kernel.ModulesDir(), "modules.dep"))
		if err != nil {
			return err
		}
		mods, err := ResolveModules(dep, s.Modules)
		dep.Close()
		if err != nil {
			return err
		}
		var list strings.Builder
		for _, m := range mods {
			dst := path.Join("lib/modules", s.Kernel.Version, m.Path)
			if err := copyIn(dst, filepath.Join(s.Kernel.ModulesDir(), m.Path), 0o644); err != nil {
				return err
			}
			fmt.Fprintf(&list, "%s /%s %s\n", m.Name, dst, strings.Join(m.Deps, ","))
		}
		if err := c.File("etc/vmtest/modules", []byte(list.String()), 0o644); err != nil {
			return err
		}
	}
	libs := map[string]bool{}
	if s.Busybox != "" {
		if err := copyIn("bin/busybox", s.Busybox, 0o755); err != nil {
			return err
		}
		for _, a := range BusyboxApplets {
			c.Symlink("bin/"+a, "busybox")
		}
		ls, err := SharedLibs(s.Busybox) // none for busybox-static
		if err != nil {
			return err
		}
		for _, l := range ls {
			libs[l] = true
		}
	}
	for _, t := range s.Tools {
		real, err := filepath.EvalSymlinks(t)
		if err != nil {
			return &Missing{fmt.Sprintf("%s not found: %v", t, err)}
		}
		if err := copyIn("usr/sbin/"+filepath.Base(t), real, 0o755); err != nil {
			return err
		}
		ls, err := SharedLibs(real)
		if err != nil {
			return err
		}
		for _, l := range ls {
			libs[l] = true
		}
	}
	for _, l := range slices.Sorted(mapKeys(libs)) {
		real, err := filepath.EvalSymlinks(l)
		if err != nil {
			return err
		}
		// The loader at the path the binaries name; the libraries where
		// it searches by default.
		dst := "lib/x86_64-linux-gnu/" + filepath.Base(l)
		if strings.HasPrefix(filepath.Base(l), "ld-linux") {
			dst = strings.TrimPrefix(l, "/")
		}
		if err := copyIn(dst, real, 0o755); err != nil {
			return err
		}
	}
	ckeys := slices.Sorted(mapKeys(s.Config))
	for _, k := range ckeys {
		if err := c.File(k, []byte(s.Config[k]), 0o644); err != nil {
			return err
		}
	}
	if err := c.Close(); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	return f.Close()
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// lddLine matches a library in ldd's output: "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)"
// and "/lib64/ld-linux-x86-64.so.2 (0x...)".
var lddLine = regexp.MustCompile(`(?:=>\s*)?(/\S+)\s+\(0x[0-9a-f]+\)`)

// SharedLibs lists the shared libraries ldd names for a binary (none for a
// static one).
func SharedLibs(bin string) ([]string, error) {
	out, err := exec.Command("ldd", bin).CombinedOutput()
	if err != nil {
		if bytes.Contains(out, []byte("not a dynamic executable")) {
			return nil, nil
		}
		return nil, fmt.Errorf("ldd %s: %v: %s", bin, err, out)
	}
	return ParseLdd(out), nil
}

// ParseLdd returns the library paths of ldd's output.
func ParseLdd(out []byte) []string {
	var libs []string
	for _, l := range strings.Split(string(out), "\n") {
		if m := lddLine.FindStringSubmatch(l); m != nil {
			libs = append(libs, m[1])
		}
	}
	return libs
}
