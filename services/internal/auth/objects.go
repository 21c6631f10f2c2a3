// SPDX-License-Identifier: Apache-2.0

package auth

import (
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"
)

// NodeUIDs answers a Node's UID from the Node cache dkc-server already holds.
type NodeUIDs func(name string) (uid string, ok bool)

// InformerObjects is the Objects of a running dkc-server: the allowed ServiceAccounts (each watched alone,
// by name) and the pods of their namespaces, metadata only (name, UID and deletion are all it reads: about
// a hundred bytes a pod once stripped), and the Nodes of dkc-server's own Node cache. A namespace whose pods
// dkc-server may not watch (no Role there) never syncs, and its tokens are reviewed.
type InformerObjects struct {
	factories []metadatainformer.SharedInformerFactory
	sas       map[string]cache.GenericLister // namespace/name -> a lister of that one ServiceAccount
	pods      map[string]cache.GenericLister // namespace -> its pods
	synced    []cache.InformerSynced
	nodes     NodeUIDs
}

var (
	serviceAccountsResource = schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}
	podsResource            = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
)

// NewInformerObjects returns the Objects of the allowed ServiceAccounts ("namespace/name") and their pods,
// read through client, and of the Nodes nodes knows. Start it, then read.
func NewInformerObjects(client metadata.Interface, allowed []string, nodes NodeUIDs) *InformerObjects {
	o := &InformerObjects{sas: map[string]cache.GenericLister{}, pods: map[string]cache.GenericLister{}, nodes: nodes}
	for _, sa := range allowed {
		ns, name, ok := strings.Cut(sa, "/")
		if !ok || o.sas[sa] != nil {
			continue
		}
		f := metadatainformer.NewFilteredSharedInformerFactory(client, 0, ns, func(opts *metav1.ListOptions) {
			opts.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		})
		o.sas[sa] = o.add(f, serviceAccountsResource)
		if o.pods[ns] == nil {
			o.pods[ns] = o.add(metadatainformer.NewFilteredSharedInformerFactory(client, 0, ns, nil), podsResource)
		}
	}
	return o
}

func (o *InformerObjects) add(f metadatainformer.SharedInformerFactory,
	gvr schema.GroupVersionResource) cache.GenericLister {
	inf := f.ForResource(gvr)
	// Only the name, UID and deletion are read; a pod's managed fields and owner references are most of
	// what the apiserver sends.
	_ = inf.Informer().SetTransform(stripMetadata)
	o.factories = append(o.factories, f)
	o.synced = append(o.synced, inf.Informer().HasSynced)
	return inf.Lister()
}

func stripMetadata(obj any) (any, error) {
	if m, ok := obj.(*metav1.PartialObjectMetadata); ok {
		m.ManagedFields, m.OwnerReferences, m.Annotations, m.Labels = nil, nil, nil, nil
	}
	return obj, nil
}

// Start starts the informers until stop closes; Shutdown waits for them.
func (o *InformerObjects) Start(stop <-chan struct{}) {
	for _, f := range o.factories {
		f.Start(stop)
	}
}

// Shutdown waits for the informers Start started, once stop closed.
func (o *InformerObjects) Shutdown() {
	for _, f := range o.factories {
		f.Shutdown()
	}
}

// HasSynced says whether every informer listed once (for readiness of nothing: until then tokens are
// reviewed).
func (o *InformerObjects) HasSynced() bool {
	for _, s := range o.synced {
		if !s() {
			return false
		}
	}
	return true
}

// ServiceAccountUID implements Objects.
func (o *InformerObjects) ServiceAccountUID(namespace, name string) (string, bool) {
	l := o.sas[namespace+"/"+name]
	if l == nil {
		return "", false
	}
	return uidOf(l.ByNamespace(namespace).Get(name))
}

// PodUID implements Objects.
func (o *InformerObjects) PodUID(namespace, name string) (string, bool) {
	l := o.pods[namespace]
	if l == nil {
		return "", false
	}
	return uidOf(l.ByNamespace(namespace).Get(name))
}

// NodeUID implements Objects.
func (o *InformerObjects) NodeUID(name string) (string, bool) { return o.nodes(name) }

func uidOf(obj any, err error) (string, bool) {
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if err != nil || !ok || m.DeletionTimestamp != nil {
		return "", false
	}
	return string(m.UID), true
}
