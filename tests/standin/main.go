// Command standin plays kubelet's /healthz and a CRI runtime for the
// integration tests, run as units by a namespaced systemd.
//
//	standin kubelet ADDR BROKEN_FILE   HTTP /healthz on ADDR: 200 "ok", or 500 while BROKEN_FILE exists
//	standin cri SOCKET BROKEN_FILE     CRI RuntimeService Status/Version on SOCKET; hangs while BROKEN_FILE exists
package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func broken(f string) bool { _, err := os.Stat(f); return err == nil }

type cri struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	broken string
}

func (c *cri) Status(ctx context.Context, _ *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
	if broken(c.broken) {
		<-ctx.Done() // a deadlocked runtime: the call never answers
		return nil, ctx.Err()
	}
	return &runtimeapi.StatusResponse{Status: &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
		{Type: runtimeapi.RuntimeReady, Status: true}, {Type: runtimeapi.NetworkReady, Status: false, Reason: "NetworkPluginNotReady"},
	}}}, nil
}

func (c *cri) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{Version: "0.1.0", RuntimeName: "standin", RuntimeVersion: "1", RuntimeApiVersion: "v1"}, nil
}

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: standin kubelet ADDR BROKEN_FILE | standin cri SOCKET BROKEN_FILE")
		os.Exit(2)
	}
	mode, addr, brokenFile := os.Args[1], os.Args[2], os.Args[3]
	switch mode {
	case "kubelet":
		http.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
			if broken(brokenFile) {
				http.Error(w, "[-]syncloop failed: the test broke me", http.StatusInternalServerError)
				return
			}
			fmt.Fprint(w, "ok")
		})
		srv := &http.Server{Addr: addr, ReadHeaderTimeout: 5 * time.Second}
		fmt.Println("standin kubelet listening on", addr)
		if err := srv.ListenAndServe(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	case "cri":
		os.Remove(addr)
		l, err := net.Listen("unix", addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		s := grpc.NewServer()
		runtimeapi.RegisterRuntimeServiceServer(s, &cri{broken: brokenFile})
		fmt.Println("standin cri listening on", addr)
		if err := s.Serve(l); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	default:
		fmt.Fprintln(os.Stderr, "unknown mode", mode)
		os.Exit(2)
	}
}
