package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/manifests"
)

// The commands of this binary that the shipped alerts' annotations tell an
// operator to run are written as commands (in backquotes) and run as
// written: none is refused as bad usage (a missing argument, an unknown
// subcommand or flag). config validate is run on the path it names, holding
// the default configuration, and says it is valid; on a file the unit's run
// refuses (a host_root other than "/", with its --privileged-helper) it
// says so, as the reload the alert follows does.
func TestAlertRunbookCommandsRun(t *testing.T) {
	m, ok := manifests.Lookup("prometheus-rules")
	if !ok {
		t.Fatal("no prometheus-rules manifest")
	}
	b, err := m.Render()
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	// A mention of one of the binary's commands: "autopilot-health"
	// followed by a command name (not "autopilot-health has run ...").
	mention := regexp.MustCompile(`(` + "`" + `(?:sudo )?)?autopilot-health (run|check|kmsg|status|reload|tamper|catalog|config|manifests|version)\b`)
	quoted := regexp.MustCompile("`(?:sudo )?(autopilot-health [^`]*)`")
	cfg := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(cfg, config.DefaultTOML(), 0o644); err != nil {
		t.Fatal(err)
	}
	unitRefuses := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(unitRefuses, []byte("host_root = \"/host\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			for key, text := range r.Annotations {
				for _, sm := range mention.FindAllStringSubmatch(text, -1) {
					if sm[1] == "" {
						t.Errorf("%s %s: %q is not written as a command (in backquotes)", r.Alert, key, sm[0])
					}
				}
				for _, sm := range quoted.FindAllStringSubmatch(text, -1) {
					n++
					args := strings.Fields(sm[1])[1:]
					for i, a := range args {
						if a == config.DefaultPath {
							args[i] = cfg
						}
					}
					code, out, errs := run(t, args...)
					if strings.Contains(errs, "Usage:") || strings.Contains(errs, "unknown") || strings.Contains(errs, "unexpected argument") ||
						strings.Contains(errs, "flag provided but not defined") {
						t.Errorf("%s %s: `%s` is refused as bad usage (exit %d):\n%s", r.Alert, key, sm[1], code, errs)
						continue
					}
					if len(args) >= 2 && args[0] == "config" && args[1] == "validate" && (code != exitOK || !strings.HasSuffix(out, ": valid\n")) {
						t.Errorf("%s %s: `%s` on the default configuration: exit %d\n%s%s", r.Alert, key, sm[1], code, out, errs)
					}
					// It checks the file as the unit's run loads it: a
					// host_root that run --privileged-helper refuses (and a
					// reload of its daemon) is refused here too.
					if len(args) >= 2 && args[0] == "config" && args[1] == "validate" {
						for i, a := range args {
							if a == cfg {
								args[i] = unitRefuses
							}
						}
						if code, out, errs := run(t, args...); code != exitError || !strings.Contains(errs, "key host_root") {
							t.Errorf("%s %s: `%s` on a file the unit's run refuses (host_root = \"/host\"): exit %d, want %d naming host_root\n%s%s",
								r.Alert, key, sm[1], code, exitError, out, errs)
						}
					}
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no alert names a command of autopilot-health: the scenario tests nothing")
	}
}
