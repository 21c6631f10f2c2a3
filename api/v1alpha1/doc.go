// SPDX-License-Identifier: Apache-2.0

// Package v1alpha1 is the dkc.dev/v1alpha1 API: KubeletConfigPool, a declarative rollout of one kubelet
// config to the Nodes a selector picks (docs/design.md, "KubeletConfigPool"). The CRD in
// deploy/crds/ is generated from these types by controller-gen (`make generate`), and so is
// zz_generated.deepcopy.go: the markers below and on the types are the schema's source.
//
// The package depends on apimachinery alone (no controller-runtime), so the service, the CLI and tests can
// all link it.
//
// +kubebuilder:object:generate=true
// +groupName=dkc.dev
// +versionName=v1alpha1
package v1alpha1
