# autopilot-health
GO       ?= go
BIN      := bin/autopilot-health
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
LDFLAGS  := -s -w -X main.version=$(VERSION)
PKGS     := ./...

.PHONY: all build run test test-unit test-integration test-race test-arm64 bench fuzz vet docs clean k8s-bins deb sysext soak

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/autopilot-health
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w -X main.version=$(VERSION)' -o bin/autopilot-health-privileged ./cmd/autopilot-health-privileged

# One-shot check of this host with the embedded defaults (exit 1 = a problem
# was found, which is a result, not a failure of make).
run: build
	@./$(BIN) check --config /dev/null; rc=$$?; [ $$rc -le 1 ]

# The integration tiers under tests/ (real /dev/kmsg, real systemd and
# containerd, real kube-apiserver) build only with this tag; they need root.
INTEGRATION := -tags integration

# Everything: unit tests, fuzz seeds and the integration tiers (what CI runs).
test: vet k8s-bins
	$(GO) test $(INTEGRATION) -count=1 -timeout 30m $(PKGS)

# Unit tests and fuzz seeds only: what `go test ./...` runs; no root needed.
test-unit:
	$(GO) test -count=1 $(PKGS)

# The integration tiers alone.
test-integration: k8s-bins
	$(GO) test $(INTEGRATION) -count=1 -timeout 30m ./tests/...

# kube-apiserver and etcd for tests/, built from the Go module proxy by the
# separate tools module tests/tools/k8s; cached in tests/.cache/bin and
# rebuilt only when that module changes (a cold build takes 4-12 minutes).
k8s-bins:
	bash tests/tools/k8s/build.sh

# The soak and endurance scenarios in their full forms (README, "Soak"):
# kube-apiserver down for SOAK_APIDOWN, SOAK_RESTARTS SIGKILL-and-restart
# cycles, a SOAK_FLOOD-line kernel log flood (it overwrites the machine's
# whole kernel ring buffer), SOAK_HOURS simulated hours. About 13 minutes.
# make test runs the short forms (30s, 10, 50000, 3).
SOAK_APIDOWN  ?= 10m
SOAK_RESTARTS ?= 100
SOAK_FLOOD    ?= 1000000
SOAK_HOURS    ?= 24
soak: k8s-bins
	SOAK_APIDOWN=$(SOAK_APIDOWN) SOAK_RESTARTS=$(SOAK_RESTARTS) SOAK_FLOOD=$(SOAK_FLOOD) SOAK_HOURS=$(SOAK_HOURS) \
		$(GO) test $(INTEGRATION) -count=1 -timeout 60m -run '^TestSoak' -v ./tests ./internal/daemon

# make test's run with the race detector in the test binaries (the daemon
# the tiers under tests/ build and start is not instrumented). go test's
# default -timeout, 10 minutes, ends tests/ midway (it takes 14-22 minutes
# without -race); 60 minutes, as soak, for the detector's slowdown.
test-race:
	$(GO) test $(INTEGRATION) -race -count=1 -timeout 60m $(PKGS)

vet:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(INTEGRATION) $(PKGS)

bench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

# Short fuzzing of every parser (FUZZTIME per target).
FUZZTIME ?= 20s
fuzz:
	$(GO) test ./checks -run '^$$' -fuzz '^FuzzParseMountinfo$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./internal/hostio -run '^$$' -fuzz '^FuzzMountinfoReader$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./checks -run '^$$' -fuzz '^FuzzParseMetric$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./checks -run '^$$' -fuzz '^FuzzTunnelPage$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./checks -run '^$$' -fuzz '^FuzzParseJournalLine$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./checks -run '^$$' -fuzz '^FuzzJournalFile$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./checks -run '^$$' -fuzz '^FuzzCDISpec$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./checks -run '^$$' -fuzz '^FuzzCDISpecReference$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./checks -run '^$$' -fuzz '^FuzzDriverUUID$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./checks -run '^$$' -fuzz '^FuzzCRIStatus$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./report -run '^$$' -fuzz '^FuzzProcFiles$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./report -run '^$$' -fuzz '^FuzzGzipper$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./checks -run '^$$' -fuzz '^FuzzParseAuditLine$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./checks -run '^$$' -fuzz '^FuzzAuditLog$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./checks -run '^$$' -fuzz '^FuzzParseLVMReport$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./checks -run '^$$' -fuzz '^FuzzParseBtime$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./internal/config -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./tamper -run '^$$' -fuzz '^FuzzMountWatcherRead$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./kmsg -run '^$$' -fuzz '^FuzzParseRecord$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./kmsg -run '^$$' -fuzz '^FuzzParseRecordKernel$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./kmsg -run '^$$' -fuzz '^FuzzParseLine$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./kmsg -run '^$$' -fuzz '^FuzzReplay$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./kmsg -run '^$$' -fuzz '^FuzzDecodeWindow$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./tamper -run '^$$' -fuzz '^FuzzParseState$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./tamper -run '^$$' -fuzz '^FuzzParseRecorded$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./internal/hostio -run '^$$' -fuzz '^FuzzParseVerityTable$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./internal/hostio -run '^$$' -fuzz '^FuzzParseDMAnswers$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./internal/hostio -run '^$$' -fuzz '^FuzzGlobIsFilepathGlob$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./internal/systemd -run '^$$' -fuzz '^FuzzParseMessage$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./checks -run '^$$' -fuzz '^FuzzCiliumStatus$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./checks -run '^$$' -fuzz '^FuzzNVMePages$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./checks -run '^$$' -fuzz '^FuzzParseCertPEM$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./report -run '^$$' -fuzz '^FuzzLoadStateFile$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./report -run '^$$' -fuzz '^FuzzPrintable$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./report -run '^$$' -fuzz '^FuzzPrintableJSON$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./internal/privileged -run '^$$' -fuzz '^FuzzWire$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s

# Regenerate what is generated from report/catalog.go: the README's condition
# catalog and the shipped manifests under packaging/manifests.
docs:
	$(GO) test ./cmd/autopilot-health -run '^TestREADMECatalog$$' -update
	$(GO) test ./internal/manifests -run '^TestCommittedManifestsAreCurrent$$' -update

# The Debian packages for the OS image (bin/autopilot-health_<version>_<arch>.deb),
# amd64 and arm64 from the same tree; ARCH=amd64 or ARCH=arm64 builds one.
# The binary of this machine (GEN) prints the configuration and the man page
# for both. SOURCE_DATE_EPOCH defaults to the commit's time (build.sh).
DEB_ARCHES := $(if $(ARCH),$(ARCH),amd64 arm64)
deb: build
	@for a in $(DEB_ARCHES); do \
		case $$a in amd64|arm64) ;; *) echo "ARCH=$$a: amd64 or arm64" >&2; exit 2;; esac; \
		echo "CGO_ENABLED=0 GOOS=linux GOARCH=$$a $(GO) build ... -o bin/linux_$$a/autopilot-health"; \
		CGO_ENABLED=0 GOOS=linux GOARCH=$$a $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/linux_$$a/autopilot-health ./cmd/autopilot-health || exit 1; \
		CGO_ENABLED=0 GOOS=linux GOARCH=$$a $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/linux_$$a/autopilot-health-privileged ./cmd/autopilot-health-privileged || exit 1; \
		GEN=$(BIN) bash packaging/deb/build.sh bin/linux_$$a/autopilot-health bin || exit 1; \
	done

# The unit tests of the packages whose layouts differ by architecture (the
# NVMe admin command, adjtimex's struct, statfs, the kernel log records)
# built for arm64 and run under qemu-user (Debian's qemu-user-static).
# Sixteen tests of this machine's kernel cannot run there: two re-execute the
# test binary under unshare(1) and three as another user (nobody, whom the
# kernel refuses a socket, a directory or a file), which the kernel cannot
# start without a binfmt_misc entry for qemu (exit 2, or "exec format
# error"), and one re-executes it in a user namespace of
# its own (Cloneflags), which qemu-user refuses (EINVAL); one expects the kernel's answer to the NVMe
# ioctl on /dev/null (ENOTTY), and qemu-user does not pass that ioctl to the
# kernel (ENOSYS); one installs a seccomp filter on a thread, which qemu-user
# refuses (EINVAL: the filter would apply to the emulator itself); two
# open kubelet's certificate through its absolute link under a host root
# with openat2(RESOLVE_IN_ROOT), which qemu-user 7.2 does not emulate
# (ENOSYS: the check then opens the path as before, through the daemon's
# own /); six count a thread's system calls with perf_event_open(2), which
# qemu-user does not emulate (ENOSYS). All sixteen run natively in make test; the NVMe command's layout on
# arm64 is checked here by TestNVMePassthruLayout.
# The tests that start another process (a fake journalctl, sh, gzip, go list)
# skip there from the point where they would (testenv.StartsProcesses):
# qemu-user 7.2's fork of a multithreaded program now and then hangs in the
# child before its exec, so os/exec's Start never returns (golang/go#68976).
ARM64_PKGS := ./kmsg ./report ./internal/config ./checks ./internal/rawsys
ARM64_SKIP := ^(TestDiskUsageRealHostUnderReadOnlyRemount|TestRealNVMeReaderHostRoot|TestMonotonicMicrosMakesNoSystemCall|TestCertKubeletsAbsoluteSymlinkUnderHostRoot|TestCertDanglingSymlinkUnderALinkedDirectoryUnderHostRoot|TestNodeTamperedSaysWhyItCannotWatch|TestProbeReachesLocalhostWithoutALookup|TestReadPseudoFileMakesNoEpollCtl|TestPeriodicPseudoFileReadsMakeNoEpollCtl|TestPseudoFileReadsMakeNoEpollCtl|TestSocketRefusedToTheUserIsUnknown|TestDiskUsageFilesystemRefusedToTheUserIsNamed|TestGpuActivationSpecRefusedToTheUserIsUnknown|TestWriteFileAtomicSystemCalls|TestNativeJournalReadSystemCalls|TestKeptSocketDialOfAnAbsentSocketResolvesNoLinks)$$
test-arm64:
	CGO_ENABLED=0 GOARCH=arm64 AUTOPILOT_HEALTH_TEST_NO_EXEC='qemu-user 7.2 now and then hangs in fork (golang/go#68976)' \
		$(GO) test -count=1 -exec qemu-aarch64-static -skip '$(ARM64_SKIP)' $(ARM64_PKGS)

# The systemd-sysext image for image-based node OSes (bin/autopilot-health.raw).
sysext: build
	bash packaging/sysext/build.sh $(BIN) bin

clean:
	rm -rf bin
