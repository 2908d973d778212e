package kmsg

import (
	"fmt"
	"slices"
)

// BuildRules returns the default rules without the disabled ones, with
// custom rules replacing defaults of the same name and the rest appended.
func BuildRules(disable []string, custom []Rule) ([]Rule, error) {
	for _, d := range disable {
		if !slices.ContainsFunc(DefaultRules, func(r Rule) bool { return r.Name == d }) &&
			!slices.ContainsFunc(custom, func(r Rule) bool { return r.Name == d }) {
			return nil, fmt.Errorf("unknown rule %q", d)
		}
	}
	var out []Rule
	for _, r := range DefaultRules {
		if i := slices.IndexFunc(custom, func(c Rule) bool { return c.Name == r.Name }); i >= 0 {
			r = custom[i]
		}
		if !slices.Contains(disable, r.Name) {
			out = append(out, r)
		}
	}
	for _, c := range custom {
		if !slices.ContainsFunc(DefaultRules, func(r Rule) bool { return r.Name == c.Name }) && !slices.Contains(disable, c.Name) {
			out = append(out, c)
		}
	}
	return out, nil
}
