package vmhost

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// QOMSetPrefix starts the guest's request that the host change a property
// of an emulated device while the guest runs, which only QEMU's monitor
// (QMP) can do:
//
//	VMTEST QOM-SET <device id> <property> <unsigned integer value>
//
// e.g. "VMTEST QOM-SET nvme0 smart_critical_warning 4" (hw/nvme's setter
// takes the new bits at once, and the next SMART page carries them). The
// host answers on the console log only ("HOST| qom-set ...: ok" or the
// error); the guest waits for the effect it asked for (the device's own
// answer), not for the host.
const QOMSetPrefix = "VMTEST QOM-SET "

// HostPrefix starts the lines the host adds to a boot's console lines.
const HostPrefix = "HOST| "

// ParseQOMSet parses a "VMTEST QOM-SET" line (the prefix included).
func ParseQOMSet(line string) (dev, prop string, value uint64, ok bool) {
	rest, found := strings.CutPrefix(line, QOMSetPrefix)
	if !found {
		return "", "", 0, false
	}
	f := strings.Fields(rest)
	if len(f) != 3 {
		return "", "", 0, false
	}
	v, err := strconv.ParseUint(f[2], 0, 64)
	if err != nil {
		return "", "", 0, false
	}
	return f[0], f[1], v, true
}

// QOMSet sets property prop of the device with id dev (-device ...,id=dev:
// /machine/peripheral/dev) to value over the QMP socket at path.
func QOMSet(path, dev, prop string, value uint64) error {
	c, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	// The greeting, then capabilities negotiation, then the command.
	if _, err := qmpReply(r); err != nil {
		return fmt.Errorf("QMP greeting: %w", err)
	}
	for _, cmd := range []any{
		map[string]any{"execute": "qmp_capabilities"},
		map[string]any{"execute": "qom-set", "arguments": map[string]any{
			"path": "/machine/peripheral/" + dev, "property": prop, "value": value}},
	} {
		b, _ := json.Marshal(cmd)
		if _, err := c.Write(append(b, '\n')); err != nil {
			return err
		}
		m, err := qmpReply(r)
		if err != nil {
			return err
		}
		if e, ok := m["error"]; ok {
			return fmt.Errorf("QMP %s: %s", b, e)
		}
	}
	return nil
}

// qmpReply reads the next message that is not an event.
func qmpReply(r *bufio.Reader) (map[string]json.RawMessage, error) {
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return nil, err
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(line, &m); err != nil {
			return nil, fmt.Errorf("QMP: %w: %q", err, line)
		}
		if _, ev := m["event"]; !ev {
			return m, nil
		}
	}
}
