package report

import (
	"testing"
	"time"
)

// The spec's catalog, written out independently of catalog.go.
func TestCatalogMatchesSpec(t *testing.T) {
	type row struct {
		src   Source
		disp  Disposition
		every time.Duration
		scope Scope
	}
	spec := map[string]row{
		"KubeletUnhealthy":             {SourceCheck, Repair, 10 * time.Second, ScopeAll},
		"ContainerRuntimeUnhealthy":    {SourceCheck, Repair, 10 * time.Second, ScopeAll},
		"ServiceNotRecovering":         {SourceCheck, Alert, time.Minute, ScopeAll},
		"KubeletHeartbeatFailed":       {SourceCheck, Alert, 5 * time.Minute, ScopeAll},
		"DisksFailure":                 {SourceCheck, Alert, 5 * time.Minute, ScopeAll},
		"DiskWearHigh":                 {SourceCheck, Operability, 30 * time.Minute, ScopeAll},
		"DiskTemperatureHigh":          {SourceCheck, Operability, 5 * time.Minute, ScopeAll},
		"DiskUsageHigh":                {SourceCheck, Operability, 2 * time.Minute, ScopeAll},
		"NodeServiceDown":              {SourceCheck, Operability, 30 * time.Second, ScopeAll},
		"NodeInfoStale":                {SourceCheck, Alert, time.Minute, ScopeAll},
		"CertRenewalFailing":           {SourceCheck, Alert, time.Hour, ScopeAll},
		"ProxyNotServing":              {SourceCheck, Operability, 30 * time.Second, ScopeWorker},
		"ClockNotSynchronized":         {SourceCheck, Alert, time.Minute, ScopeAll},
		"CNIUnhealthy":                 {SourceCheck, Alert, 30 * time.Second, ScopeAll},
		"TunnelDisconnected":           {SourceCheck, Operability, 30 * time.Second, ScopeAll},
		"GpuActivationFailed":          {SourceCheck, Operability, time.Minute, ScopeGPU},
		"APIServerSourceIPUnavailable": {SourceCheck, Alert, time.Minute, ScopeControlPlane},
		"ReadonlyFilesystem":           {SourceKmsg, Alert, 0, ScopeAll},
		"KernelDeadlock":               {SourceKmsg, Alert, 0, ScopeAll},
		"VerityCorruption":             {SourceKmsg, Security, 0, ScopeAll},
		"CperHardwareErrorFatal":       {SourceKmsg, Alert, 0, ScopeAll},
		"GpuFallenOffBus":              {SourceKmsg, Alert, 0, ScopeGPU},
		"SealedOSTampered":             {SourceTamper, Security, 5 * time.Minute, ScopeAll},
		"NodeTampered":                 {SourceTamper, Security, 5 * time.Minute, ScopeAll},
	}
	// A new condition gets its row here too: this table is the spec's
	// word on source, disposition, interval and scope, checked against the
	// catalog row by row (no count to keep up to date).
	for typ := range spec {
		if _, ok := Lookup(typ); !ok {
			t.Errorf("%s is in the spec but not in the catalog", typ)
		}
	}
	if len(Conditions) != len(spec) {
		t.Errorf("catalog has %d conditions, spec %d", len(Conditions), len(spec))
	}
	for _, c := range Conditions {
		want, ok := spec[c.Type]
		if !ok {
			t.Errorf("%s is not in the spec table of this test: add its row", c.Type)
			continue
		}
		got := row{c.Source, c.Disposition, c.Interval, c.Scope}
		if got != want {
			t.Errorf("%s = %+v, spec %+v", c.Type, got, want)
		}
		if c.HealthyReason == "" || len(c.ProblemReasons) == 0 {
			t.Errorf("%s lacks reasons", c.Type)
		}
		if c.Source != SourceCheck && c.Hold == HoldWhileTrue {
			t.Errorf("%s: kernel and tamper conditions are held once set", c.Type)
		}
	}
	for _, s := range []string{"ReadonlyFilesystem", "KernelDeadlock", "VerityCorruption"} {
		if d, _ := Lookup(s); d.Hold != HoldUntilReboot {
			t.Errorf("%s hold = %s", s, d.Hold)
		}
	}
	for _, s := range []string{"SealedOSTampered", "NodeTampered"} {
		if d, _ := Lookup(s); d.Hold != HoldForever {
			t.Errorf("%s: spec says it stays set; hold = %s", s, d.Hold)
		}
	}
	if d, _ := Lookup("ReadonlyFilesystem"); d.ProblemReasons[0] != "FilesystemIsReadOnly" {
		t.Errorf("ReadonlyFilesystem reason %q, spec example FilesystemIsReadOnly", d.ProblemReasons[0])
	}
}

func TestEventsMatchSpec(t *testing.T) {
	want := []string{"TaskHung", "Ext4Error", "Ext4Warning", "IOError", "BlockIOError", "NvmeError", "AtaError",
		"NvidiaXidError", "MemoryReadError", "UnregisterNetDevice", "CperHardwareErrorCorrected", "CperHardwareErrorRecoverable",
		"PodVolumeReadOnly", "TamperCleared"} // the last two are not the spec's: a pod volume's read-only remount (not ReadonlyFilesystem), an operator's clear of the tamper conditions
	if len(Events) != len(want) {
		t.Fatalf("%d events, want %d", len(Events), len(want))
	}
	for i, r := range want {
		if Events[i].Reason != r {
			t.Errorf("event %d = %s, want %s", i, Events[i].Reason, r)
		}
	}
	for _, not := range []string{"OOMKilling", "KernelOops"} {
		if _, ok := LookupEvent(not); ok {
			t.Errorf("%s must not be emitted (spec)", not)
		}
	}
}

func TestScopeApplies(t *testing.T) {
	for _, tc := range []struct {
		s    Scope
		role Role
		gpu  bool
		want bool
	}{
		{ScopeAll, RoleWorker, false, true},
		{ScopeWorker, RoleControlPlane, false, false},
		{ScopeWorker, RoleWorker, false, true},
		{ScopeControlPlane, RoleControlPlane, false, true},
		{ScopeControlPlane, RoleWorker, true, false},
		{ScopeGPU, RoleWorker, false, false},
		{ScopeGPU, RoleControlPlane, true, true},
	} {
		if got := tc.s.Applies(tc.role, tc.gpu); got != tc.want {
			t.Errorf("%s.Applies(%s, gpu=%v) = %v", tc.s, tc.role, tc.gpu, got)
		}
	}
}

// TunnelDisconnected is set on every node (the spec's scope) but evaluated
// on workers only: the catalog's Nodes column says so.
func TestTunnelDisconnectedNodes(t *testing.T) {
	d, _ := Lookup("TunnelDisconnected")
	if d.Scope != ScopeAll || d.Evaluated != ScopeWorker {
		t.Errorf("scope %s, evaluated %s", d.Scope, d.Evaluated)
	}
	if got, want := d.Nodes(), "all, evaluated on worker nodes (`Unknown` on the others)"; got != want {
		t.Errorf("Nodes() = %q, want %q", got, want)
	}
	if d, _ := Lookup("ProxyNotServing"); d.Nodes() != "worker" {
		t.Errorf("ProxyNotServing: Nodes() = %q", d.Nodes())
	}
}
