package kube

import (
	"io"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/report"
)

// anotherNode is credentials of another node than node (the harness's
// node_name).
const anotherNode = "system:node:the-real-one"

// While the credentials name another node than node_name, no Event goes
// out about node_name's Node: NodeRestriction refuses the status and
// annotation writes but not Events, and the daemon posted this node's
// kernel events about the other node. They are counted as dropped
// (reason another_node), said once in the journal, and nothing waits.
// Credentials of no node (a client certificate of another user, none
// known) change nothing.
func TestNoEventsWhileTheCredentialsNameAnotherNode(t *testing.T) {
	for _, tc := range []struct {
		identity string
		sent     bool
	}{
		{anotherNode, false},
		{"system:node:" + node, true},
		{"", true},
		{"kubernetes-admin", true},
	} {
		t.Run(tc.identity, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				client := fake.NewClientset(kubeletNode())
				var logs testenv.SyncBuffer
				store := report.NewStore("b")
				h := startOpts(t, client, store, report.NewDetails(), &logs, func(o *Options) { o.Identity = tc.identity })
				<-h.r.Adopted()
				for i := range 3 {
					store.Emit(report.Event{Reason: "TaskHung", Message: "INFO: task kubelet:4242 blocked for more than 120 seconds.", Time: time.Now()})
					store.Emit(report.Event{Reason: "IOError", Message: diskError + strings.Repeat("0", i), Time: time.Now()})
					time.Sleep(time.Second)
				}
				time.Sleep(time.Minute)
				synctest.Wait()
				evs := events(t, client)
				dropped := h.m.Dropped(DropAnotherNode)
				waiting := h.m.Reporting().EventsQueued
				h.stop()
				if !tc.sent {
					if len(evs) != 0 || dropped != 6 || waiting != 0 {
						logEvents(t, evs)
						t.Errorf("credentials of another node: %d Events about node_name's Node, %v dropped (another_node), %d waiting; want none, 6, none", len(evs), dropped, waiting)
					}
					if n := strings.Count(logs.String(), "no Events are sent about it"); n != 1 {
						t.Errorf("said %d times that no Events are sent, want once:\n%s", n, logs.String())
					}
					return
				}
				if len(evs) != 4 || dropped != 0 {
					logEvents(t, evs)
					t.Errorf("credentials %q: %d Events, %v dropped (another_node); want 4, none", tc.identity, len(evs), dropped)
				}
			})
		})
	}
}

// Events an earlier run in this boot kept in the state file, not yet on
// the API server (its creates failed), are not sent by a run whose
// credentials name another node: they are counted as dropped.
func TestKeptEventsAreNotSentWhileTheCredentialsNameAnotherNode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		next := keptTaskHung(t, client)
		h := startOpts(t, client, next, report.NewDetails(), io.Discard, func(o *Options) { o.Identity = anotherNode })
		<-h.r.Adopted()
		time.Sleep(time.Minute)
		synctest.Wait()
		evs := events(t, client)
		dropped := h.m.Dropped(DropAnotherNode)
		h.stop()
		if len(evs) != 0 || dropped != 3 {
			logEvents(t, evs)
			t.Errorf("kept Events after a restart with another node's credentials: %d on the API server, %v dropped (another_node); want none, 3", len(evs), dropped)
		}
	})
}

// Events an earlier run of this boot kept in the state file under another
// node_name (changed between the runs), not yet on the API server, are not
// sent about the new name's Node: they are counted as dropped (reason
// another_node) and said once. Before, they were dropped uncounted and
// unsaid.
func TestKeptEventsOfAnEarlierNodeNameAreCountedAsDropped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		renamed := kubeletNode()
		renamed.Name = "renamed-node"
		client := fake.NewClientset(kubeletNode(), renamed)
		next := keptTaskHung(t, client)
		var logs testenv.SyncBuffer
		h := startOpts(t, client, next, report.NewDetails(), &logs, func(o *Options) { o.NodeName = renamed.Name })
		<-h.r.Adopted()
		time.Sleep(time.Minute)
		synctest.Wait()
		evs := events(t, client)
		dropped := h.m.Dropped(DropAnotherNode)
		h.stop()
		if len(evs) != 0 || dropped != 3 {
			logEvents(t, evs)
			t.Errorf("kept Events of node %s after node_name became %s: %d on the API server, %v dropped (another_node); want none, 3", node, renamed.Name, len(evs), dropped)
		}
		if n := strings.Count(logs.String(), "the Events kept in the state file are of another node_name"); n != 1 {
			t.Errorf("said %d times, want once:\n%s", n, logs.String())
		}
	})
}
