package config

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// numberKeys lists every duration and integer key of the configuration,
// dotted, with whether it is a duration.
func numberKeys(t reflect.Type, prefix string) (keys []string, isDuration map[string]bool) {
	isDuration = map[string]bool{}
	var walk func(t reflect.Type, prefix string)
	walk = func(t reflect.Type, prefix string) {
		for i := range t.NumField() {
			f := t.Field(i)
			if f.Anonymous {
				// Common: its keys are the check table's own.
				walk(f.Type, prefix)
				continue
			}
			name := f.Tag.Get("toml")
			if !f.IsExported() || name == "" {
				continue
			}
			key := prefix + name
			switch {
			case f.Type == reflect.TypeFor[Duration]():
				keys = append(keys, key)
				isDuration[key] = true
			case f.Type.Kind() == reflect.Int || f.Type.Kind() == reflect.Int64:
				keys = append(keys, key)
			case f.Type.Kind() == reflect.Struct:
				walk(f.Type, key+".")
			}
		}
	}
	walk(t, prefix)
	return keys, isDuration
}

// Every duration and integer key refuses a negative value, and zero but
// where zero means something: no spread of the first runs, no settle time
// before the tamper baseline, the drive's own temperature threshold. A key
// added later is held to the same (a negative interval, timeout or
// threshold would have the check probe without pause or answer the same
// whatever the host does).
func TestEveryNumberRefusesANegative(t *testing.T) {
	zeroMeans := map[string]bool{
		"runner.first_run_spread":                      true,
		"checks.NodeTampered.settle":                   true,
		"checks.DiskTemperatureHigh.threshold_celsius": true,
	}
	keys, isDuration := numberKeys(reflect.TypeFor[Config](), "")
	if len(keys) < 30 {
		t.Fatalf("found %d duration and integer keys, want every one (more than 30): %q", len(keys), keys)
	}
	for _, key := range keys {
		for _, v := range []int{-1, 0} {
			val := fmt.Sprint(v)
			if isDuration[key] {
				val = fmt.Sprintf("%q", val+"ns")
			}
			table, name := key[:strings.LastIndexByte(key, '.')], key[strings.LastIndexByte(key, '.')+1:]
			src := fmt.Sprintf("[%s]\n%s = %s\n", table, name, val)
			_, err := Parse("n.toml", []byte(src), Default())
			if v == 0 && zeroMeans[key] {
				if err != nil {
					t.Errorf("%s = %s: %v, want it loaded (zero means something there)", key, val, err)
				}
				continue
			}
			var ce *Error
			if !errors.As(err, &ce) {
				t.Errorf("%s = %s: loaded (%v), want it refused", key, val, err)
				continue
			}
			// A timeout longer than the interval names the timeout.
			if ce.Key != key && !(strings.HasSuffix(key, ".interval") && ce.Key == strings.TrimSuffix(key, "interval")+"timeout") {
				t.Errorf("%s = %s: refused naming %s (%v), want %s", key, val, ce.Key, err, key)
			}
		}
	}
}
