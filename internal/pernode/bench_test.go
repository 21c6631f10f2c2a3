// SPDX-License-Identifier: Apache-2.0

package pernode

import (
	"testing"
	"time"

	"github.com/dkc-dev/dkc/api/v1alpha1"
)

// BenchmarkCompute is one node's config with two values over a realistic KubeletConfiguration: the cost a
// pool sync pays per selected node.
func BenchmarkCompute(b *testing.B) {
	p, err := Compile(&v1alpha1.PerNode{Values: values(
		"systemReserved.memory", "string(int(quantity(node.status.capacity.memory).asApproximateFloat() / 1048576.0 / 32.0)) + 'Mi'",
		"maxPods", "node.metadata.labels['size'] == 'big' ? 250 : 110")})
	if err != nil {
		b.Fatal(err)
	}
	doc := "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n" +
		"evictionHard: {memory.available: 100Mi, nodefs.available: 10%}\nfeatureGates: {A: true, B: false}\n" +
		"eventRecordQPS: 5\nserializeImagePulls: false\ncgroupDriver: systemd\nclusterDNS: [10.96.0.10]\n"
	n := node("n1", "16Gi", "v1.34.2", map[string]string{"size": "big"})
	data := map[string]string{"kubelet": doc}
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.Compute(n, "kubelet", data, now); err != nil {
			b.Fatal(err)
		}
	}
}
