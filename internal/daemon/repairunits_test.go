package daemon

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// A unit the configuration no longer names (KubeletUnhealthy's unit
// renamed: a typo fixed by a reload) leaves status's "Repairs:" and the
// state file: it is no watched unit. Before, every unit the repairer was
// ever asked about stayed listed "never repaired" for the rest of the boot,
// across reloads and restarts, and the list grew with each unit a reload
// named.
func TestRepairsListOnlyTheUnitsTheConfigurationNames(t *testing.T) {
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	url := "http://" + closed.Addr().String() + "/healthz"
	closed.Close()
	base := testConfig(t)
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	listen := ln.Addr().String()
	ln.Close()
	path := filepath.Join(t.TempDir(), "config.toml")
	write := func(unit string) {
		t.Helper()
		toml := strings.Replace(reloadTOML(base, listen, ""), "[checks.KubeletUnhealthy]\nenabled = false\n",
			"[checks.KubeletUnhealthy]\nenabled = true\ninterval = \"1s\"\ntimeout = \"1s\"\nhealthz_url = \""+url+"\"\nunit = \""+unit+"\"\n", 1)
		if err := os.WriteFile(path, []byte(toml), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// start runs a daemon of the file (no systemd: each repair is
	// "no-systemd", and its unit is listed); stop ends it, saving the state.
	start := func() (d *Daemon, stop func()) {
		t.Helper()
		cfg, _, err := config.Load(path, false)
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", listen)
		if err != nil {
			t.Fatal(err)
		}
		log := quietLog()
		d, err = New(cfg, log, Options{Version: "test", Listener: ln, BootID: "b1", ConfigPath: path,
			Env: &checks.Env{Config: cfg, NodeName: cfg.NodeName, Role: report.RoleWorker, Log: log, Sys: halfFull{checks.RealSys()}, Now: time.Now}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		runErr := make(chan error, 1)
		go func() { runErr <- d.Run(ctx) }()
		return d, func() {
			cancel()
			if err := <-runErr; err != nil {
				t.Error(err)
			}
		}
	}
	listed := func(d *Daemon, unit string) bool {
		_, ok := d.currentEnv().Repair.All()[unit]
		return ok
	}
	write("kubelet-typo.service")
	d, stop := start()
	await(t, d, "the typo's repair listed", func() bool { return listed(d, "kubelet-typo.service") })

	write("kubelet.service")
	if _, err := d.Reload(); err != nil {
		t.Fatal(err)
	}
	await(t, d, "the renamed unit's repair listed", func() bool { return listed(d, "kubelet.service") })
	if listed(d, "kubelet-typo.service") {
		t.Errorf("after the reload that renamed it: kubelet-typo.service is still listed: %v", d.currentEnv().Repair.All())
	}
	stop()

	// A restart within the boot reads the state file the stop saved.
	d, stop = start()
	defer stop()
	await(t, d, "the unit's repair listed after the restart", func() bool { return listed(d, "kubelet.service") })
	if listed(d, "kubelet-typo.service") {
		t.Errorf("after the restart: kubelet-typo.service is listed again: %v", d.currentEnv().Repair.All())
	}
}
