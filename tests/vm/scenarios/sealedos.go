package scenarios

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// SealedRecorded is where the guest's daemon reads the root hashes recorded
// at provisioning (checks.SealedOSTampered.recorded_hashes, its default).
const SealedRecorded = "/var/lib/syself/sealed-os/root-hashes"

// sealedOS: SealedOSTampered against the kernel's own verity table, read by
// the daemon over the device-mapper ioctls. A verity device sealed-root
// with root hash R: `tamper layers` prints R; the one-shot check (its own
// state_dir and recorded file) says RootHashMismatch for a recorded hash
// that is not R and SealedLayerMissing for a recorded layer that has no
// device; the kernel refuses to reload sealed-root's table with another
// image's; the running daemon says SealedOSIntact for "sealed-root R",
// SealedLayerMissing once sealed-root is closed, RootHashMismatch once
// another verity image (root hash R2) is opened as sealed-root, and stays
// True when the original image is back under its name (the condition stays
// set until an operator clears it). A device with sealed-root's verity
// target and another image's in one table is RootHashMismatch for the
// one-shot check though its first target has the recorded hash. `tamper clear` brings it back to
// SealedOSIntact; the recorded file rewritten after that is
// RecordedHashAltered; a clear with the rewritten file in place is
// RootHashMismatch again at once.
func sealedOS(g *Guest) error {
	// No verity device and no recorded file: nothing to check, not False.
	// (dm_verity's device may still be in the daemon's last run.)
	c, err := g.Await("SealedOSTampered", "Unknown", "NothingToCheck", awaitSealed)
	if err != nil {
		return err
	}
	if err := MessageHas(c, "no sealed OS layers on this node: no device-mapper verity device, and no layer recorded in "+SealedRecorded); err != nil {
		return err
	}

	v, err := g.Verity("sealed-root", 1<<20)
	if err != nil {
		return err
	}
	defer v.Close()
	r := v.RootHash
	if err := g.enforces("sealed-root", r); err != nil {
		return err
	}

	// The one-shot check, read-only, with a state_dir and a recorded file
	// of its own (the daemon keeps the first recorded file it reads in
	// this boot, so it must not see these).
	other := strings.Repeat("ab", 32)
	c, err = g.checkSealed("sealed-root " + other + "\n")
	if err != nil {
		return err
	}
	if err := want(c, "True", "RootHashMismatch", "1 finding(s): sealed-root root-hash-mismatch (recorded "+other+", enforced "+r+")",
		"stays set until an operator clears it"); err != nil {
		return fmt.Errorf("one-shot check, a recorded hash that is not the enforced one: %w", err)
	}
	c, err = g.checkSealed("sealed-root " + r + "\nghost-layer " + other + "\n")
	if err != nil {
		return err
	}
	if err := want(c, "True", "SealedLayerMissing", "1 finding(s): ghost-layer layer-missing (recorded, but no verity device of that name is active)"); err != nil {
		return fmt.Errorf("one-shot check, a recorded layer without its device: %w", err)
	}

	// A device whose table holds sealed-root's verity target (the recorded
	// hash) and another image's verity target after it: the recorded hash
	// vouches for only part of the device.
	if err := g.twoTargets("sealed-two", "sealed-root", r); err != nil {
		return err
	}

	// The daemon: the recorded hash matches the enforced one.
	if err := writeAtomic(SealedRecorded, "# layer root-hash\nsealed-root "+r+"\n"); err != nil {
		return err
	}
	c, err = g.Await("SealedOSTampered", "False", "SealedOSIntact", awaitSealed)
	if err != nil {
		return err
	}
	if err := MessageHas(c, "1 sealed layer(s) enforce their recorded root hash: sealed-root "+r); err != nil {
		return err
	}

	// sealed-root swapped for another verity image. The kernel refuses to
	// reload a verity device's table (the target is immutable), so a swap
	// is a removal and a new device under the name: each step is awaited,
	// which makes the findings (newest first in the message) the same on
	// every run.
	alt, err := g.Verity("sealed-alt", 2<<20)
	if err != nil {
		return err
	}
	r2 := alt.RootHash
	if r2 == r {
		alt.Close()
		return fmt.Errorf("the other image has the original root hash %s", r)
	}
	altTable, err := g.Run("dmsetup", "table", "sealed-alt")
	if err == nil {
		_, err = g.Run("dmsetup", "--noudevsync", "reload", "sealed-root", "--table", strings.TrimSpace(altTable))
		if err == nil || !strings.Contains(err.Error(), "Invalid argument") {
			err = fmt.Errorf("dmsetup reload of a verity device: %v, want Invalid argument", err)
		} else {
			err = g.enforces("sealed-root", r)
		}
	}
	alt.Close()
	if err != nil {
		return err
	}
	missing := "sealed-root layer-missing (recorded, but no verity device of that name is active)"
	v.Close()
	c, err = g.Await("SealedOSTampered", "True", "SealedLayerMissing", awaitSealed)
	if err != nil {
		return err
	}
	if err := MessageHas(c, "1 finding(s): "+missing+";"); err != nil {
		return err
	}
	if _, err := g.Run("veritysetup", "open", alt.Data, "sealed-root", alt.Hash, r2); err != nil {
		return err
	}
	if err := g.enforces("sealed-root", r2); err != nil {
		return err
	}
	mismatch := "sealed-root root-hash-mismatch (recorded " + r + ", enforced " + r2 + ")"
	c, err = g.Await("SealedOSTampered", "True", "RootHashMismatch", awaitSealed)
	if err != nil {
		return err
	}
	if err := MessageHas(c, "2 finding(s): "+mismatch+"; "+missing+";"); err != nil {
		return err
	}

	// The original image back under its name: the condition stays set.
	v.Close()
	c, err = g.Await("SealedOSTampered", "True", "SealedLayerMissing", awaitSealed)
	if err != nil {
		return err
	}
	if err := MessageHas(c, "3 finding(s): "+missing+"; "+mismatch+"; "+missing+";"); err != nil {
		return err
	}
	if _, err := g.Run("veritysetup", "open", v.Data, "sealed-root", v.Hash, r); err != nil {
		return err
	}
	if err := g.enforces("sealed-root", r); err != nil {
		return err
	}
	if err := g.awaitRuns("SealedOSTampered", 2); err != nil {
		return err
	}
	st, err := g.State()
	if err != nil {
		return err
	}
	if err := want(st["SealedOSTampered"], "True", "SealedLayerMissing", "3 finding(s): "+missing+"; "+mismatch+"; "+missing+";",
		"stays set until an operator clears it"); err != nil {
		return err
	}

	// The operator's clear, through the daemon's control socket: the
	// recorded hashes are read afresh and the condition falls to what the
	// new evaluation finds, printed by the command.
	if err := g.clearTamper("sealed-root back to its recorded image", "SealedOSTampered\tFalse\tSealedOSIntact\t1 sealed layer(s) enforce their recorded root hash: sealed-root "+r); err != nil {
		return err
	}
	c, err = g.Await("SealedOSTampered", "False", "SealedOSIntact", awaitSealed)
	if err != nil {
		return err
	}

	// The recorded file rewritten after its first reading in this boot
	// (after the clear): RecordedHashAltered, though the image enforced is
	// still the one recorded at first.
	if err := writeAtomic(SealedRecorded, "sealed-root "+other+"\n"); err != nil {
		return err
	}
	c, err = g.Await("SealedOSTampered", "True", "RecordedHashAltered", awaitSealed)
	if err != nil {
		return err
	}
	if err := MessageHas(c, "1 finding(s): "+SealedRecorded+" recorded-hash-altered (layer sealed-root: first read in this boot as \""+r+"\", now \""+other+"\");"); err != nil {
		return err
	}

	// A clear with the altered file in place takes it as the new record:
	// the layer mismatches it, so the condition is True again at once.
	return g.clearTamper("accepting the rewritten record", "SealedOSTampered\tTrue\tRootHashMismatch\t1 finding(s): sealed-root root-hash-mismatch (recorded "+other+", enforced "+r+")")
}

// twoTargets makes device name with a table of two verity targets: that
// of device verity (root hash r) and, after it, that of another image, and
// asserts that the one-shot check with "name r" recorded is
// RootHashMismatch naming the other image's hash; the devices are removed
// after. (The kernel refuses a verity target beside a target of another
// type: "immutable target type cannot be mixed with other target types".)
func (g *Guest) twoTargets(name, verity, r string) error {
	other, err := g.Verity(name+"-b", 1<<20)
	if err != nil {
		return err
	}
	defer other.Close()
	var lines []string
	var at uint64
	for _, dev := range []string{verity, other.Name} {
		table, err := g.Run("dmsetup", "table", dev)
		if err != nil {
			return err
		}
		f := strings.Fields(table)
		if len(f) < 3 || f[2] != "verity" {
			return fmt.Errorf("dmsetup table %s: %q, want one verity target", dev, table)
		}
		var length uint64
		if _, err := fmt.Sscan(f[1], &length); err != nil {
			return fmt.Errorf("dmsetup table %s: length %q: %v", dev, f[1], err)
		}
		lines = append(lines, fmt.Sprintf("%d %d %s", at, length, strings.Join(f[2:], " ")))
		at += length
	}
	if _, err := g.Run("dmsetup", "--noudevsync", "create", "--readonly", name, "--table", strings.Join(lines, "\n")); err != nil {
		return err
	}
	defer g.Run("dmsetup", "--noudevsync", "remove", name)
	c, err := g.checkSealed(name + " " + r + "\n")
	if err != nil {
		return err
	}
	if err := want(c, "True", "RootHashMismatch", "1 finding(s): "+name+" root-hash-mismatch (recorded "+r+", enforced "+other.RootHash+")"); err != nil {
		return fmt.Errorf("one-shot check, the recorded verity target beside another verity target in one table: %w", err)
	}
	return nil
}

// clearTamper runs `autopilot-health tamper clear` (as root, over the
// daemon's control socket) and asserts that what it prints has line.
func (g *Guest) clearTamper(reason, line string) error {
	out, err := g.Run(DaemonPath, "tamper", "clear", "--config", ConfigPath, "--reason", reason)
	if err != nil {
		return err
	}
	if !strings.Contains(out, line) || !strings.HasSuffix(out, "\ncleared") {
		return fmt.Errorf("tamper clear printed %q, want a line with %q and cleared", out, line)
	}
	return nil
}

// awaitSealed bounds a wait for the daemon's SealedOSTampered (every 2 s
// in the guest) under a loaded host.
const awaitSealed = 30 * time.Second

// want fails unless the condition has this status and reason and its
// message every part.
func want(c Condition, status, reason string, parts ...string) error {
	if c.Status != status || c.Reason != reason {
		return fmt.Errorf("%s, want %s %s", c, status, reason)
	}
	return MessageHas(c, parts...)
}

// enforces asserts that `autopilot-health tamper layers` (the
// device-mapper ioctls) lists the verity device with this root hash.
func (g *Guest) enforces(name, rootHash string) error {
	out, err := g.Run(DaemonPath, "tamper", "layers", "--config", ConfigPath)
	if err != nil {
		return err
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, name+"\t") {
			if f := strings.Split(l, "\t"); len(f) < 2 || f[1] != rootHash {
				return fmt.Errorf("tamper layers: %q, want root hash %s", l, rootHash)
			}
			return nil
		}
	}
	return fmt.Errorf("tamper layers lists no %s: %q", name, out)
}

// checkSealed runs `autopilot-health check --json --only SealedOSTampered`
// with the guest's check configuration, a fresh state_dir and recorded as
// the recorded hashes, and returns its SealedOSTampered.
func (g *Guest) checkSealed(recorded string) (Condition, error) {
	dir, err := os.MkdirTemp("/tmp", "sealed-check")
	if err != nil {
		return Condition{}, err
	}
	defer os.RemoveAll(dir)
	file := dir + "/root-hashes"
	if err := os.WriteFile(file, []byte(recorded), 0o600); err != nil {
		return Condition{}, err
	}
	cfg, err := replaceOnce(CheckConfig, `state_dir = "`+StateDir+`"`, `state_dir = "`+dir+`/state"`)
	if err == nil {
		cfg, err = replaceOnce(cfg, "[checks.SealedOSTampered]\n", "[checks.SealedOSTampered]\nrecorded_hashes = \""+file+"\"\n")
	}
	if err != nil {
		return Condition{}, err
	}
	if err := os.WriteFile(dir+"/check.toml", []byte(cfg), 0o600); err != nil {
		return Condition{}, err
	}
	cmd := exec.Command(DaemonPath, "check", "--json", "--config", dir+"/check.toml", "--only", "SealedOSTampered")
	b, err := cmd.Output()
	var ee *exec.ExitError
	if err != nil && !(errors.As(err, &ee) && ee.ExitCode() == 1) {
		msg := ""
		if ee != nil {
			msg = string(ee.Stderr)
		}
		return Condition{}, fmt.Errorf("autopilot-health check: %v %s", err, msg)
	}
	var out CheckOutput
	if err := json.Unmarshal(b, &out); err != nil {
		return Condition{}, fmt.Errorf("check --json: %w: %s", err, b)
	}
	for _, c := range out.Conditions {
		if c.Type == "SealedOSTampered" {
			g.Logf("check: %s", c)
			return c, nil
		}
	}
	return Condition{}, fmt.Errorf("check --json has no SealedOSTampered: %s", b)
}

func replaceOnce(s, old, new string) (string, error) {
	if n := strings.Count(s, old); n != 1 {
		return "", fmt.Errorf("the guest's check configuration has %q %d times, want once", old, n)
	}
	return strings.Replace(s, old, new, 1), nil
}

// writeAtomic writes the file whole (a temporary file renamed over it): the
// daemon keeps the first content it reads in this boot.
func writeAtomic(path, content string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// awaitRuns waits until the daemon has finished n more runs of the check
// (autopilot_health_check_duration_seconds_count): with n = 2, at least one
// run started after the call.
func (g *Guest) awaitRuns(check string, n float64) error {
	page, err := g.Metrics()
	if err != nil {
		return err
	}
	v, ok := Metric(page, "autopilot_health_check_duration_seconds_count", "check", check)
	if !ok {
		return fmt.Errorf("/metrics has no autopilot_health_check_duration_seconds_count for %s", check)
	}
	_, err = g.AwaitMetric(v+n, awaitSealed, "autopilot_health_check_duration_seconds_count", "check", check)
	return err
}
