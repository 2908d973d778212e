package main

import (
	"os"
	"runtime"
)

// limitProcs runs the daemon on one P (runtime.GOMAXPROCS(1)) unless the
// environment sets GOMAXPROCS. An idle daemon's CPU is mostly the wake-ups
// of its threads: with more Ps, each timer or probe that readies a goroutine
// wakes another thread to run it. One P halves the context switches of an
// idle daemon and costs a kernel-log flood nothing (README, Cost). It
// returns the GOMAXPROCS in effect.
func limitProcs() int {
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1)
	}
	return runtime.GOMAXPROCS(0)
}
