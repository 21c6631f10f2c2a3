// SPDX-License-Identifier: Apache-2.0

// Package convert translates between the dkc.v1 wire types and their core/v1 originals, which is what the
// Node API and the on-disk records (SerializedNodeConfigSource) hold.
package wire

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
)

// SourceToCore returns nil for local config (nil, or a source with no subfield).
func SourceToCore(s *dkcv1.NodeConfigSource) *corev1.NodeConfigSource {
	cm := s.GetConfigMap()
	if cm == nil {
		return nil
	}
	return &corev1.NodeConfigSource{ConfigMap: &corev1.ConfigMapNodeConfigSource{
		Namespace:        cm.GetNamespace(),
		Name:             cm.GetName(),
		UID:              types.UID(cm.GetUid()),
		ResourceVersion:  cm.GetResourceVersion(),
		KubeletConfigKey: cm.GetKubeletConfigKey(),
	}}
}

// SourceFromCore returns nil for local config.
func SourceFromCore(s *corev1.NodeConfigSource) *dkcv1.NodeConfigSource {
	if s == nil || s.ConfigMap == nil {
		return nil
	}
	cm := s.ConfigMap
	return &dkcv1.NodeConfigSource{ConfigMap: &dkcv1.ConfigMapNodeConfigSource{
		Namespace:        cm.Namespace,
		Name:             cm.Name,
		Uid:              string(cm.UID),
		ResourceVersion:  cm.ResourceVersion,
		KubeletConfigKey: cm.KubeletConfigKey,
	}}
}

// StatusToCore converts a reported status; the result is never nil (the original always wrote an object).
func StatusToCore(s *dkcv1.NodeConfigStatus) *corev1.NodeConfigStatus {
	return &corev1.NodeConfigStatus{
		Assigned:      SourceToCore(s.GetAssigned()),
		Active:        SourceToCore(s.GetActive()),
		LastKnownGood: SourceToCore(s.GetLastKnownGood()),
		Error:         s.GetError(),
	}
}

// StatusFromCore is the inverse of StatusToCore.
func StatusFromCore(s *corev1.NodeConfigStatus) *dkcv1.NodeConfigStatus {
	if s == nil {
		return &dkcv1.NodeConfigStatus{}
	}
	return &dkcv1.NodeConfigStatus{
		Assigned:      SourceFromCore(s.Assigned),
		Active:        SourceFromCore(s.Active),
		LastKnownGood: SourceFromCore(s.LastKnownGood),
		Error:         s.Error,
	}
}

// SameSource is nodeconfig.SameSource on the wire: nil, and a source without a subfield, are the local config.
func SameSource(a, b *dkcv1.NodeConfigSource) bool {
	x, y := a.GetConfigMap(), b.GetConfigMap()
	if x == nil || y == nil {
		return x == nil && y == nil
	}
	return x.GetNamespace() == y.GetNamespace() && x.GetName() == y.GetName() && x.GetUid() == y.GetUid() &&
		x.GetResourceVersion() == y.GetResourceVersion() && x.GetKubeletConfigKey() == y.GetKubeletConfigKey()
}
