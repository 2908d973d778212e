package checks

import (
	"context"
	"encoding/binary"
	"net"
	"net/http"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// criServer is a CRI runtime service on grpc-go's own server: the probe's
// hand-made gRPC call is checked against the real protocol implementation.
type criServer struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	status func(ctx context.Context) (*runtimeapi.StatusResponse, error)
}

func (s *criServer) Status(ctx context.Context, _ *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
	return s.status(ctx)
}

func serveCRI(t *testing.T, status func(ctx context.Context) (*runtimeapi.StatusResponse, error)) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "cri.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(s, &criServer{status: status})
	go s.Serve(ln)
	t.Cleanup(s.Stop)
	return sock
}

// criStatus is one probe on a connection of its own.
func criStatus(ctx context.Context, socket string) error {
	c := newCRIClient(socket)
	defer c.close()
	return c.status(ctx)
}

func conditions(c ...*runtimeapi.RuntimeCondition) *runtimeapi.StatusResponse {
	return &runtimeapi.StatusResponse{Status: &runtimeapi.RuntimeStatus{Conditions: c},
		Info: map[string]string{"config": `{"containerd": {"snapshotter": "overlayfs"}}`}}
}

func TestCRIStatusAgainstGRPCServer(t *testing.T) {
	ready := &runtimeapi.RuntimeCondition{Type: runtimeapi.RuntimeReady, Status: true}
	netDown := &runtimeapi.RuntimeCondition{Type: runtimeapi.NetworkReady, Status: false, Reason: "NetworkPluginNotReady", Message: "cni plugin not initialized"}
	for _, tc := range []struct {
		name   string
		status func(ctx context.Context) (*runtimeapi.StatusResponse, error)
		want   string // "" = healthy; else a substring of the error
	}{
		{"ready, network not ready (before the CNI)", func(context.Context) (*runtimeapi.StatusResponse, error) {
			return conditions(ready, netDown), nil
		}, ""},
		{"runtime not ready", func(context.Context) (*runtimeapi.StatusResponse, error) {
			return conditions(&runtimeapi.RuntimeCondition{Type: runtimeapi.RuntimeReady, Status: false, Reason: "ShimDown", Message: "shim gone"}, netDown), nil
		}, "RuntimeReady is false: ShimDown shim gone"},
		{"no RuntimeReady condition (kubelet: not ready)", func(context.Context) (*runtimeapi.StatusResponse, error) {
			return conditions(netDown), nil
		}, "no RuntimeReady condition in the answer"},
		{"gRPC error status", func(context.Context) (*runtimeapi.StatusResponse, error) {
			return nil, status.Error(codes.Unavailable, "server is shutting down: 100% done")
		}, "rpc error: code = Unavailable desc = server is shutting down: 100% done"},
		{"hangs", func(ctx context.Context) (*runtimeapi.StatusResponse, error) {
			<-ctx.Done() // the grpc-timeout the probe sends ends it on the server too
			return nil, ctx.Err()
		}, "code = DeadlineExceeded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := serveCRI(t, tc.status)
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			err := criStatus(ctx, sock)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("healthy runtime: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			case err != nil && !strings.HasPrefix(err.Error(), "CRI RuntimeService/Status on "+sock+": "):
				t.Errorf("error %q does not name the call and socket", err)
			}
		})
	}
}

func TestCRIStatusNoServer(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "absent.sock")
	err := criStatus(context.Background(), sock)
	if err == nil || !strings.Contains(err.Error(), "code = Unavailable") || !strings.Contains(err.Error(), "no such file or directory") {
		t.Fatalf("error %v", err)
	}
}

// Something on the socket that is not a gRPC server (an HTTP/1 server) is a
// failed probe with an error, not a hang or a crash.
func TestCRIStatusNotGRPC(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "http.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("hello")) })}
	go srv.Serve(ln)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := criStatus(ctx, sock); err == nil || !strings.Contains(err.Error(), "rpc error: code = ") {
		t.Fatalf("error %v", err)
	}
}

func frame(msg []byte) []byte {
	b := make([]byte, 5, 5+len(msg))
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	return append(b, msg...)
}

func TestParseCRIStatusRejects(t *testing.T) {
	ok := http.Header{"Grpc-Status": {"0"}}
	msg, _ := proto.Marshal(conditions(&runtimeapi.RuntimeCondition{Type: runtimeapi.RuntimeReady, Status: true}))
	for _, tc := range []struct {
		name          string
		code          int
		header, trail http.Header
		body          []byte
		want          string
	}{
		{"HTTP 503", 503, nil, nil, nil, "code = Unavailable"},
		{"HTTP 404", 404, nil, nil, nil, "code = Unknown"},
		{"no trailers", 200, nil, nil, frame(msg), "without sending trailers"},
		{"trailers-only error", 200, http.Header{"Grpc-Status": {"12"}, "Grpc-Message": {"unknown service runtime.v1.RuntimeService"}}, nil, nil, "code = Unimplemented desc = unknown service"},
		{"status out of range", 200, nil, http.Header{"Grpc-Status": {"99"}}, frame(msg), "code = Code(99)"},
		{"malformed status", 200, nil, http.Header{"Grpc-Status": {"x"}}, frame(msg), "malformed grpc-status"},
		{"no message", 200, nil, ok, nil, "has no message"},
		{"compressed", 200, nil, ok, append([]byte{1}, frame(msg)[1:]...), "compressed"},
		{"short frame", 200, nil, ok, frame(msg)[:len(msg)], "frame says"},
		{"bad protobuf", 200, nil, ok, frame([]byte{0x0a, 0x05, 0x0a}), "parsing StatusResponse"},
		{"too large", 200, nil, ok, make([]byte, criMaxResponse+1), "larger than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseCRIStatus(tc.code, tc.header, tc.trail, tc.body)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// FuzzCRIStatus: any response body is an error or conditions, never a panic;
// a StatusResponse marshalled by the CRI API's generated code parses to its
// conditions.
func FuzzCRIStatus(f *testing.F) {
	for _, r := range []*runtimeapi.StatusResponse{
		conditions(),
		conditions(&runtimeapi.RuntimeCondition{Type: runtimeapi.RuntimeReady, Status: true},
			&runtimeapi.RuntimeCondition{Type: runtimeapi.NetworkReady, Status: false, Reason: "NetworkPluginNotReady", Message: "cni"}),
		{},
	} {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x0a, 0x80})
	trailer := http.Header{"Grpc-Status": {"0"}}
	f.Fuzz(func(t *testing.T, msg []byte) {
		got, err := parseCRIStatus(http.StatusOK, nil, trailer, frame(msg))
		var want runtimeapi.StatusResponse
		if proto.Unmarshal(msg, &want) != nil {
			return // what the generated code refuses, ours may read or refuse
		}
		if err != nil {
			t.Fatalf("generated code parses %x, ours: %v", msg, err)
		}
		var wantConds []criCondition
		for _, c := range want.GetStatus().GetConditions() {
			wantConds = append(wantConds, criCondition{c.GetType(), c.GetStatus(), c.GetReason(), c.GetMessage()})
		}
		if !reflect.DeepEqual(got, wantConds) {
			t.Fatalf("%x: got %+v, generated code %+v", msg, got, wantConds)
		}
	})
}

// A runtime that answers with a response body without end (an HTTP/2
// stream that never closes) is read up to criMaxResponse and refused, well
// before the call's deadline; one that answers its headers and then never
// its body is ended by the deadline.
func TestCRIStatusEndlessOrStalledAnswer(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		endless    bool
	}{
		{"endless", "response larger than 1048576 bytes", true},
		{"stalled", "code = DeadlineExceeded", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "cri.sock")
			ln, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			stop := make(chan struct{})
			var protocols http.Protocols
			protocols.SetUnencryptedHTTP2(true)
			srv := &http.Server{Protocols: &protocols, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/grpc")
				w.WriteHeader(http.StatusOK)
				w.(http.Flusher).Flush()
				chunk := make([]byte, 64<<10)
				for tc.endless {
					if _, err := w.Write(chunk); err != nil {
						return
					}
				}
				select {
				case <-stop:
				case <-r.Context().Done():
				}
			})}
			go srv.Serve(ln)
			defer srv.Close()
			defer close(stop)
			const deadline = 2 * time.Second
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			start := time.Now()
			err = criStatus(ctx, sock)
			took := time.Since(start)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v; want %q", err, tc.want)
			}
			if tc.endless && took >= deadline {
				t.Errorf("an endless answer took %s; want it refused at the bound, before the deadline", took)
			}
			if !tc.endless && took > 2*deadline {
				t.Errorf("a stalled answer held the call %s; want about its deadline %s", took, deadline)
			}
		})
	}
}

// containerd serves its socket before its CRI plugin has initialised, and
// until then Status fails with Unknown "server is not initialized yet"
// (seen 187 ms after a real containerd went active). Within the cooldown
// of its last start that is containerd starting: Unknown (NoData), not a
// failure set and cleared at each boot. Past the cooldown it is a
// failure, and containerd is restarted, as for any other.
func TestContainerdStartingIsNotUnhealthy(t *testing.T) {
	sock := serveCRI(t, func(context.Context) (*runtimeapi.StatusResponse, error) {
		return nil, status.Error(codes.Unknown, "server is not initialized yet")
	})
	for _, tc := range []struct {
		name         string
		started      time.Duration // ago
		want         report.Status
		wantRestarts int
	}{
		{"started 10s ago", 10 * time.Second, report.StatusUnknown, 0},
		{"started 10m ago", 10 * time.Minute, report.StatusTrue, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := running("containerd.service")
			u.MainStart = time.Now().Add(-tc.started)
			m := newFakeManager(u)
			env := testEnv(t, func(c *config.Config) { c.Checks.ContainerRuntimeUnhealthy.Socket = sock })
			env.Systemd, env.Repair = m, NewRepairer(m, quietLog(), time.Now, nil)
			c, _ := newContainerdCheck(env)
			defer c.(*containerdCheck).Close()
			r, err := c.Probe(context.Background())
			env.Repair.Wait()
			if err != nil || r.Status != tc.want {
				t.Fatalf("%+v %v, want %s", r, err, tc.want)
			}
			if tc.want == report.StatusUnknown && (r.Reason != report.ReasonNoData || !strings.HasPrefix(r.Message, "containerd.service is starting: its CRI plugin has not initialised yet (CRI RuntimeService/Status on ")) {
				t.Errorf("starting: %s %q", r.Reason, r.Message)
			}
			if n := m.restartCount(); n != tc.wantRestarts {
				t.Errorf("%d restarts, want %d", n, tc.wantRestarts)
			}
		})
	}
	// Any other failure within the cooldown is still a failure.
	other := serveCRI(t, func(context.Context) (*runtimeapi.StatusResponse, error) {
		return nil, status.Error(codes.Unknown, "failed to get status: boom")
	})
	u := running("containerd.service")
	u.MainStart = time.Now().Add(-10 * time.Second)
	m := newFakeManager(u)
	env := testEnv(t, func(c *config.Config) { c.Checks.ContainerRuntimeUnhealthy.Socket = other })
	env.Systemd, env.Repair = m, NewRepairer(m, quietLog(), time.Now, nil)
	c, _ := newContainerdCheck(env)
	defer c.(*containerdCheck).Close()
	if r, _ := c.Probe(context.Background()); r.Status != report.StatusTrue {
		t.Errorf("another failure within the cooldown: %+v, want True", r)
	}
}
