package kube

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube/kubeapi"
)

// answerClient answers every patch of the Node with the same Node at once
// (no encoding, no I/O): what a refresh costs the daemon itself.
type answerClient struct {
	Client
	n *kubeapi.Node
}

func (c answerClient) PatchNode(context.Context, string, []byte) (*kubeapi.Node, error) {
	return c.n, nil
}

// BenchmarkWriteAnnotations is a report refresh written alone on a Node
// with room for it (the healthy path): rendering the five documents, the
// patch, and what the daemon does with the answer.
func BenchmarkWriteAnnotations(b *testing.B) {
	det := report.NewDetails()
	det.SetBootID("boot")
	var fss []map[string]any
	for i := range 8 {
		fss = append(fss, map[string]any{"mountPoint": fmt.Sprintf("/var/lib/m%d", i), "usedPercent": 12})
	}
	det.Set(report.Detail{Domain: "storage", Field: "filesystems", Value: fss})
	n := &kubeapi.Node{}
	n.Metadata.Annotations = map[string]string{"other/annotation": "keep"}
	r := New(Options{Client: answerClient{n: n}, NodeName: node, Role: report.RoleWorker, Store: report.NewStore("boot"),
		Details: det, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), HeartbeatPeriod: 5 * time.Minute, ReportInterval: 2 * time.Minute})
	ctx := context.Background()
	b.ReportAllocs()
	for range b.N {
		if err := r.writeAnnotations(ctx, false); err != nil {
			b.Fatal(err)
		}
	}
}
