// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/kubernetes/fake"
)

// TestVersion covers the report's shape (which workloads, which counts); the installed suite runs it
// against the real cluster.
func TestVersion(t *testing.T) {
	replicas := int32(2)
	deploy := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "dkc-server", Namespace: "kube-system"},
		Spec: appsv1.DeploymentSpec{Replicas: &replicas, Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "dkc-server", Image: "r/dkc-server:v0.2.0"}}}}},
		Status: appsv1.DeploymentStatus{UpdatedReplicas: 1, ReadyReplicas: 2}}
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "dkc-sidecar", Namespace: "kube-system"},
		Spec: appsv1.DaemonSetSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "install", Image: "r/dkc-sidecar:v0.2.0"}},
			Containers:     []corev1.Container{{Name: "dkc-sidecar", Image: "r/dkc-sidecar:v0.2.0"}}}}},
		Status: appsv1.DaemonSetStatus{DesiredNumberScheduled: 3, UpdatedNumberScheduled: 3, NumberReady: 3}}
	// The template changed (generation 3) but the controller has not seen it: its counts are the old one's.
	applied := deploy.DeepCopy()
	applied.Generation, applied.Status.ObservedGeneration, applied.Status.UpdatedReplicas = 3, 2, 2
	applied.Spec.Template.Spec.Containers[0].Image = "r/dkc-server:v0.3.0"
	for _, tc := range []struct {
		name    string
		objects []runtime.Object
		args    []string
		want    []string
		notWant []string
	}{
		{"client only", nil, []string{"--client"}, []string{"kubectl-dkc: "}, []string{"deployment/", "not installed"}},
		{"installed, mid-upgrade", []runtime.Object{deploy, ds}, nil, []string{
			"deployment/dkc-server: r/dkc-server:v0.2.0 (2 desired, 1 updated, 2 ready)",
			"daemonset/dkc-sidecar: r/dkc-sidecar:v0.2.0 (3 desired, 3 updated, 3 ready)"}, []string{"not installed"}},
		{"not installed", nil, nil, []string{"dkc is not installed in namespace kube-system"}, []string{"deployment/"}},
		{"right after an apply", []runtime.Object{applied}, nil, []string{
			"deployment/dkc-server: r/dkc-server:v0.3.0 (2 desired, 0 updated, 2 ready)"}, nil},
		{"json", []runtime.Object{deploy}, []string{"-o", "json"}, []string{`"workload": "deployment/dkc-server"`, `"updated": 1`}, []string{`"sidecar"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			o := &Options{io: genericiooptions.IOStreams{Out: &out}, client: fake.NewClientset(tc.objects...), output: "table"}
			root := &cobra.Command{Use: "kubectl-dkc", PersistentPreRunE: func(*cobra.Command, []string) error { return nil }}
			root.PersistentFlags().StringVarP(&o.output, "output", "o", "table", "")
			root.AddCommand(o.versionCommand())
			root.SetArgs(append([]string{"version"}, tc.args...))
			if err := root.ExecuteContext(context.Background()); err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(out.String(), w) {
					t.Errorf("output has %q:\n%s", w, out.String())
				}
			}
		})
	}
}
