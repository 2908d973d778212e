package config

import (
	"encoding"
	"reflect"
	"strings"
	"sync"

	"github.com/BurntSushi/toml"
)

// The TOML decoder matches a key to a field without regard to case
// (`[checks.diskusagehigh]` sets DiskUsageHigh; two tables that differ in
// case both land in it, the last one winning), and reports such a key as
// decoded. The daemon's keys are spelt one way: any other spelling is an
// unknown key, refused as a typo is.

// exactKeys is every key of Config as it is spelt, tables included; the
// fields of an array of tables (kmsg.rules) under the array's key.
var exactKeys = sync.OnceValue(func() map[string]bool {
	keys := map[string]bool{}
	var walk func(prefix string, t reflect.Type)
	walk = func(prefix string, t reflect.Type) {
		for i := range t.NumField() {
			f := t.Field(i)
			if f.Anonymous && f.Tag.Get("toml") == "" {
				walk(prefix, f.Type)
				continue
			}
			name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
			if name == "" || name == "-" || !f.IsExported() {
				continue
			}
			key := prefix + name
			keys[key] = true
			ft := f.Type
			if ft.Kind() == reflect.Slice {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct && !reflect.PointerTo(ft).Implements(reflect.TypeFor[encoding.TextUnmarshaler]()) {
				walk(key+".", ft)
			}
		}
	}
	walk("", reflect.TypeFor[Config]())
	return keys
})

// misspeltKey is the first key in keys (as the file spells them) that is
// not a key of Config as it is spelt, or "". It is written as the decoder
// writes a key (toml.Key's String, as keyLines indexes it): a part that is
// not a bare key quoted.
func misspeltKey(keys []toml.Key) string {
	for _, k := range keys {
		if !exactKeys()[strings.Join(k, ".")] {
			return k.String()
		}
	}
	return ""
}
