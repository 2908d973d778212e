package scenarios

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"
)

const awaitCheck = 40 * time.Second

// nvmeHealthy: QEMU's NVMe drive without warnings. The three disk
// conditions are False, and the disks report carries the drive's identity.
// QEMU reports available spare 0 % with threshold 0 %, which must not
// count as failing.
func nvmeHealthy(g *Guest) error {
	for _, w := range []struct{ typ, reason, msg string }{
		{"DisksFailure", "DisksHealthy", "1 NVMe drive without SMART critical warnings"},
		{"DiskWearHigh", "DiskWearOK", "1 NVMe drive below 80% of rated endurance"},
		{"DiskTemperatureHigh", "DiskTemperatureOK", "1 NVMe drive within their temperature thresholds"},
	} {
		c, err := g.Await(w.typ, "False", w.reason, awaitCheck)
		if err != nil {
			return err
		}
		if err := MessageHas(c, w.msg); err != nil {
			return err
		}
	}
	out, err := g.Check("DisksFailure")
	if err != nil {
		return err
	}
	var doc struct {
		Disks []struct {
			Controller      string `json:"controller"`
			Model           string `json:"model"`
			Serial          string `json:"serial"`
			Firmware        string `json:"firmware"`
			CriticalWarning int    `json:"criticalWarning"`
			TemperatureC    int    `json:"temperatureC"`
			AvailableSpare  int    `json:"availableSparePercent"`
			SpareThreshold  int    `json:"spareThresholdPercent"`
		} `json:"disks"`
	}
	if err := json.Unmarshal(out.Report["disks"], &doc); err != nil {
		return fmt.Errorf("disks report %s: %w", out.Report["disks"], err)
	}
	g.Logf("disks report: %s", compact(out.Report["disks"]))
	if len(doc.Disks) != 1 {
		return fmt.Errorf("disks report lists %d drives, want 1: %s", len(doc.Disks), out.Report["disks"])
	}
	d := doc.Disks[0]
	if d.Controller != "nvme0" || d.Model != "QEMU NVMe Ctrl" || d.Serial != NVMeSerial || d.Firmware == "" {
		return fmt.Errorf("disks report: identity %+v, want nvme0, QEMU NVMe Ctrl, %s, a firmware revision", d, NVMeSerial)
	}
	if d.AvailableSpare != 0 || d.SpareThreshold != 0 || d.CriticalWarning != 0 {
		return fmt.Errorf("disks report: spare %d%% threshold %d%% warning %d: not QEMU's 0/0/0, so the spare case is not tested", d.AvailableSpare, d.SpareThreshold, d.CriticalWarning)
	}
	for _, c := range out.Conditions {
		if c.Type == "DisksFailure" && c.Status != "False" {
			return fmt.Errorf("check --json: %s, want False", c)
		}
	}
	return nil
}

// NVMe admin opcodes and the temperature threshold feature.
const (
	nvmeGetLogPage  = 0x02
	nvmeSetFeatures = 0x09
	nvmeGetFeatures = 0x0a
	nvmeFeatTemp    = 0x04
)

// nvmeTemperature: a Set Features temperature threshold below the drive's
// temperature makes the controller raise its temperature warning:
// DiskTemperatureHigh True, DisksFailure still False (the temperature bit
// is not a failing disk); the old threshold back, False again.
func nvmeTemperature(g *Guest) error {
	smart := make([]byte, 512)
	// SMART / Health log (LID 02h) of the controller (all namespaces).
	if _, err := NVMeAdmin(nvmeGetLogPage, 0xffffffff, (512/4-1)<<16|0x02, 0, smart); err != nil {
		return err
	}
	kelvin := binary.LittleEndian.Uint16(smart[1:3])
	if kelvin < 273 {
		return fmt.Errorf("SMART log: composite temperature %dK", kelvin)
	}
	old, err := NVMeAdmin(nvmeGetFeatures, 0, nvmeFeatTemp, 0, nil)
	if err != nil {
		return err
	}
	g.Logf("composite temperature %dK, threshold %dK", kelvin, old&0xffff)
	if _, err := NVMeAdmin(nvmeSetFeatures, 0, nvmeFeatTemp, uint32(kelvin-10), nil); err != nil {
		return err
	}
	c, err := g.Await("DiskTemperatureHigh", "True", "TemperatureAboveThreshold", awaitCheck)
	if err != nil {
		return err
	}
	if err := MessageHas(c, fmt.Sprintf("nvme0 (QEMU NVMe Ctrl) reports its temperature outside its threshold (%d°C)", int(kelvin)-273)); err != nil {
		return err
	}
	st, err := g.State()
	if err != nil {
		return err
	}
	if df := st["DisksFailure"]; df.Status != "False" {
		return fmt.Errorf("the temperature warning bit made %s, want False", df)
	}
	if _, err := NVMeAdmin(nvmeSetFeatures, 0, nvmeFeatTemp, old&0xffff, nil); err != nil {
		return err
	}
	_, err = g.Await("DiskTemperatureHigh", "False", "DiskTemperatureOK", awaitCheck)
	return err
}

// nvmeCriticalWarning: QEMU's smart_critical_warning=0x05 (available spare
// below threshold, reliability degraded): DisksFailure True naming both
// bits and the drive.
func nvmeCriticalWarning(g *Guest) error {
	c, err := g.Await("DisksFailure", "True", "NVMeCriticalWarning", awaitCheck)
	if err != nil {
		return err
	}
	return MessageHas(c, "nvme0 (QEMU NVMe Ctrl): SMART critical warning 0x05: available spare below threshold, NVM subsystem reliability degraded")
}

// compact returns a JSON document on one line.
func compact(b []byte) string {
	var buf bytes.Buffer
	if json.Compact(&buf, b) != nil {
		return string(b)
	}
	return buf.String()
}
