package controller

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/payload"
	"github.com/dkc-dev/dkc/services/internal/pool/plan"
	"github.com/dkc-dev/dkc/services/internal/resolve"
)

// kubeletConfigAPIVersion and kubeletConfigKind are what the kubelet's config file loader accepts.
const (
	kubeletConfigAPIVersion = "kubelet.config.k8s.io/v1beta1"
	kubeletConfigKind       = "KubeletConfiguration"
)

// checkConfig says why the pool's ConfigMap cannot be rolled out, or nil. cm is nil when the ConfigMap
// does not exist.
//
// This is the part of the sidecar's check a server can make without a node: the namespace is one
// dkc-server reads (the webhook would refuse the assignment otherwise), the key exists, the payload fits
// what a node accepts (a node refuses more with "too large"), and the key holds a KubeletConfiguration
// document (what the kubelet's loader refuses as "failed to load config" before anything else). The
// kubelet's own validation (ValidateKubeletConfiguration) needs the node: its kubelet's minor, flags,
// drop-ins and feature gates (sidecar/kubeletcheck). dkc-server does not link the kubelet's code (the
// service links no sidecar code, services/cmd/dkc-server's deps test), so a config that loads but does
// not validate is refused by the first node, which fails it (ConfigRefused), and maxFailures halts the
// pool: with the default of 1, that one node is all it touches.
func checkConfig(ref v1alpha1.ConfigMapReference, allowed resolve.Namespaces, cm *corev1.ConfigMap) *plan.Invalid {
	if !allowed.Allows(ref.Namespace) {
		return &plan.Invalid{Reason: v1alpha1.ReasonNamespaceNotAllowed,
			Message: fmt.Sprintf("namespace %q is not one dkc-server reads configs from; allowed: %s (dkc-server --config-namespaces)", ref.Namespace, allowed)}
	}
	if cm == nil {
		return &plan.Invalid{Reason: v1alpha1.ReasonConfigMapNotFound, Message: fmt.Sprintf("configmap %s/%s not found", ref.Namespace, ref.Name)}
	}
	content, ok := cm.Data[ref.KubeletConfigKey]
	if !ok {
		return &plan.Invalid{Reason: v1alpha1.ReasonKeyNotFound,
			Message: fmt.Sprintf("configmap %s/%s has no key %q", ref.Namespace, ref.Name, ref.KubeletConfigKey)}
	}
	if err := payload.CheckSize(cm.Data); err != nil {
		return &plan.Invalid{Reason: v1alpha1.ReasonValidationFailed, Message: fmt.Sprintf("configmap %s/%s: %v", ref.Namespace, ref.Name, err)}
	}
	var doc struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := sigsyaml.Unmarshal([]byte(content), &doc); err != nil {
		return &plan.Invalid{Reason: v1alpha1.ReasonValidationFailed,
			Message: fmt.Sprintf("configmap %s/%s key %q is not a YAML or JSON object: %v", ref.Namespace, ref.Name, ref.KubeletConfigKey, err)}
	}
	if doc.APIVersion != kubeletConfigAPIVersion || doc.Kind != kubeletConfigKind {
		return &plan.Invalid{Reason: v1alpha1.ReasonValidationFailed,
			Message: fmt.Sprintf("configmap %s/%s key %q is apiVersion %q kind %q, not %s %s", ref.Namespace, ref.Name, ref.KubeletConfigKey,
				doc.APIVersion, doc.Kind, kubeletConfigAPIVersion, kubeletConfigKind)}
	}
	return nil
}
