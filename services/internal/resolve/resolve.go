// SPDX-License-Identifier: Apache-2.0

// Package resolve is where a Node's config source is read and resolved (docs/design.md, "Where a Node's config source
// is read"): spec.configSource where the apiserver kept it, else the dkc.dev/config-source annotation, validated with
// the apiserver's own rules and messages, then resolved against the referenced ConfigMap to a fully resolved Assignment
// (UID + ResourceVersion + every data file + content hash).
package resolve

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/payload"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
)

// Origin says where a Node's source was read from.
type Origin string

const (
	OriginNone       Origin = ""
	OriginSpec       Origin = "spec"
	OriginAnnotation Origin = "annotation"
)

// SourceError is a Node source that cannot be used. Status is the node's status error text; Detail, when
// set, is what the log says beyond it (the status text of some kinds points to the log).
type SourceError struct {
	Status nodeconfig.StatusError
	Detail string
}

func (e *SourceError) Error() string { return string(e.Status) }

// Unwrap lets errors.Is find the status error (e.g. nodeconfig.NamespaceNotAllowedError).
func (e *SourceError) Unwrap() error { return e.Status }

// Namespaces is the set of namespaces dkc-server reads configs from (--config-namespaces).
type Namespaces struct{ list []string }

// NewNamespaces returns the set of the given namespaces.
func NewNamespaces(namespaces ...string) Namespaces {
	list := slices.Clone(namespaces)
	slices.Sort(list)
	return Namespaces{list: slices.Compact(list)}
}

// Allows says whether ns is in the set.
func (n Namespaces) Allows(ns string) bool {
	_, found := slices.BinarySearch(n.list, ns)
	return found
}

// List returns the namespaces, sorted.
func (n Namespaces) List() []string { return slices.Clone(n.list) }

func (n Namespaces) String() string { return strings.Join(n.list, ",") }

// Check refuses a validated source whose ConfigMap lies outside the set, with nodeconfig.NamespaceNotAllowedError.
func (n Namespaces) Check(src *corev1.NodeConfigSource) error {
	if src == nil || src.ConfigMap == nil || n.Allows(src.ConfigMap.Namespace) {
		return nil
	}
	return &SourceError{
		Status: nodeconfig.NamespaceNotAllowedError,
		Detail: fmt.Sprintf("configmap %s/%s is in namespace %q; dkc-server reads configs only from %s (--config-namespaces)",
			src.ConfigMap.Namespace, src.ConfigMap.Name, src.ConfigMap.Namespace, n),
	}
}

// NodeSource returns the Node's config source and where it came from; nil means the node's local config.
// A source that is present but unusable — malformed, or in a namespace outside allowed — returns a
// *SourceError whose Status the node's status must show; the node then keeps what it has.
func NodeSource(node *corev1.Node, allowed Namespaces) (*corev1.NodeConfigSource, Origin, error) {
	src, origin, err := nodeSource(node)
	if err != nil || src == nil {
		return src, origin, err
	}
	return src, origin, allowed.Check(src)
}

func nodeSource(node *corev1.Node) (*corev1.NodeConfigSource, Origin, error) {
	if node.Spec.ConfigSource != nil {
		src := node.Spec.ConfigSource.DeepCopy() // never hand out a pointer into an informer's cache
		return src, OriginSpec, Validate(src, field.NewPath("spec", "configSource"))
	}
	raw, ok := node.Annotations[nodeconfig.SourceAnnotation]
	if !ok {
		return nil, OriginNone, nil
	}
	path := field.NewPath("metadata", "annotations").Key(nodeconfig.SourceAnnotation)
	src, err := ParseAnnotation(raw, path)
	if err != nil {
		return nil, OriginAnnotation, err
	}
	return src, OriginAnnotation, Validate(src, path)
}

// ParseAnnotation decodes the annotation's JSON. Unknown fields are ignored, as the kubelet ignored source
// types newer than itself: they end as "all subfields nil" in Validate.
func ParseAnnotation(raw string, path *field.Path) (*corev1.NodeConfigSource, error) {
	var src corev1.NodeConfigSource
	if err := json.Unmarshal([]byte(raw), &src); err != nil {
		shown := raw
		if len(shown) > 256 {
			shown = shown[:256] + "..."
		}
		return nil, &SourceError{Status: nodeconfig.StatusError(nodeconfig.SyncErrorPrefix + nodeconfig.InvalidSourcePrefix +
			field.Invalid(path, shown, "not the JSON of a NodeConfigSource: "+err.Error()).Error())}
	}
	return &src, nil
}

// Validate applies the apiserver's validation of Node.Spec.ConfigSource (validateNodeConfigSourceSpec in
// pkg/apis/core/validation) with its messages, e.g.
// "spec.configSource.configMap.namespace: Required value: namespace must be set".
func Validate(src *corev1.NodeConfigSource, path *field.Path) error {
	if src.ConfigMap == nil {
		// The kubelet's wording for a source with no subfield it knows (the apiserver's would be "exactly one
		// reference subfield must be non-nil"); the seeds document this one in the status table.
		return &SourceError{Status: nodeconfig.AllNilSubfieldsError}
	}
	errs := nodeconfig.ValidateSpec(src, path)
	if len(errs) == 0 {
		return nil
	}
	return &SourceError{Status: nodeconfig.StatusError(nodeconfig.SyncErrorPrefix + nodeconfig.InvalidSourcePrefix +
		errs.ToAggregate().Error())}
}

// Assignment resolves a validated ConfigMap source against the ConfigMap it names: the result carries the
// ConfigMap's UID and ResourceVersion, all of its data (binaryData is ignored, as the original did) and the
// content hash. The kubelet config key need not exist in the data: as in the original, the node then fails
// to load the config and falls back to its last-known-good.
func Assignment(ref *corev1.ConfigMapNodeConfigSource, cm *corev1.ConfigMap) (*dkcv1.Assignment, error) {
	if cm.UID == "" || cm.ResourceVersion == "" {
		return nil, fmt.Errorf("configmap %s/%s has no UID or ResourceVersion", cm.Namespace, cm.Name)
	}
	src := &dkcv1.ConfigMapNodeConfigSource{
		Namespace:        ref.Namespace,
		Name:             ref.Name,
		Uid:              string(cm.UID),
		ResourceVersion:  cm.ResourceVersion,
		KubeletConfigKey: ref.KubeletConfigKey,
	}
	files := make(map[string]string, len(cm.Data))
	for k, v := range cm.Data {
		files[k] = v
	}
	return &dkcv1.Assignment{
		Source:      &dkcv1.NodeConfigSource{ConfigMap: src},
		Files:       files,
		ContentHash: payload.Hash(src, files),
	}, nil
}

// Local is the assignment "use the node's local config".
func Local() *dkcv1.Assignment { return &dkcv1.Assignment{} }
