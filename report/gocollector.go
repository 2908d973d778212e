package report

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// goCollector serves the go_* metrics of client_golang's default Go
// collector (collectors.NewGoCollector() of the version in go.mod): the same
// names, help, types, units and constant labels, each value from the same
// source (runtime.NumGoroutine, runtime.ThreadCreateProfile,
// debug.ReadGCStats, and runtime/metrics for the three runtime metrics it
// exposes by default and the 21 go_memstats_* values it derives from
// runtime/metrics as its memStatsFromRM does). TestGoCollectorMatchesClientGolang
// holds it to client_golang's.
//
// What it saves per scrape: client_golang's collector sends each value as a
// Metric over the registry's channel to the gathering goroutine, which
// converts it to a dto and checks it; this one reads into a preallocated
// sample slice and, for a text scrape, appends the values to text made once
// (appendText).
type goCollector struct {
	runtimeSnapshot // present: all true, every value is always read

	samples []metrics.Sample // goSample* in order
	gc      debug.GCStats
}

// The runtime/metrics samples the collector reads, in the order of
// goCollector.samples.
const (
	goSampleGOGC = iota
	goSampleMemLimit
	goSampleGOMAXPROCS
	goSampleTinyAllocs
	goSampleAllocsObjects
	goSampleFreesObjects
	goSampleAllocsBytes
	goSampleHeapObjects
	goSampleHeapGoal
	goSampleTotal
	goSampleHeapObjectsBytes
	goSampleHeapUnused
	goSampleHeapReleased
	goSampleHeapFree
	goSampleHeapStacks
	goSampleOSStacks
	goSampleMSpanInuse
	goSampleMSpanFree
	goSampleMCacheInuse
	goSampleMCacheFree
	goSampleProfBuckets
	goSampleMetaOther
	goSampleOther
	goSamples
)

var goSampleNames = [goSamples]string{
	goSampleGOGC:             "/gc/gogc:percent",
	goSampleMemLimit:         "/gc/gomemlimit:bytes",
	goSampleGOMAXPROCS:       "/sched/gomaxprocs:threads",
	goSampleTinyAllocs:       "/gc/heap/tiny/allocs:objects",
	goSampleAllocsObjects:    "/gc/heap/allocs:objects",
	goSampleFreesObjects:     "/gc/heap/frees:objects",
	goSampleAllocsBytes:      "/gc/heap/allocs:bytes",
	goSampleHeapObjects:      "/gc/heap/objects:objects",
	goSampleHeapGoal:         "/gc/heap/goal:bytes",
	goSampleTotal:            "/memory/classes/total:bytes",
	goSampleHeapObjectsBytes: "/memory/classes/heap/objects:bytes",
	goSampleHeapUnused:       "/memory/classes/heap/unused:bytes",
	goSampleHeapReleased:     "/memory/classes/heap/released:bytes",
	goSampleHeapFree:         "/memory/classes/heap/free:bytes",
	goSampleHeapStacks:       "/memory/classes/heap/stacks:bytes",
	goSampleOSStacks:         "/memory/classes/os-stacks:bytes",
	goSampleMSpanInuse:       "/memory/classes/metadata/mspan/inuse:bytes",
	goSampleMSpanFree:        "/memory/classes/metadata/mspan/free:bytes",
	goSampleMCacheInuse:      "/memory/classes/metadata/mcache/inuse:bytes",
	goSampleMCacheFree:       "/memory/classes/metadata/mcache/free:bytes",
	goSampleProfBuckets:      "/memory/classes/profiling/buckets:bytes",
	goSampleMetaOther:        "/memory/classes/metadata/other:bytes",
	goSampleOther:            "/memory/classes/other:bytes",
}

// goRuntimeMetric is one of the runtime/metrics client_golang exposes by
// default (its GoCollectorDefaultRuntimeMetrics), named as its
// RuntimeMetricsToProm names it.
type goRuntimeMetric struct {
	sample     int
	name, unit string
}

var goRuntimeMetrics = []goRuntimeMetric{
	{goSampleGOGC, "go_gc_gogc_percent", "percent"},
	{goSampleMemLimit, "go_gc_gomemlimit_bytes", "bytes"},
	{goSampleGOMAXPROCS, "go_sched_gomaxprocs_threads", "threads"},
}

// goMemStat is one of client_golang's go_memstats_* metrics, computed from
// the samples read.
type goMemStat struct {
	name, help string
	kind       valueKind
	value      func(s *[goSamples]uint64) uint64
}

// goMemStats are client_golang's goRuntimeMemStats, valued as its
// memStatsFromRM values them.
var goMemStats = []goMemStat{
	{"go_memstats_alloc_bytes", "Number of bytes allocated in heap and currently in use. Equals to /memory/classes/heap/objects:bytes.", kindGauge,
		func(s *[goSamples]uint64) uint64 { return s[goSampleHeapObjectsBytes] }},
	{"go_memstats_alloc_bytes_total", "Total number of bytes allocated in heap until now, even if released already. Equals to /gc/heap/allocs:bytes.", kindCounter,
		func(s *[goSamples]uint64) uint64 { return s[goSampleAllocsBytes] }},
	{"go_memstats_sys_bytes", "Number of bytes obtained from system. Equals to /memory/classes/total:byte.", kindGauge,
		func(s *[goSamples]uint64) uint64 { return s[goSampleTotal] }},
	{"go_memstats_mallocs_total", "Total number of heap objects allocated, both live and gc-ed. Semantically a counter version for go_memstats_heap_objects gauge. Equals to /gc/heap/allocs:objects + /gc/heap/tiny/allocs:objects.", kindCounter,
		func(s *[goSamples]uint64) uint64 { return s[goSampleAllocsObjects] + s[goSampleTinyAllocs] }},
	{"go_memstats_frees_total", "Total number of heap objects frees. Equals to /gc/heap/frees:objects + /gc/heap/tiny/allocs:objects.", kindCounter,
		func(s *[goSamples]uint64) uint64 { return s[goSampleFreesObjects] + s[goSampleTinyAllocs] }},
	{"go_memstats_heap_alloc_bytes", "Number of heap bytes allocated and currently in use, same as go_memstats_alloc_bytes. Equals to /memory/classes/heap/objects:bytes.", kindGauge,
		func(s *[goSamples]uint64) uint64 { return s[goSampleHeapObjectsBytes] }},
	{"go_memstats_heap_sys_bytes", "Number of heap bytes obtained from system. Equals to /memory/classes/heap/objects:bytes + /memory/classes/heap/unused:bytes + /memory/classes/heap/released:bytes + /memory/classes/heap/free:bytes.", kindGauge,
		func(s *[goSamples]uint64) uint64 {
			return s[goSampleHeapObjectsBytes] + s[goSampleHeapUnused] + s[goSampleHeapReleased] + s[goSampleHeapFree]
		}},
	{"go_memstats_heap_idle_bytes", "Number of heap bytes waiting to be used. Equals to /memory/classes/heap/released:bytes + /memory/classes/heap/free:bytes.", kindGauge,
		func(s *[goSamples]uint64) uint64 { return s[goSampleHeapReleased] + s[goSampleHeapFree] }},
	{"go_memstats_heap_inuse_bytes", "Number of heap bytes that are in use. Equals to /memory/classes/heap/objects:bytes + /memory/classes/heap/unused:bytes", kindGauge,
		func(s *[goSamples]uint64) uint64 { return s[goSampleHeapObjectsBytes] + s[goSampleHeapUnused] }},
	{"go_memstats_heap_released_bytes", "Number of heap bytes released to OS. Equals to /memory/classes/heap/released:bytes.", kindGauge,
		func(s *[goSamples]uint64) uint64 { return s[goSampleHeapReleased] }},
	{"go_memstats_heap_objects", "Number of currently allocated objects. Equals to /gc/heap/objects:objects.", kindGauge,
		func(s *[goSamples]uint64) uint64 { return s[goSampleHeapObjects] }},
	{"go_memstats_stack_inuse_bytes", "Number of bytes obtained from system for stack allocator in non-CGO environments. Equals to /memory/classes/heap/stacks:bytes.", kindGauge,
		func(s *[goSamples]uint64) uint64 { return s[goSampleHeapStacks] }},
	{"go_memstats_stack_sys_bytes", "Number of bytes obtained from system for stack allocator. Equals to /memory/classes/heap/stacks:bytes + /memory/classes/os-stacks:bytes.", kindGauge,
		func(s *[goSamples]uint64) uint64 { return s[goSampleHeapStacks] + s[goSampleOSStacks] }},
	{"go_memstats_mspan_inuse_bytes", "Number of bytes in use by mspan structures. Equals to /memory/classes/metadata/mspan/inuse:bytes.", kindGauge,
		func(s *[goSamples]uint64) uint64 { return s[goSampleMSpanInuse] }},
	{"go_memstats_mspan_sys_bytes", "Number of bytes used for mspan structures obtained from system. Equals to /memory/classes/metadata/mspan/inuse:bytes + /memory/classes/metadata/mspan/free:bytes.", kindGauge,
		func(s *[goSamples]uint64) uint64 { return s[goSampleMSpanInuse] + s[goSampleMSpanFree] }},
	{"go_memstats_mcache_inuse_bytes", "Number of bytes in use by mcache structures. Equals to /memory/classes/metadata/mcache/inuse:bytes.", kindGauge,
		func(s *[goSamples]uint64) uint64 { return s[goSampleMCacheInuse] }},
	{"go_memstats_mcache_sys_bytes", "Number of bytes used for mcache structures obtained from system. Equals to /memory/classes/metadata/mcache/inuse:bytes + /memory/classes/metadata/mcache/free:bytes.", kindGauge,
		func(s *[goSamples]uint64) uint64 { return s[goSampleMCacheInuse] + s[goSampleMCacheFree] }},
	{"go_memstats_buck_hash_sys_bytes", "Number of bytes used by the profiling bucket hash table. Equals to /memory/classes/profiling/buckets:bytes.", kindGauge,
		func(s *[goSamples]uint64) uint64 { return s[goSampleProfBuckets] }},
	{"go_memstats_gc_sys_bytes", "Number of bytes used for garbage collection system metadata. Equals to /memory/classes/metadata/other:bytes.", kindGauge,
		func(s *[goSamples]uint64) uint64 { return s[goSampleMetaOther] }},
	{"go_memstats_other_sys_bytes", "Number of bytes used for other system allocations. Equals to /memory/classes/other:bytes.", kindGauge,
		func(s *[goSamples]uint64) uint64 { return s[goSampleOther] }},
	{"go_memstats_next_gc_bytes", "Number of heap bytes when next garbage collection will take place. Equals to /gc/heap/goal:bytes.", kindGauge,
		func(s *[goSamples]uint64) uint64 { return s[goSampleHeapGoal] }},
}

// The values of the base families, first in goCollector.vals.
const (
	goValGoroutines = iota
	goValThreads
	goValGCDuration                                               // 7 values: a kindSummary
	goValLastGC     = goValGCDuration + len(summaryQuantiles) + 2 // after the summary
	goValInfo       = goValLastGC + 1
	goValRuntime    = goValInfo + 1 // the goRuntimeMetrics, then the goMemStats
)

func newGoCollector() *goCollector {
	c := &goCollector{samples: make([]metrics.Sample, goSamples)}
	c.take = c.read
	for i := range c.samples {
		c.samples[i].Name = goSampleNames[i]
	}
	c.gc.PauseQuantiles = make([]time.Duration, len(summaryQuantiles))
	plain := func(at int, name, help string, kind valueKind, opts ...prometheus.DescOpt) {
		desc := prometheus.V2.NewDesc(name, help, prometheus.UnconstrainedLabels(nil), nil, opts...)
		c.fams = append(c.fams, newRuntimeFamily(name, help, kind, at, desc))
	}
	plain(goValGoroutines, "go_goroutines", "Number of goroutines that currently exist.", kindGauge)
	plain(goValThreads, "go_threads", "Number of OS threads created.", kindGauge)
	plain(goValGCDuration, "go_gc_duration_seconds", "A summary of the wall-time pause (stop-the-world) duration in garbage collection cycles.", kindSummary)
	plain(goValLastGC, "go_memstats_last_gc_time_seconds", "Number of seconds since 1970 of last garbage collection.", kindGauge)
	const infoHelp = "Information about the Go environment."
	c.fams = append(c.fams, newRuntimeFamily("go_info", infoHelp, kindGauge, goValInfo,
		prometheus.NewDesc("go_info", infoHelp, nil, prometheus.Labels{"version": runtime.Version()})))
	descriptions := map[string]metrics.Description{}
	for _, d := range metrics.All() {
		descriptions[d.Name] = d
	}
	at := goValRuntime
	for _, r := range goRuntimeMetrics {
		d := descriptions[goSampleNames[r.sample]]
		kind := kindGauge
		if d.Cumulative {
			kind = kindCounter
		}
		plain(at, r.name, d.Description+" Sourced from "+d.Name+".", kind, prometheus.WithUnit(r.unit))
		at++
	}
	for _, m := range goMemStats {
		plain(at, m.name, m.help, m.kind)
		at++
	}
	c.vals = make([]float64, at)
	c.present = make([]bool, at)
	for i := range c.present {
		c.present[i] = true
	}
	return c
}

// read takes a snapshot of every value into c.vals. c.mu is held.
func (c *goCollector) read() {
	v := c.vals
	v[goValGoroutines] = float64(runtime.NumGoroutine())
	n, _ := runtime.ThreadCreateProfile(nil)
	v[goValThreads] = float64(n)
	debug.ReadGCStats(&c.gc)
	for i, q := range c.gc.PauseQuantiles {
		v[goValGCDuration+i] = q.Seconds()
	}
	v[goValGCDuration+len(summaryQuantiles)] = c.gc.PauseTotal.Seconds()
	v[goValGCDuration+len(summaryQuantiles)+1] = float64(uint64(c.gc.NumGC))
	v[goValLastGC] = float64(c.gc.LastGC.UnixNano()) / 1e9
	v[goValInfo] = 1
	metrics.Read(c.samples)
	var s [goSamples]uint64
	for i := range c.samples {
		if c.samples[i].Value.Kind() == metrics.KindUint64 {
			s[i] = c.samples[i].Value.Uint64()
		}
	}
	at := goValRuntime
	for _, r := range goRuntimeMetrics {
		switch sv := c.samples[r.sample].Value; sv.Kind() {
		case metrics.KindUint64:
			v[at] = float64(sv.Uint64())
		case metrics.KindFloat64:
			v[at] = sv.Float64()
		}
		at++
	}
	for _, m := range goMemStats {
		v[at] = float64(m.value(&s))
		at++
	}
}
