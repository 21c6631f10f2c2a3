// SPDX-License-Identifier: Apache-2.0

package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the API's group and version.
var GroupVersion = schema.GroupVersion{Group: "dkc.dev", Version: "v1alpha1"}

// SchemeGroupVersion is GroupVersion under the name the generated clientset (api/generated) expects of an
// API package.
var SchemeGroupVersion = GroupVersion

// PoolResource is the plural resource name of KubeletConfigPools that kubectl and RBAC rules use.
const PoolResource = "kubeletconfigpools"

// Resource qualifies a resource of this API with its group: the generated listers' NotFound errors name
// it so, as the apiserver's do.
func Resource(resource string) schema.GroupResource {
	return GroupVersion.WithResource(resource).GroupResource()
}

var (
	// SchemeBuilder registers the API's types with a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds the API's types to a scheme (e.g. client-go's scheme.Scheme).
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &KubeletConfigPool{}, &KubeletConfigPoolList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
