package tamper

import (
	"bufio"
	"fmt"
	"github.com/syself/autopilot-health/internal/hostio"
	"io"
	"strings"
)

// The recorded root hashes: a text file on the writable partition, written
// at provisioning (checks.SealedOSTampered.recorded_hashes), one line per
// sealed layer:
//
//	# comment
//	<layer> <root-hash>
//
// <layer> is the device-mapper name of the layer's verity device (`dmsetup
// ls`), <root-hash> its root hash in hex (as `veritysetup format` prints it).
// Blank lines and lines starting with # are ignored. Any other line that is
// not two fields, a layer named twice, or a hash that is not hex makes the
// whole file invalid: it is a security record, and a partial reading could
// hide a layer.

// maxRecorded bounds the file: a few lines per layer.
const maxRecorded = 64 << 10

// maxLayers bounds the layers in the file.
const maxLayers = 64

// ParseRecorded reads a recorded-hashes file: layer name to lower-case hex.
func ParseRecorded(r io.Reader) (map[string]string, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxRecorded+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxRecorded {
		return nil, fmt.Errorf("larger than %d bytes", maxRecorded)
	}
	out := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	sc.Buffer(make([]byte, 4096), maxRecorded)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			return nil, fmt.Errorf("line %d: want \"<layer> <root-hash>\", got %d fields", n, len(f))
		}
		if !validLayerName(f[0]) {
			return nil, fmt.Errorf("line %d: %q is not a device-mapper name", n, f[0])
		}
		h, err := hostio.NormHex(f[1])
		if err != nil {
			return nil, fmt.Errorf("line %d: layer %s: %w", n, f[0], err)
		}
		if _, dup := out[f[0]]; dup {
			return nil, fmt.Errorf("line %d: layer %s is listed twice", n, f[0])
		}
		if len(out) == maxLayers {
			return nil, fmt.Errorf("line %d: more than %d layers", n, maxLayers)
		}
		out[f[0]] = h
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// validLayerName: a device-mapper name (DM_NAME_LEN 128 with its NUL), no
// slash, printable.
func validLayerName(s string) bool {
	if s == "" || len(s) >= 128 || s == "." || s == ".." {
		return false
	}
	for _, c := range s {
		if c <= ' ' || c == '/' || c > '~' {
			return false
		}
	}
	return true
}
