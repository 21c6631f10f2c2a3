// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"strconv"
	"strings"
	"sync"

	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/payload"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/services/internal/configmaps"
	poolrecords "github.com/dkc-dev/dkc/services/internal/pool/records"
	"github.com/dkc-dev/dkc/services/internal/pool/revision"
)

// A pool's preview (its status.preview, while no completionTime is set) is sent to every node its
// selector matches, by every replica serving one: each node's state carries the first such pool's preview
// by name, with the revision's snapshot resolved and verified as an assignment of it would be. The
// snapshot is watched through the ConfigMap tracker, held under the name previewHolder(pool) for as long
// as the preview stands; a change of it, or of any pool's preview, resolves every node again (previews
// are rare, and a sync of a node whose state does not change writes nothing).

// previewHolderPrefix names the ConfigMap tracker's holder of a previewed snapshot. ':' is not allowed in
// a Node's name, so a holder is never taken for a node.
const previewHolderPrefix = "preview:"

func previewHolder(pool string) string { return previewHolderPrefix + pool }

// previews is what the controller holds of the standing previews.
type previews struct {
	mu      sync.Mutex
	tracked map[string]bool          // pools whose snapshot the tracker holds
	built   map[string]*builtPreview // by pool: the last resolution of its preview
}

// builtPreview is a pool's preview as resolved for one memo (what the result depends on); preview is nil
// when it cannot be served. One per pool: every node it selects shares the pointer, and so the encoding.
type builtPreview struct {
	memo    string
	preview *dkcv1.Preview
}

func newPreviews() *previews {
	return &previews{tracked: map[string]bool{}, built: map[string]*builtPreview{}}
}

// onPreviewChange follows a pool's preview coming, going or changing: the tracker holds exactly the
// standing previews' snapshots, and every node is resolved again.
func (c *Controller) onPreviewChange(pool string) {
	standing := map[string]poolrecords.Preview{}
	for _, p := range c.snapshots.Previews() {
		standing[p.Pool] = p
	}
	c.previews.mu.Lock()
	for name := range c.previews.tracked {
		if _, ok := standing[name]; !ok {
			c.cms.Track(previewHolder(name), "")
			delete(c.previews.tracked, name)
		}
	}
	for name := range c.previews.built {
		if _, ok := standing[name]; !ok {
			delete(c.previews.built, name)
		}
	}
	for name, p := range standing {
		if p.Recorded && c.namespaces.Allows(p.Snapshot.Namespace) {
			c.cms.Track(previewHolder(name), configmaps.Key(p.Snapshot.Namespace, p.Snapshot.Name))
			c.previews.tracked[name] = true
		} else if c.previews.tracked[name] {
			c.cms.Track(previewHolder(name), "")
			delete(c.previews.tracked, name)
		}
	}
	c.previews.mu.Unlock()
	c.log.Debug("pool preview changed; resolving every node again", zap.String("pool", pool))
	c.enqueueAll()
}

// enqueueAll resolves every cached Node again.
func (c *Controller) enqueueAll() {
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		c.log.Warn("list cached nodes failed", zap.Error(err))
		return
	}
	for _, n := range nodes {
		c.queue.Add(n.Name)
	}
}

// previewing says whether any pool's preview stands: only then can a Node's labels change its state.
func (c *Controller) previewing() bool {
	return c.snapshots != nil && len(c.snapshots.Previews()) > 0
}

// previewFor is the preview node is asked for: that of the first pool by name whose standing preview
// selects it, nil if none does or that pool's snapshot cannot be served.
func (c *Controller) previewFor(node *corev1.Node) *dkcv1.Preview {
	if c.snapshots == nil {
		return nil
	}
	for _, p := range c.snapshots.Previews() {
		if p.Selector.Matches(labels.Set(node.Labels)) {
			return c.buildPreview(p)
		}
	}
	return nil
}

// buildPreview resolves pool p's preview once per snapshot version and record: its snapshot must be the
// one the pool records, found by the tracker, and pass revision.Verify as a node's source would; it is
// then resolved (shared.resolve) and bounded (payload.CheckSize) as an assignment. Each outcome is logged
// once.
func (c *Controller) buildPreview(p poolrecords.Preview) *dkcv1.Preview {
	s := p.Snapshot
	key := configmaps.Key(s.Namespace, s.Name)
	var cm *corev1.ConfigMap
	synced := true
	if p.Recorded && c.namespaces.Allows(s.Namespace) {
		var err error
		cm, synced, err = c.cms.Get(key)
		if err != nil {
			c.log.Warn("read previewed snapshot failed", zap.String("pool", p.Pool), zap.String("configmap", key),
				zap.Error(err))
			return nil
		}
	}
	if !synced {
		return nil // the tracker calls onConfigMapChange once its first list is done
	}
	memo := p.Revision + "/" + p.RequestTime.String() + "/" + strconv.FormatBool(p.Recorded) + "/" + key + "/" +
		string(s.UID) + "/" + s.KubeletConfigKey
	if cm != nil {
		memo += "/" + string(cm.UID) + "/" + cm.ResourceVersion
	}
	c.previews.mu.Lock()
	b := c.previews.built[p.Pool]
	c.previews.mu.Unlock()
	if b != nil && b.memo == memo {
		return b.preview
	}
	pv, why := c.resolvePreview(p, cm)
	log := c.log.With(zap.String("pool", p.Pool), zap.String("revision", p.Revision),
		zap.Time("requestTime", p.RequestTime), zap.String("configmap", key))
	if pv == nil {
		log.Info("pool preview not sent: its snapshot cannot be served", zap.String("detail", why))
	} else {
		log.Info("pool preview resolved", zap.String("uid", string(cm.UID)),
			zap.String("resourceVersion", cm.ResourceVersion), zap.String("contentHash", pv.GetAssignment().GetContentHash()))
	}
	c.previews.mu.Lock()
	c.previews.built[p.Pool] = &builtPreview{memo: memo, preview: pv}
	c.previews.mu.Unlock()
	return pv
}

// resolvePreview is buildPreview's resolution; nil and why when the snapshot cannot be served.
func (c *Controller) resolvePreview(p poolrecords.Preview, cm *corev1.ConfigMap) (*dkcv1.Preview, string) {
	s := p.Snapshot
	switch {
	case !p.Recorded:
		return nil, "the pool records no snapshot of the revision"
	case !c.namespaces.Allows(s.Namespace):
		return nil, "the snapshot is outside --config-namespaces"
	case cm == nil:
		return nil, "the snapshot configmap does not exist"
	}
	rec := &v1alpha1.RevisionSnapshots{Items: []v1alpha1.RevisionSnapshot{s}}
	if err := revision.Verify(cm, p.Pool, p.Revision, s.KubeletConfigKey, rec, false); err != nil {
		return nil, err.Error()
	}
	ref := &corev1.ConfigMapNodeConfigSource{Namespace: s.Namespace, Name: s.Name, KubeletConfigKey: s.KubeletConfigKey}
	a, err := c.shared.resolve(ref, cm)
	if err != nil {
		return nil, err.Error()
	}
	if err := payload.CheckSize(a.GetFiles()); err != nil {
		return nil, err.Error()
	}
	return &dkcv1.Preview{Pool: p.Pool, Revision: p.Revision, RequestTime: timestamppb.New(p.RequestTime),
		Assignment: a}, ""
}

// previewHolderPool is the pool whose preview the tracker's holder name holds, if it is one.
func previewHolderPool(name string) (string, bool) {
	return strings.CutPrefix(name, previewHolderPrefix)
}

// logPreview says when a node is asked for another preview, or none any more.
func (c *Controller) logPreview(node string, prev, next *dkcv1.Preview) {
	switch {
	case next != nil && (prev == nil || prev != next && !samePreviewRequest(prev, next)):
		c.log.Info("node asked to preview pool revision", zap.String("node", node), zap.String("pool", next.GetPool()),
			zap.String("revision", next.GetRevision()), zap.Time("requestTime", next.GetRequestTime().AsTime()),
			zap.String("contentHash", next.GetAssignment().GetContentHash()))
	case next == nil && prev != nil:
		c.log.Debug("node preview withdrawn", zap.String("node", node), zap.String("pool", prev.GetPool()),
			zap.String("revision", prev.GetRevision()))
	}
}

// samePreviewRequest says whether two previews answer the same request of the same pool.
func samePreviewRequest(a, b *dkcv1.Preview) bool {
	return a.GetPool() == b.GetPool() && a.GetRevision() == b.GetRevision() &&
		a.GetRequestTime().AsTime().Equal(b.GetRequestTime().AsTime())
}
