//go:build profile

package main

import (
	"os"
	"runtime"
	"runtime/pprof"
)

// A binary built with -tags profile writes a CPU profile of `run` to the file
// named by AUTOPILOT_HEALTH_CPUPROFILE, from start to a clean stop (SIGTERM),
// and a profile of the heap live at that stop, every allocation sampled, to
// the file named by AUTOPILOT_HEALTH_HEAPPROFILE. The shipped binary has no
// such code: see README, Cost.
func init() {
	var stops []func()
	stopProfile = func() {
		for _, stop := range stops {
			stop()
		}
	}
	if path := os.Getenv("AUTOPILOT_HEALTH_HEAPPROFILE"); path != "" {
		runtime.MemProfileRate = 1
		stops = append(stops, func() {
			f, err := os.Create(path)
			if err != nil {
				panic(err)
			}
			runtime.GC()
			if err := pprof.WriteHeapProfile(f); err != nil {
				panic(err)
			}
			f.Close()
		})
	}
	path := os.Getenv("AUTOPILOT_HEALTH_CPUPROFILE")
	if path == "" {
		return
	}
	f, err := os.Create(path)
	if err != nil {
		panic(err)
	}
	// 1 kHz, not pprof's 100 Hz: an idle daemon runs for a few ms a minute.
	// (StartCPUProfile then warns that the rate is already set.)
	runtime.SetCPUProfileRate(1000)
	if err := pprof.StartCPUProfile(f); err != nil {
		panic(err)
	}
	stops = append(stops, func() { pprof.StopCPUProfile(); f.Close() })
}
