// Command guest is the /init of the VM tier's initramfs (see
// tests/vm/scenarios).
package main

import "github.com/syself/autopilot-health/tests/vm/scenarios"

func main() { scenarios.Main() }
