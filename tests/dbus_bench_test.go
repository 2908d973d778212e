//go:build integration

package tests

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	sd "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"

	"github.com/syself/autopilot-health/internal/systemd"
)

// BenchmarkUnitRead is the daemon's cost of reading one unit over D-Bus
// (systemd.DBus.Unit: what the repairer reads) from a real systemd 252:
// time, bytes and allocations on the client's side, per read of a loaded
// service.
//
//	go test -tags integration ./tests -run '^$' -bench UnitRead -benchmem
func BenchmarkUnitRead(b *testing.B) {
	s := realSystemd(b)
	bus := systemd.NewDBusAt(s.BusSocket())
	ctx := context.Background()
	if u, err := bus.Unit(ctx, "syself-tunnel-agent.service"); err != nil || u.LoadState != "loaded" || u.ActiveState == "" {
		b.Fatalf("unit %+v: %v", u, err)
	}
	idlePerNs := idleCPU()
	b.ReportAllocs()
	cpu0, pid1, at := rusageCPU(), s.PID, time.Now()
	sys0 := procCPUOf(b, pid1)
	for b.Loop() {
		if _, err := bus.Unit(ctx, "syself-tunnel-agent.service"); err != nil {
			b.Fatal(err)
		}
	}
	// The client's CPU (this process: the benchmark's own is negligible
	// beside the calls) and systemd's (PID 1 of the namespace, which
	// answers them), per read.
	client := float64(rusageCPU()-cpu0) - idlePerNs*float64(time.Since(at))
	b.ReportMetric(client/1e3/float64(b.N), "client-cpu-us/op")
	b.ReportMetric(float64(procCPUOf(b, pid1)-sys0)/1e3/float64(b.N), "systemd-cpu-us/op")
}

// BenchmarkUnitReadNotActive is BenchmarkUnitRead for a service that is
// not active (broken.service, failed): the read the repairer makes of a
// kubelet that is down, with the properties read only then (its exit
// times, NotifyAccess, RuntimeMaxUSec, and whether its last start was
// skipped for a Condition…= not met or failed on an Assert…=).
//
//	go test -tags integration ./tests -run '^$' -bench UnitReadNotActive -benchmem
func BenchmarkUnitReadNotActive(b *testing.B) {
	s := realSystemd(b)
	bus := systemd.NewDBusAt(s.BusSocket())
	defer bus.Close()
	ctx := context.Background()
	const name = "broken.service"
	deadline := time.Now().Add(15 * time.Second)
	for {
		u, err := bus.Unit(ctx, name)
		if err == nil && u.LoadState == "loaded" && u.ActiveState == "failed" {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("unit %+v: %v", u, err)
		}
		time.Sleep(20 * time.Millisecond) // polling the unit over D-Bus until it failed
	}
	idlePerNs := idleCPU()
	b.ReportAllocs()
	cpu0, pid1, at := rusageCPU(), s.PID, time.Now()
	sys0 := procCPUOf(b, pid1)
	for b.Loop() {
		if _, err := bus.Unit(ctx, name); err != nil {
			b.Fatal(err)
		}
	}
	client := float64(rusageCPU()-cpu0) - idlePerNs*float64(time.Since(at))
	b.ReportMetric(client/1e3/float64(b.N), "client-cpu-us/op")
	b.ReportMetric(float64(procCPUOf(b, pid1)-sys0)/1e3/float64(b.N), "systemd-cpu-us/op")
}

// BenchmarkUnitsRead is the same for three services read at once
// (systemd.DBus.Units: what ServiceNotRecovering reads on a worker).
//
//	go test -tags integration ./tests -run '^$' -bench UnitsRead -benchmem
func BenchmarkUnitsRead(b *testing.B) {
	s := realSystemd(b)
	bus := systemd.NewDBusAt(s.BusSocket())
	defer bus.Close()
	ctx := context.Background()
	names := []string{"syself-tunnel-agent.service", "kubelet.service", "containerd.service"}
	if us, err := bus.Units(ctx, names...); err != nil || len(us) != 3 || us[2].ActiveState == "" {
		b.Fatalf("units %+v: %v", us, err)
	}
	idlePerNs := idleCPU()
	b.ReportAllocs()
	cpu0, at := rusageCPU(), time.Now()
	for b.Loop() {
		if _, err := bus.Units(ctx, names...); err != nil {
			b.Fatal(err)
		}
	}
	client := float64(rusageCPU()-cpu0) - idlePerNs*float64(time.Since(at))
	b.ReportMetric(client/1e3/float64(b.N), "client-cpu-us/op")
}

// BenchmarkUnitsFullRead is the read Units replaced, for the same three
// services: the GetAll of each one's Unit and Service interfaces.
func BenchmarkUnitsFullRead(b *testing.B) {
	s := realSystemd(b)
	ctx := context.Background()
	full, err := sd.NewConnection(func() (*godbus.Conn, error) { return systemd.DialBus(ctx, s.BusSocket()) })
	if err != nil {
		b.Fatal(err)
	}
	defer full.Close()
	names := []string{"syself-tunnel-agent.service", "kubelet.service", "containerd.service"}
	idlePerNs := idleCPU()
	b.ReportAllocs()
	cpu0, at := rusageCPU(), time.Now()
	for b.Loop() {
		for _, n := range names {
			fullRead(b, full, n)
		}
	}
	client := float64(rusageCPU()-cpu0) - idlePerNs*float64(time.Since(at))
	b.ReportMetric(client/1e3/float64(b.N), "client-cpu-us/op")
}

// idleCPU is this process's CPU per ns while it makes no call (the
// harness's own goroutines), to subtract from a benchmark's.
func idleCPU() float64 {
	idle0, idleAt := rusageCPU(), time.Now()
	time.Sleep(time.Second) // the calibration's own pace: nothing to await
	return float64(rusageCPU()-idle0) / float64(time.Since(idleAt))
}

// rusageCPU is this process's CPU time (user+system), in ns.
func rusageCPU() int64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// procCPUOf is the CPU time of a host process's threads (schedstat), in ns.
func procCPUOf(b *testing.B, pid int) int64 {
	b.Helper()
	return schedstat(b, fmt.Sprintf("/proc/%d", pid))
}

// BenchmarkUnitLoadState is the same for a unit's LoadState alone
// (systemd.DBus.LoadState: what TunnelDisconnected reads).
func BenchmarkUnitLoadState(b *testing.B) {
	s := realSystemd(b)
	bus := systemd.NewDBusAt(s.BusSocket())
	ctx := context.Background()
	for name, want := range map[string]string{"syself-tunnel-agent.service": "loaded", "absent-unit.service": "not-found"} {
		if ls, err := bus.LoadState(ctx, name); err != nil || ls != want {
			b.Fatalf("%s: LoadState %q, %v; want %q", name, ls, err, want)
		}
	}
	idlePerNs := idleCPU()
	b.ReportAllocs()
	cpu0, at := rusageCPU(), time.Now()
	for b.Loop() {
		if _, err := bus.LoadState(ctx, "syself-tunnel-agent.service"); err != nil {
			b.Fatal(err)
		}
	}
	client := float64(rusageCPU()-cpu0) - idlePerNs*float64(time.Since(at))
	b.ReportMetric(client/1e3/float64(b.N), "client-cpu-us/op")
}
