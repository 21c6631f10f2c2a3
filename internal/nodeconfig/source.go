// SPDX-License-Identifier: Apache-2.0

package nodeconfig

import (
	corev1 "k8s.io/api/core/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// SameSource reports whether two sources name the same config. nil, and a source without a subfield, are
// the node's local config.
func SameSource(x, y *corev1.NodeConfigSource) bool {
	if x == nil || x.ConfigMap == nil || y == nil || y.ConfigMap == nil {
		return (x == nil || x.ConfigMap == nil) && (y == nil || y.ConfigMap == nil)
	}
	// Every field is a string: plain equality is what apimachinery's semantic DeepEqual would decide, without
	// its reflection (every simulated node asks this several times a second; should a field ever be added
	// that == cannot compare, this stops compiling).
	return *x.ConfigMap == *y.ConfigMap
}

// ValidateSpec returns the apiserver's field errors for a NodeConfigSource in a spec.
func ValidateSpec(src *corev1.NodeConfigSource, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	count := 0
	if src.ConfigMap != nil {
		count++
		errs = append(errs, validateConfigMapSpec(src.ConfigMap, path.Child("configMap"))...)
	}
	if count != 1 {
		errs = append(errs, field.Invalid(path, src, "exactly one reference subfield must be non-nil"))
	}
	return errs
}

func validateConfigMapSpec(cm *corev1.ConfigMapNodeConfigSource, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	// uid and resourceVersion are the result of resolution, never an input.
	if cm.UID != "" {
		errs = append(errs, field.Forbidden(path.Child("uid"), "uid must not be set in spec"))
	}
	if cm.ResourceVersion != "" {
		errs = append(errs, field.Forbidden(path.Child("resourceVersion"), "resourceVersion must not be set in spec"))
	}
	if cm.Namespace == "" {
		errs = append(errs, field.Required(path.Child("namespace"), "namespace must be set"))
	} else {
		for _, msg := range apivalidation.ValidateNamespaceName(cm.Namespace, false) {
			errs = append(errs, field.Invalid(path.Child("namespace"), cm.Namespace, msg))
		}
	}
	if cm.Name == "" {
		errs = append(errs, field.Required(path.Child("name"), "name must be set"))
	} else {
		for _, msg := range apivalidation.NameIsDNSSubdomain(cm.Name, false) {
			errs = append(errs, field.Invalid(path.Child("name"), cm.Name, msg))
		}
	}
	if cm.KubeletConfigKey == "" {
		errs = append(errs, field.Required(path.Child("kubeletConfigKey"), "kubeletConfigKey must be set"))
	} else {
		for _, msg := range validation.IsConfigMapKey(cm.KubeletConfigKey) {
			errs = append(errs, field.Invalid(path.Child("kubeletConfigKey"), cm.KubeletConfigKey, msg))
		}
	}
	return errs
}
