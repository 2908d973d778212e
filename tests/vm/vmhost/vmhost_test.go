package vmhost

import (
	"bytes"
	"os/exec"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/testenv"
)

// The archive is what the kernel unpacks: checked here with GNU cpio or
// busybox cpio reading it back, where one is installed.
func TestCPIONewc(t *testing.T) {
	var b bytes.Buffer
	c := NewCPIO(&b)
	if err := c.File("usr/sbin/tool", []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	c.Symlink("bin/sh", "busybox")
	c.CharDev("dev/console", 5, 1)
	c.File("/usr/sbin/tool", []byte("second copy is ignored"), 0o644)
	c.File("etc/odd", []byte("abc"), 0o644) // 3 bytes: padded to 4
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	out := b.Bytes()
	if len(out)%4 != 0 {
		t.Errorf("archive is %d bytes, not padded to 4", len(out))
	}
	if !bytes.HasPrefix(out, []byte("070701")) || !bytes.Contains(out, []byte("TRAILER!!!\x00")) {
		t.Fatalf("not a newc archive with a trailer: %q", out[:min(len(out), 120)])
	}
	// The first header: inode 1, a directory (usr) made for the file's parents.
	if h := string(out[6:22]); h != "00000001000041ED" {
		t.Errorf("first entry ino+mode %s, want 00000001000041ED (usr/, 040755)", h)
	}
	lister := []string{"cpio", "-it"}
	if _, err := exec.LookPath("cpio"); err != nil {
		if _, err := exec.LookPath("busybox"); err != nil {
			testenv.Skip(t, "no cpio or busybox (Debian package busybox-static) to read the archive back")
		}
		lister = []string{"busybox", "cpio", "-t"}
	}
	cmd := exec.Command(lister[0], lister[1:]...)
	cmd.Stdin = bytes.NewReader(out)
	got, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v: %v", lister, err)
	}
	want := "usr\nusr/sbin\nusr/sbin/tool\nbin\nbin/sh\ndev\ndev/console\netc\netc/odd\n"
	if string(got) != want {
		t.Errorf("%v lists\n%s\nwant\n%s", lister, got, want)
	}
}

func TestResolveModules(t *testing.T) {
	// A part of Debian 6.1's modules.dep: each line names the module's
	// whole dependency closure, deepest last.
	dep := `kernel/drivers/md/dm-verity.ko: kernel/drivers/md/dm-bufio.ko kernel/drivers/md/dm-mod.ko kernel/lib/reed_solomon/reed_solomon.ko
kernel/drivers/md/dm-bufio.ko: kernel/drivers/md/dm-mod.ko
kernel/drivers/md/dm-mod.ko:
kernel/lib/reed_solomon/reed_solomon.ko:
kernel/drivers/scsi/scsi_debug.ko: kernel/drivers/scsi/scsi_mod.ko kernel/drivers/scsi/scsi_common.ko
kernel/drivers/scsi/scsi_mod.ko: kernel/drivers/scsi/scsi_common.ko
kernel/drivers/scsi/scsi_common.ko:
`
	mods, err := ResolveModules(strings.NewReader(dep), []string{"dm-verity", "dm_mod", "scsi_debug"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range mods {
		names = append(names, m.Name)
	}
	want := []string{"dm_mod", "dm_bufio", "reed_solomon", "dm_verity", "scsi_common", "scsi_mod", "scsi_debug"}
	if !reflect.DeepEqual(names, want) {
		t.Errorf("load order %v, want %v", names, want)
	}
	if mods[3].Path != "kernel/drivers/md/dm-verity.ko" || !reflect.DeepEqual(mods[3].Deps, []string{"dm_bufio", "dm_mod", "reed_solomon"}) {
		t.Errorf("dm-verity: %+v", mods[3])
	}
	if _, err := ResolveModules(strings.NewReader(dep), []string{"ext4"}); err == nil || !strings.Contains(err.Error(), "module ext4 is not in modules.dep") {
		t.Errorf("an absent module: %v", err)
	}
	if _, err := ResolveModules(strings.NewReader("a.ko: b.ko\nb.ko: a.ko\n"), []string{"a"}); err == nil || !strings.Contains(err.Error(), "cycle") {
		t.Errorf("a cycle: %v", err)
	}
	if _, err := ResolveModules(strings.NewReader("a.ko b.ko\n"), []string{"a"}); err == nil || !strings.Contains(err.Error(), "line 1: no colon") {
		t.Errorf("a malformed line: %v", err)
	}
}

func TestParseLdd(t *testing.T) {
	out := "\tlinux-vdso.so.1 (0x00007ffd5d1f2000)\n" +
		"\tlibcryptsetup.so.12 => /lib/x86_64-linux-gnu/libcryptsetup.so.12 (0x00007f0c0a5e1000)\n" +
		"\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f0c0a400000)\n" +
		"\t/lib64/ld-linux-x86-64.so.2 (0x00007f0c0a6a5000)\n"
	want := []string{"/lib/x86_64-linux-gnu/libcryptsetup.so.12", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"}
	if got := ParseLdd([]byte(out)); !reflect.DeepEqual(got, want) {
		t.Errorf("ParseLdd = %v, want %v", got, want)
	}
}

func TestParseResult(t *testing.T) {
	for _, tc := range []struct {
		line string
		name string
		want ScenarioResult
		ok   bool
	}{
		{"VMTEST RESULT dm_verity PASS 1234ms", "dm_verity", ScenarioResult{Pass: true, Duration: 1234 * time.Millisecond}, true},
		{"VMTEST RESULT hung_task FAIL 20ms waiting 40s for KernelDeadlock=True", "hung_task", ScenarioResult{Duration: 20 * time.Millisecond, Detail: "waiting 40s for KernelDeadlock=True"}, true},
		{"VMTEST RESULT x MAYBE 1ms", "", ScenarioResult{}, false},
		{"VMTEST RESULT x PASS soon", "", ScenarioResult{}, false},
		{"[    3.1] VMTEST RESULT x PASS 1ms", "", ScenarioResult{}, false},
	} {
		name, r, ok := ParseResult(tc.line)
		if ok != tc.ok || name != tc.name || r != tc.want {
			t.Errorf("ParseResult(%q) = %q, %+v, %v", tc.line, name, r, ok)
		}
	}
}
