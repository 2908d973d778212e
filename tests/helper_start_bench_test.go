//go:build integration

package tests

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/coreos/go-systemd/v22/unit"

	"github.com/syself/autopilot-health/tests/harness"
)

// BenchmarkHelperUnitStart measures what one start of the privileged
// helper's unit costs in a real systemd 252: the CPU charged to the unit's
// cgroup (systemd's setting up of the sandbox in the forked child, the
// exec, the program) for the helper's binary run with --version under the
// shipped unit's [Service] sandbox, and the same without the sandbox, and
// without its mount namespace (ProtectSystem=, ProtectHome=, PrivateTmp=,
// ExecPaths=...). It is what a helper that exited when idle and was
// started again by its socket would pay at each burst of requests: why the
// shipped helper stays running (README, Cost).
//
//	go test -tags integration ./tests -run '^$' -bench HelperUnitStart -benchtime=1x
func BenchmarkHelperUnitStart(b *testing.B) {
	if why := harness.SystemdAvailable(); why != "" {
		b.Fatalf("a real systemd cannot run on this machine: %s", why)
	}
	raw, err := harness.RepoFile("units/autopilot-health-privileged.service")
	if err != nil {
		b.Fatal(err)
	}
	sections, err := unit.DeserializeSections(bytes.NewReader(raw))
	if err != nil {
		b.Fatal(err)
	}
	// The sandbox: the [Service] settings but how it is started and
	// restarted.
	var sandbox, noMounts []string
	for _, sec := range sections {
		if sec.Section != "Service" {
			continue
		}
		for _, e := range sec.Entries {
			switch e.Name {
			case "ExecStart", "Restart", "RestartSec", "TimeoutStopSec":
				continue
			}
			line := e.Name + "=" + e.Value
			sandbox = append(sandbox, line)
			switch e.Name {
			case "ProtectSystem", "ProtectHome", "NoExecPaths", "ExecPaths", "PrivateTmp", "PrivateMounts", "ProtectKernelTunables", "ProtectKernelModules", "ProtectControlGroups", "ProtectProc":
			default:
				noMounts = append(noMounts, line)
			}
		}
	}
	if len(sandbox) < 20 {
		b.Fatalf("only %d sandbox settings read from the helper's unit", len(sandbox))
	}
	variants := []struct{ name, settings string }{
		{"sandboxed", strings.Join(sandbox, "\n")},
		{"nomounts", strings.Join(noMounts, "\n")},
		{"bare", ""},
	}
	units := map[string]string{}
	for _, v := range variants {
		// A slice of its own (no dash: a dash nests a slice) sums the CPU
		// of every start.
		units["benchstart"+v.name+".service"] = fmt.Sprintf("[Unit]\nDefaultDependencies=no\nStartLimitIntervalSec=0\n\n[Service]\nType=oneshot\nSlice=benchstart%s.slice\nExecStart=/usr/lib/autopilot-health/autopilot-health-privileged --version\n%s\n", v.name, v.settings)
	}
	s, _ := shippedUnitSystemd(b, "autopilot-health-start-", units, false)
	ctx := context.Background()
	const starts = 20
	// perStart is the CPU of one start of variant's unit in its slice, in
	// ms, over starts starts after one to warm up.
	perStart := func(variant string) float64 {
		u := "benchstart" + variant + ".service"
		if err := s.StartUnit(ctx, u); err != nil { // the slice created, caches warm
			b.Fatalf("%s: %v\n%s", u, err, s.Console(4000))
		}
		slice := s.Cgroup("benchstart" + variant + ".slice")
		c0 := cgroupCPU(b, slice)
		for range starts {
			if err := s.StartUnit(ctx, u); err != nil {
				b.Fatalf("%s: %v", u, err)
			}
		}
		return float64(cgroupCPU(b, slice)-c0) / 1e6 / starts
	}
	b.ResetTimer()
	for _, v := range variants {
		b.ReportMetric(perStart(v.name), v.name+"-cpu-ms/start")
	}
	// Containers add mounts (their root filesystems, their volumes), and
	// setting up the sandbox's mount namespace grows with the host's
	// mounts: the sandboxed start again with 200 more.
	if out, err := exec.Command("nsenter", "-t", strconv.Itoa(s.PID), "-m", "sh", "-c",
		"for i in $(seq 200); do mkdir -p /run/benchmounts/$i && mount -t tmpfs -o size=64k none /run/benchmounts/$i || exit 1; done").CombinedOutput(); err != nil {
		b.Fatalf("mounting 200 tmpfs in the namespace: %v\n%s", err, out)
	}
	b.ReportMetric(perStart("sandboxed"), "sandboxed-200-mounts-cpu-ms/start")
	b.ReportMetric(0, "ns/op")
}
