package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/privileged"
	"github.com/syself/autopilot-health/kmsg"
	"github.com/syself/autopilot-health/report"
)

// KmsgOptions builds the kernel log monitor's options from the
// configuration (already validated, so the rules compile).
func KmsgOptions(cfg *config.Config, env *checks.Env, store *report.Store, reg prometheus.Registerer) (kmsg.Options, error) {
	custom := make([]kmsg.Rule, len(cfg.Kmsg.Rules))
	for i, r := range cfg.Kmsg.Rules {
		custom[i] = kmsg.Rule{Name: r.Name, Kind: kmsg.Kind(r.Kind), Condition: r.Condition, Reason: r.Reason, Pattern: r.Pattern}
	}
	rules, err := kmsg.BuildRules(cfg.Kmsg.Disable, custom)
	if err != nil {
		return kmsg.Options{}, err
	}
	rs, err := kmsg.Compile(rules, cfg.Kmsg.CriticalTasks)
	if err != nil {
		return kmsg.Options{}, err
	}
	return kmsg.Options{
		Rules: rs, Store: store, GPU: env.GPU, KernelOnly: cfg.Kmsg.KernelOnly,
		IOErrorThreshold: cfg.Checks.DisksFailure.IOErrorThreshold,
		IOErrorWindow:    cfg.Checks.DisksFailure.IOErrorWindow.Duration,
		IgnoreDevices:    cfg.Kmsg.IgnoreDevices,
		Sysfs:            cfg.HostPath("/sys"),
		Proc:             cfg.HostPath("/proc"),
		HostRoot:         cfg.HostRoot, // the pod volume directories resolved under it at each lookup
		// kubelet_root_dir's pods and plugins; a kubelet_root_dir
		// change needs a restart (config.RestartKeys): Reconfigure
		// keeps these.
		PodVolumeDirs: cfg.PodVolumeDirs(),
		// nil where the checks count nothing (the one-shot check, a
		// replay).
		MalformedMountinfo: env.Malformed.Counter(checks.MalformedMountKmsg),
		Registerer:         reg,
	}, nil
}

// KmsgExternal lists what the kernel log monitor evaluates on this node,
// read from the catalog: its own conditions (source kmsg, those whose scope
// applies) and the conditions it evaluates a part of (a row's part of
// source kmsg: DisksFailure's kernel I/O errors).
func KmsgExternal(mon *kmsg.Monitor) []string {
	if mon == nil {
		return nil
	}
	out := mon.Conditions()
	for _, d := range report.Conditions {
		if _, ok := d.Part(report.SourceKmsg); ok && d.Source != report.SourceKmsg {
			out = append(out, d.Type)
		}
	}
	return out
}

// kmsgReadTimeout is how long a read of the kernel log waits for a record:
// the reader's period (a read that waited counts as progress).
const kmsgReadTimeout = 10 * time.Second

func (d *Daemon) newReader() *kmsg.Reader {
	// The cursor lives in the state file now (report.Store.Keep); the file
	// of earlier versions is no longer read.
	os.Remove(filepath.Join(d.cfg.StateDir, "kmsg-cursor.json"))
	return &kmsg.Reader{
		Path: d.cfg.HostPath(d.cfg.Kmsg.Device), Monitor: d.kmsg, Log: d.log.With("component", "kmsg"),
		FromStart: d.cfg.Kmsg.FromBootStart, Progress: d.live.Beat, ReadTimeout: kmsgReadTimeout, Gather: kmsg.GatherTime, Grid: d.grid(), Open: d.kmsgOpen,
		// A helper that refuses its command line refuses every start of
		// the daemon too: the watchdog would restart it for nothing.
		Refused: func(err error) bool { return errors.Is(err, privileged.ErrRefused) },
	}
}

// The privileged helper's client is what the checks need of a helper.
var _ checks.Helper = (*privileged.Client)(nil)

// helperKmsgOpen opens the kernel log through the helper when the
// configured device is /dev/kmsg (the helper opens that one only), and in
// this process otherwise (a test's FIFO, a host root elsewhere).
func helperKmsgOpen(h *privileged.Client) func(ctx context.Context, path string) (kmsg.Device, error) {
	return func(ctx context.Context, path string) (kmsg.Device, error) {
		if path != "/dev/kmsg" {
			dev, err := kmsg.Open(path)
			if err != nil {
				err = fmt.Errorf("%w (kmsg.device is not /dev/kmsg, so this process opens it, not the privileged helper)", err)
			}
			return dev, err
		}
		fd, err := h.OpenKmsg(ctx)
		if err != nil {
			return nil, err
		}
		return kmsg.FromFD(fd, path)
	}
}
