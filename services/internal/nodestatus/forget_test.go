// SPDX-License-Identifier: Apache-2.0

package nodestatus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/poll"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/services/internal/assignment"
)

// cluster is a writer whose Node cache (an informer's store, filled by hand) and apiserver can disagree,
// as they do for a moment around every Node creation and deletion.
type cluster struct {
	t      *testing.T
	client *fake.Clientset
	cache  cache.Indexer
	table  *assignment.Table
	w      *Writer
	clk    *clocktesting.FakeClock // the writer's: its retries' backoff
	at     time.Time
	made   int // Nodes created, for their UIDs
}

func newCluster(t *testing.T) *cluster {
	c := &cluster{t: t, client: fake.NewClientset(), cache: cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{}),
		table: assignment.NewTable(nil), clk: clocktesting.NewFakeClock(fakeStart), at: fakeStart}
	c.w = New(Config{Log: zap.NewNop(), Client: c.client, Nodes: corelisters.NewNodeLister(c.cache), Table: c.table, Clock: c.clk})
	t.Cleanup(c.w.queue.ShutDown)
	return c
}

// create makes the Node exist in the apiserver and, if cached, in the cache.
func (c *cluster) create(name string, cached bool) {
	c.t.Helper()
	c.made++
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(fmt.Sprintf("%s-%d", name, c.made))}}
	if _, err := c.client.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
		c.t.Fatal(err)
	}
	if cached {
		c.cacheAdd(name)
	}
}

// cacheAdd puts the apiserver's Node into the cache (replacing what the cache had).
func (c *cluster) cacheAdd(name string) {
	c.t.Helper()
	n, err := c.client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	if err := c.cache.Add(n); err != nil {
		c.t.Fatal(err)
	}
}

// uid is the UID of the Node the apiserver has under name.
func (c *cluster) uid(name string) string {
	c.t.Helper()
	n, err := c.client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	return string(n.UID)
}

// delete removes the Node from the apiserver and the cache, and tells the writer, as the controller does.
func (c *cluster) delete(name string) {
	c.t.Helper()
	c.deleteUnheard(name)
	c.w.Enqueue(name)
}

// deleteUnheard removes the Node from the apiserver and the cache; the writer is not told (yet).
func (c *cluster) deleteUnheard(name string) {
	c.t.Helper()
	if err := c.client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		c.t.Fatal(err)
	}
	if err := c.cache.Delete(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		c.t.Fatal(err)
	}
}

func (c *cluster) report(name string) error { return c.reportAbout(name, "", "") }

// reportAbout reports a status with the error text errText about Node object uid ("": none named).
func (c *cluster) reportAbout(name, uid, errText string) error {
	c.at = c.at.Add(time.Second)
	_, err := c.w.Report(context.Background(), name, &dkcv1.ReportStatusRequest{NodeName: name,
		Status: &dkcv1.NodeConfigStatus{Error: errText}, ObservedTime: timestamppb.New(c.at), NodeUid: uid})
	return err
}

// reportRestart reports, as reportAbout, with a kubelet restart.
func (c *cluster) reportRestart(name, uid, errText string, restart *dkcv1.KubeletRestart) error {
	c.at = c.at.Add(time.Second)
	_, err := c.w.Report(context.Background(), name, &dkcv1.ReportStatusRequest{NodeName: name,
		Status: &dkcv1.NodeConfigStatus{Error: errText}, ObservedTime: timestamppb.New(c.at), NodeUid: uid, Restart: restart})
	return err
}

// drain runs the writer's queue until it is empty, retries included: the clock steps through their backoff.
func (c *cluster) drain() {
	c.t.Helper()
	poll.Stepping(c.t, "the queue to drain, retries included", c.clk, time.Second, func() bool {
		for c.w.queue.Len() > 0 {
			c.w.processNext(context.Background())
		}
		return !c.pendingRetries()
	})
}

// retriedWhileCacheLags checks that a report whose Node (object) the cache does not hold yet is kept and its
// write retried: the first retry still finds the cache behind.
func (c *cluster) retriedWhileCacheLags() {
	c.t.Helper()
	poll.Stepping(c.t, "the report of a Node (object) not cached yet to be retried", c.clk, 100*time.Millisecond,
		func() bool { return c.w.queue.Len() > 0 })
	c.w.processNext(context.Background())
	if got := c.w.Reported(); got != 1 {
		c.t.Errorf("%d reports held while the cache lags, want 1", got)
	}
}

func (c *cluster) pendingRetries() bool {
	for _, n := range []string{"a", "b"} {
		if c.w.queue.NumRequeues(n) > 0 {
			return true
		}
	}
	return false
}

// TestReportsFollowLiveNodes: the writer holds a node's report while its Node exists — also while this
// replica's cache has not caught up — and drops it once the Node is gone, whichever of the deletion and a
// late report comes first. A Node deleted and created again keeps its new report, and its status writes.
func TestReportsFollowLiveNodes(t *testing.T) {
	const syncErr = "failed to sync: failed to download config, see Kubelet log for details"
	for _, tc := range []struct {
		name string
		do   func(c *cluster) error // returns the error of the last report
		held int
		err  error
	}{
		{"reported", func(c *cluster) error {
			c.create("a", true)
			return c.report("a")
		}, 1, nil},
		{"deleted after reporting", func(c *cluster) error {
			c.create("a", true)
			err := c.report("a")
			c.delete("a")
			return err
		}, 0, nil},
		{"late report of a deleted node", func(c *cluster) error {
			c.create("a", true)
			_ = c.report("a")
			c.delete("a")
			c.drain()
			return c.report("a")
		}, 0, ErrNodeGone},
		{"late report racing the deletion", func(c *cluster) error {
			c.create("a", true)
			c.delete("a")
			return c.report("a") // before the writer's queue ran
		}, 0, ErrNodeGone},
		{"report of a node never created", func(c *cluster) error {
			return c.report("b")
		}, 0, ErrNodeGone},
		{"node not in the cache yet", func(c *cluster) error {
			c.create("a", false)
			err := c.report("a")
			c.retriedWhileCacheLags()
			c.cacheAdd("a")
			return err
		}, 1, nil},
		{"deleted and created again before the writer heard", func(c *cluster) error {
			c.create("a", true)
			_ = c.report("a")
			c.delete("a")
			c.create("a", true)
			return c.report("a")
		}, 1, nil},
		{"created again and reported before the deletion reached the writer", func(c *cluster) error {
			c.create("a", true)
			_ = c.report("a")
			c.deleteUnheard("a")
			c.create("a", true)
			err := c.report("a")
			c.w.Enqueue("a") // the controller's late news of the first Node's deletion
			return err
		}, 1, nil},
		{"created again, reported, then the cache caught up", func(c *cluster) error {
			c.create("a", true)
			_ = c.report("a")
			c.delete("a")
			c.create("a", false)
			err := c.report("a")
			c.cacheAdd("a")
			return err
		}, 1, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t)
			err := tc.do(c)
			c.drain()
			if !errors.Is(err, tc.err) {
				t.Errorf("last report: %v, want %v", err, tc.err)
			}
			if got := c.w.Reported(); got != tc.held {
				t.Fatalf("%d reports held, want %d", got, tc.held)
			}
			if tc.held == 0 {
				return
			}
			// The report held still writes: here, the service's sync error in place of the reported one.
			c.table.SetSyncError("a", assignment.Facts{}, syncErr)
			c.w.Enqueue("a")
			c.drain()
			n, err := c.client.CoreV1().Nodes().Get(context.Background(), "a", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got := annotationOf(t, n); got.Error != syncErr {
				t.Errorf("status = %s, want the sync error written", statusJSON(got))
			}
		})
	}
}

// TestReportsOfChurnedNodesDropped: 100 Nodes report and go, some with a report arriving after their
// deletion; the writer holds nothing afterwards.
func TestReportsOfChurnedNodesDropped(t *testing.T) {
	c := newCluster(t)
	for i := range 100 {
		name := fmt.Sprintf("n%d", i)
		c.create(name, true)
		if err := c.report(name); err != nil {
			t.Fatal(err)
		}
	}
	if got := c.w.Reported(); got != 100 {
		t.Fatalf("%d reports held, want 100", got)
	}
	for i := range 100 {
		name := fmt.Sprintf("n%d", i)
		c.delete(name)
		if i%10 == 0 {
			_ = c.report(name)
		}
	}
	c.drain()
	if got := c.w.Reported(); got != 0 {
		t.Errorf("%d reports held after every Node went, want 0", got)
	}
}

// TestReportsAboutADeletedNodeObjectDropped: a report names the Node object it is about; it is never written
// onto another Node registered under the same name (the deleted object's assignment would show on the new
// one), and it waits, instead of being dropped, while only the cache still holds the older object.
func TestReportsAboutADeletedNodeObjectDropped(t *testing.T) {
	const oldStatus, newStatus = "about the first object", "about the second object"
	for _, tc := range []struct {
		name string
		do   func(c *cluster) error // returns the error of the last report
		err  error
		held int
		want string // the error text on the Node in the end
	}{
		{"re-sent about the deleted object after the new one registered", func(c *cluster) error {
			c.create("a", true)
			first := c.uid("a")
			_ = c.reportAbout("a", first, oldStatus)
			c.delete("a")
			c.drain()
			c.create("a", true)
			return c.reportAbout("a", first, oldStatus)
		}, ErrOtherNode, 0, ""},
		{"re-sent about the deleted object until its restart's Event is created", func(c *cluster) error {
			c.create("a", true)
			first := c.uid("a")
			c.delete("a")
			c.drain()
			c.create("a", true)
			// The restart happened whatever object the report names: a failed Event is owed, and the report
			// is not acknowledged until it is created.
			failing := true
			c.client.PrependReactor("create", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
				if failing {
					return true, nil, apierrors.NewInternalError(errors.New("etcd unavailable"))
				}
				return false, nil, nil
			})
			restart := &dkcv1.KubeletRestart{Id: "r1", Time: timestamppb.New(c.at)}
			if err := c.reportRestart("a", first, oldStatus, restart); err == nil || errors.Is(err, ErrOtherNode) {
				c.t.Errorf("report about the deleted object whose Event failed: %v, want an error other than %v", err, ErrOtherNode)
			}
			failing = false
			err := c.reportRestart("a", first, oldStatus, restart)
			if evs, lerr := c.client.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{}); lerr != nil {
				c.t.Fatal(lerr)
			} else if len(evs.Items) != 1 {
				c.t.Errorf("%d Events after the re-sent report, want 1", len(evs.Items))
			}
			return err
		}, ErrOtherNode, 0, ""},
		{"held for the deleted object when the new one registered", func(c *cluster) error {
			c.create("a", true)
			first := c.uid("a")
			err := c.reportAbout("a", first, oldStatus)
			c.delete("a")
			c.create("a", true) // before the writer's queue ran the deletion
			return err
		}, nil, 0, ""},
		{"about the deleted object while no Node exists", func(c *cluster) error {
			c.create("a", true)
			first := c.uid("a")
			c.delete("a")
			err := c.reportAbout("a", first, oldStatus)
			c.create("a", true)
			return err
		}, ErrOtherNode, 0, ""},
		{"about the new object while the cache has the old one", func(c *cluster) error {
			c.create("a", true)
			if err := c.client.CoreV1().Nodes().Delete(context.Background(), "a", metav1.DeleteOptions{}); err != nil {
				c.t.Fatal(err)
			}
			c.create("a", false)
			err := c.reportAbout("a", c.uid("a"), newStatus)
			c.retriedWhileCacheLags()
			c.cacheAdd("a")
			return err
		}, nil, 1, newStatus},
		{"about the new object after the old one's report", func(c *cluster) error {
			c.create("a", true)
			_ = c.reportAbout("a", c.uid("a"), oldStatus)
			c.delete("a")
			c.create("a", true)
			return c.reportAbout("a", c.uid("a"), newStatus)
		}, nil, 1, newStatus},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t)
			err := tc.do(c)
			c.drain()
			if !errors.Is(err, tc.err) {
				t.Errorf("last report: %v, want %v", err, tc.err)
			}
			if got := c.w.Reported(); got != tc.held {
				t.Errorf("%d reports held, want %d", got, tc.held)
			}
			n, err := c.client.CoreV1().Nodes().Get(context.Background(), "a", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var got string
			if n.Annotations[nodeconfig.StatusAnnotation] != "" {
				got = annotationOf(t, n).Error
				if got == "" {
					got = "(written, no error)"
				}
			}
			if got != tc.want {
				t.Errorf("the Node's status error is %q, want %q", got, tc.want)
			}
		})
	}
}

// TestStatusPatchNamesItsNodeObject: the status patch carries the report's Node UID, which the apiserver
// does not let change (422, metadata.uid is immutable). With this replica's cache behind a deletion and
// re-registration, the report about the old object passes the cache's check, the apiserver refuses the
// patch, and the report is dropped instead of written onto the new Node.
func TestStatusPatchNamesItsNodeObject(t *testing.T) {
	c := newCluster(t)
	refused := 0
	c.client.PrependReactor("patch", "nodes", func(action k8stesting.Action) (bool, runtime.Object, error) {
		var p struct {
			Metadata struct {
				UID string `json:"uid"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(action.(k8stesting.PatchAction).GetPatch(), &p); err != nil {
			return true, nil, err
		}
		name := action.(k8stesting.PatchAction).GetName()
		// The tracker, not the clientset: reactors run under the clientset's lock.
		cur, err := c.client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("nodes"), "", name)
		if err != nil {
			return true, nil, err
		}
		if p.Metadata.UID != "" && p.Metadata.UID != string(cur.(*corev1.Node).UID) {
			refused++
			return true, nil, apierrors.NewInvalid(schema.GroupKind{Kind: "Node"}, name,
				field.ErrorList{field.Invalid(field.NewPath("metadata", "uid"), p.Metadata.UID, "field is immutable")})
		}
		return false, nil, nil
	})
	c.create("a", true)
	first := c.uid("a")
	// Deleted and registered again in the apiserver; the cache still has the first object.
	if err := c.client.CoreV1().Nodes().Delete(context.Background(), "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.create("a", false)
	if err := c.reportAbout("a", first, "about the first object"); !errors.Is(err, ErrOtherNode) {
		t.Errorf("report about the first object: %v, want %v", err, ErrOtherNode)
	}
	if refused != 1 {
		t.Errorf("%d patches refused, want 1", refused)
	}
	if got := c.w.Reported(); got != 0 {
		t.Errorf("%d reports held, want 0", got)
	}
	n, err := c.client.CoreV1().Nodes().Get(context.Background(), "a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a := n.Annotations[nodeconfig.StatusAnnotation]; a != "" {
		t.Errorf("the new Node got the old object's status: %s", a)
	}
	// The new object's report is written once the cache has it.
	c.cacheAdd("a")
	if err := c.reportAbout("a", c.uid("a"), "about the second object"); err != nil {
		t.Fatal(err)
	}
	if got := annotationOf(t, getNode(t, c.client, "a")).Error; got != "about the second object" {
		t.Errorf("the new Node's status error is %q, want the second object's", got)
	}
}
