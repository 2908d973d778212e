//go:build profile

package main

import (
	"os"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"time"
)

// A binary built with -tags profile writes a CPU profile of `run` to the file
// named by AUTOPILOT_HEALTH_CPUPROFILE, from start to a clean stop (SIGTERM),
// and a profile of the heap live at that stop to the file named by
// AUTOPILOT_HEALTH_HEAPPROFILE. The heap profile samples as the runtime does
// (one allocation in 512 KiB); GODEBUG=memprofilerate=1 samples every
// allocation, from the runtime's start (setting runtime.MemProfileRate here
// would miss what the packages' initialisation allocated, and scale it
// wrongly). The shipped binary has no such code: see README, Cost.
func init() {
	var stops []func()
	stopProfile = func() {
		for _, stop := range stops {
			stop()
		}
	}
	if path := os.Getenv("AUTOPILOT_HEALTH_CPUPROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			panic(err)
		}
		// 1 kHz, not pprof's 100 Hz: an idle daemon runs for a few ms a
		// minute. (StartCPUProfile then warns that the rate is already set.)
		runtime.SetCPUProfileRate(1000)
		if err := pprof.StartCPUProfile(f); err != nil {
			panic(err)
		}
		stops = append(stops, func() { pprof.StopCPUProfile(); f.Close() })
	}
	// AUTOPILOT_HEALTH_TRACE=FILE: an execution trace (go tool trace) of
	// AUTOPILOT_HEALTH_TRACE_FOR (60s) from AUTOPILOT_HEALTH_TRACE_AFTER
	// (90s) after the start: what each wake-up of the idle daemon runs,
	// and what woke it.
	if path := os.Getenv("AUTOPILOT_HEALTH_TRACE"); path != "" {
		after, err := time.ParseDuration(envOr("AUTOPILOT_HEALTH_TRACE_AFTER", "90s"))
		if err != nil {
			panic(err)
		}
		span, err := time.ParseDuration(envOr("AUTOPILOT_HEALTH_TRACE_FOR", "60s"))
		if err != nil {
			panic(err)
		}
		time.AfterFunc(after, func() {
			f, err := os.Create(path)
			if err != nil {
				panic(err)
			}
			if err := trace.Start(f); err != nil {
				panic(err)
			}
			time.AfterFunc(span, func() { trace.Stop(); f.Close() })
		})
	}
	if path := os.Getenv("AUTOPILOT_HEALTH_HEAPPROFILE"); path != "" {
		// After the CPU profile's stop: a failure here loses only this one.
		stops = append(stops, func() {
			f, err := os.Create(path)
			if err != nil {
				panic(err)
			}
			defer f.Close()
			runtime.GC()
			if err := pprof.WriteHeapProfile(f); err != nil {
				panic(err)
			}
		})
	}
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
