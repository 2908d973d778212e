package scenarios

import (
	"strings"
	"testing"
)

// VMTEST_RUN names the scenarios to run; a name that is no scenario is an
// error naming it, not left out: VMTEST_RUN=hung_task,dm_verty ran
// hung_task alone and passed, the typo unseen.
func TestSelect(t *testing.T) {
	names := func(ss []Scenario) string {
		var n []string
		for _, s := range ss {
			n = append(n, s.Name)
		}
		return strings.Join(n, ",")
	}
	if got, err := Select(""); err != nil || len(got) != len(All) {
		t.Errorf(`Select(""): %d scenarios, %v; want all %d`, len(got), err, len(All))
	}
	// All's order, whatever VMTEST_RUN's.
	if got, err := Select("dm_verity,hung_task"); err != nil || names(got) != "hung_task,dm_verity" {
		t.Errorf("Select(dm_verity,hung_task) = %q, %v; want hung_task,dm_verity", names(got), err)
	}
	if got, err := Select(DeadlineProbe); err != nil || len(got) != 0 {
		t.Errorf("Select(%s) = %q, %v; want no scenario of All and no error", DeadlineProbe, names(got), err)
	}
	for only, want := range map[string]string{
		"hung_task,dm_verty":   `VMTEST_RUN=hung_task,dm_verty: no scenario named "dm_verty" (scenarios: nvme_healthy, `,
		"nvme_critical_warnin": `VMTEST_RUN=nvme_critical_warnin: no scenario named "nvme_critical_warnin"`,
		"hung_task,":           `VMTEST_RUN=hung_task,: no scenario named ""`,
	} {
		if got, err := Select(only); err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("Select(%q) = %q, %v; want an error %q...", only, names(got), err, want)
		}
	}
}
