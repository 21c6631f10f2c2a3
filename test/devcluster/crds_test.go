// SPDX-License-Identifier: Apache-2.0

package devcluster

import (
	"path/filepath"
	"testing"
)

// TestCRDsAsTheDevClusterApplies: the process form installs the KubeletConfigPool CRD from deploy/crds,
// the file deploy/base includes.
func TestCRDsAsTheDevClusterApplies(t *testing.T) {
	objs, err := crdObjects(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, o := range objs {
		names = append(names, o.GetName())
	}
	if len(names) != 1 || names[0] != "kubeletconfigpools.dkc.dev" {
		t.Errorf("CRDs %v, want [kubeletconfigpools.dkc.dev]", names)
	}
}
