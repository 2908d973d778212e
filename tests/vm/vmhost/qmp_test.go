package vmhost

import (
	"bufio"
	"encoding/json"
	"net"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseQOMSet(t *testing.T) {
	for _, c := range []struct {
		line, dev, prop string
		v               uint64
		ok              bool
	}{
		{"VMTEST QOM-SET nvme0 smart_critical_warning 4", "nvme0", "smart_critical_warning", 4, true},
		{"VMTEST QOM-SET nvme0 smart_critical_warning 0x06", "nvme0", "smart_critical_warning", 6, true},
		{"VMTEST QOM-SET nvme0 smart_critical_warning", "", "", 0, false},
		{"VMTEST QOM-SET nvme0 smart_critical_warning -1", "", "", 0, false},
		{"  VMTEST QOM-SET nvme0 p 1", "", "", 0, false},
	} {
		dev, prop, v, ok := ParseQOMSet(c.line)
		if dev != c.dev || prop != c.prop || v != c.v || ok != c.ok {
			t.Errorf("ParseQOMSet(%q) = %q %q %d %v", c.line, dev, prop, v, ok)
		}
	}
}

// QOMSet speaks QMP as QEMU does: a greeting, capabilities, then the
// command, with an event in between that is not the answer; an error
// answer is the error.
func TestQOMSet(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "qmp.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got := make(chan string, 4)
	go func() {
		for i := 0; ; i++ {
			c, err := l.Accept()
			if err != nil {
				return
			}
			r := bufio.NewReader(c)
			c.Write([]byte(`{"QMP": {"version": {}, "capabilities": []}}` + "\n"))
			r.ReadString('\n') // qmp_capabilities
			c.Write([]byte(`{"return": {}}` + "\n"))
			cmd, _ := r.ReadString('\n')
			got <- strings.TrimSpace(cmd)
			c.Write([]byte(`{"event": "NVME_SMART", "data": {}}` + "\n"))
			if i == 0 {
				c.Write([]byte(`{"return": {}}` + "\n"))
			} else {
				c.Write([]byte(`{"error": {"class": "GenericError", "desc": "unsupported smart critical warning bits: 0x20"}}` + "\n"))
			}
			c.Close()
		}
	}()
	if err := QOMSet(sock, "nvme0", "smart_critical_warning", 4); err != nil {
		t.Fatal(err)
	}
	var cmd struct {
		Execute   string         `json:"execute"`
		Arguments map[string]any `json:"arguments"`
	}
	if err := json.Unmarshal([]byte(<-got), &cmd); err != nil || cmd.Execute != "qom-set" ||
		cmd.Arguments["path"] != "/machine/peripheral/nvme0" || cmd.Arguments["property"] != "smart_critical_warning" || cmd.Arguments["value"] != float64(4) {
		t.Errorf("command %+v (%v)", cmd, err)
	}
	if err := QOMSet(sock, "nvme0", "smart_critical_warning", 0x20); err == nil || !strings.Contains(err.Error(), "unsupported smart critical warning bits") {
		t.Errorf("an error answer: %v", err)
	}
}
