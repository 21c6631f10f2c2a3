// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"bytes"
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// baseTemplate is deploy/base's sidecar pod template: the patch is tested on what users install.
func baseTemplate(t *testing.T) corev1.PodTemplateSpec {
	t.Helper()
	raw, err := os.ReadFile("../../deploy/base/sidecar.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(raw, &ds); err != nil {
		t.Fatal(err)
	}
	return ds.Spec.Template
}

func container(t *testing.T, tpl *corev1.PodTemplateSpec) *corev1.Container {
	t.Helper()
	for i := range tpl.Spec.Containers {
		if tpl.Spec.Containers[i].Name == sidecarContainer {
			return &tpl.Spec.Containers[i]
		}
	}
	t.Fatalf("no container %s", sidecarContainer)
	return nil
}

func TestToCleanupMode(t *testing.T) {
	const baseDropIn = "/etc/systemd/system/kubelet.service.d/20-dkc.conf"
	for _, tc := range []struct {
		name       string
		change     func(*corev1.PodTemplateSpec)
		wantDropIn string
		wantVolume string // the volume mounted at the drop-in's directory
		wantHost   string // its hostPath
		wantErr    string
	}{
		{name: "deploy/base", wantDropIn: baseDropIn, wantVolume: "kubelet-dropins", wantHost: "/etc/systemd/system/kubelet.service.d"},
		{name: "a drop-in installed elsewhere, from a volume of another name", change: func(tpl *corev1.PodTemplateSpec) {
			ic := &tpl.Spec.InitContainers[0]
			for i, a := range ic.Args {
				if strings.HasPrefix(a, "--install-kubelet-dropin=") {
					ic.Args[i] = "--install-kubelet-dropin=/run/systemd/system/kubelet.service.d/50-dkc.conf"
				}
			}
			ic.VolumeMounts[0] = corev1.VolumeMount{Name: "units", MountPath: "/run/systemd/system/kubelet.service.d"}
			tpl.Spec.Volumes = append(tpl.Spec.Volumes, corev1.Volume{Name: "units", VolumeSource: corev1.VolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: "/run/systemd/system/kubelet.service.d"}}})
		}, wantDropIn: "/run/systemd/system/kubelet.service.d/50-dkc.conf", wantVolume: "units", wantHost: "/run/systemd/system/kubelet.service.d"},
		{name: "no init container nor volume: the default path, a volume added", change: func(tpl *corev1.PodTemplateSpec) {
			tpl.Spec.InitContainers = nil
			tpl.Spec.Volumes = slices.DeleteFunc(tpl.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == "kubelet-dropins" })
		}, wantDropIn: baseDropIn, wantVolume: "kubelet-dropins", wantHost: "/etc/systemd/system/kubelet.service.d"},
		{name: "no sidecar container", change: func(tpl *corev1.PodTemplateSpec) { tpl.Spec.Containers[0].Name = "other" }, wantErr: `no container "dkc-sidecar"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tpl := baseTemplate(t)
			if tc.change != nil {
				tc.change(&tpl)
			}
			before := *tpl.DeepCopy()
			changed, err := toCleanupMode(&tpl)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("toCleanupMode: %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !changed {
				t.Fatalf("toCleanupMode: changed %v, %v", changed, err)
			}
			if !cleanupMode(tpl.Spec.Containers) {
				t.Error("cleanupMode is false after the patch")
			}
			if len(tpl.Spec.InitContainers) != 0 {
				t.Errorf("init containers left: %v (the drop-in would be installed again)", tpl.Spec.InitContainers)
			}
			c := container(t, &tpl)
			old := container(t, &before)
			want := append(slices.Clone(old.Args), "--uninstall", "--kubelet-dropin="+tc.wantDropIn)
			if !slices.Equal(c.Args, want) {
				t.Errorf("args %q\nwant %q", c.Args, want)
			}
			dir := tc.wantHost
			i := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == dir })
			if i < 0 || c.VolumeMounts[i].ReadOnly || c.VolumeMounts[i].Name != tc.wantVolume {
				t.Fatalf("mounts %+v: want %s read-write at %s", c.VolumeMounts, tc.wantVolume, dir)
			}
			j := slices.IndexFunc(tpl.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == tc.wantVolume })
			if j < 0 || tpl.Spec.Volumes[j].HostPath == nil || tpl.Spec.Volumes[j].HostPath.Path != tc.wantHost {
				t.Errorf("volumes %+v: want %s of host %s", tpl.Spec.Volumes, tc.wantVolume, tc.wantHost)
			}
			if len(c.VolumeMounts) != len(old.VolumeMounts)+1 || c.Image != old.Image || !equalProbes(c, old) {
				t.Errorf("more changed than the mode: mounts %d → %d, image %s → %s", len(old.VolumeMounts), len(c.VolumeMounts), old.Image, c.Image)
			}
			// Again: nothing to change (a re-run after an interruption).
			again := *tpl.DeepCopy()
			if changed, err := toCleanupMode(&again); err != nil || changed {
				t.Errorf("second patch: changed %v, %v", changed, err)
			}
		})
	}
}

func equalProbes(a, b *corev1.Container) bool {
	return a.ReadinessProbe.String() == b.ReadinessProbe.String() && a.StartupProbe.String() == b.StartupProbe.String()
}

func TestRolledOut(t *testing.T) {
	for _, tc := range []struct {
		name string
		gen  int64
		st   appsv1.DaemonSetStatus
		want bool
	}{
		{"done", 2, appsv1.DaemonSetStatus{ObservedGeneration: 2, DesiredNumberScheduled: 2, UpdatedNumberScheduled: 2, NumberReady: 2}, true},
		{"the change not seen yet", 3, appsv1.DaemonSetStatus{ObservedGeneration: 2, DesiredNumberScheduled: 2, UpdatedNumberScheduled: 2, NumberReady: 2}, false},
		{"a node not updated", 2, appsv1.DaemonSetStatus{ObservedGeneration: 2, DesiredNumberScheduled: 2, UpdatedNumberScheduled: 1, NumberReady: 2}, false},
		{"a node not clean yet", 2, appsv1.DaemonSetStatus{ObservedGeneration: 2, DesiredNumberScheduled: 2, UpdatedNumberScheduled: 2, NumberReady: 1}, false},
	} {
		ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Generation: tc.gen}, Status: tc.st}
		if got, progress := rolledOut(ds); got != tc.want {
			t.Errorf("%s: rolledOut = %v (%s), want %v", tc.name, got, progress, tc.want)
		}
	}
}

func TestUnmarkPatches(t *testing.T) {
	configOK := corev1.NodeCondition{Type: "ConfigOK", Status: corev1.ConditionTrue}
	ready := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue}
	src := &corev1.NodeConfigSource{ConfigMap: &corev1.ConfigMapNodeConfigSource{Namespace: "kube-system", Name: "c", KubeletConfigKey: "kubelet"}}
	for _, tc := range []struct {
		name               string
		node               corev1.Node
		wantNode, wantStat string
	}{
		{"everything dkc writes",
			corev1.Node{
				ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{"dkc.dev/config-source": "{}", "dkc.dev/pool-assignment": "p", "dkc.dev/config-status": "{}", "other": "kept"}},
				Spec:       corev1.NodeSpec{ConfigSource: src},
				Status:     corev1.NodeStatus{Conditions: []corev1.NodeCondition{ready, configOK}, Config: &corev1.NodeConfigStatus{}},
			},
			`{"metadata":{"annotations":{"dkc.dev/config-source":null,"dkc.dev/config-status":null,"dkc.dev/pool-assignment":null}},"spec":{"configSource":null}}`,
			`{"status":{"conditions":[{"$patch":"delete","type":"ConfigOK"}],"config":null}}`},
		{"a node never assigned: status annotation and condition",
			corev1.Node{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{"dkc.dev/config-status": "{}"}},
				Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{configOK, ready}}},
			`{"metadata":{"annotations":{"dkc.dev/config-status":null}}}`,
			`{"status":{"conditions":[{"$patch":"delete","type":"ConfigOK"}]}}`},
		{"a preview's answer and a drift finding: every condition dkc-server writes",
			corev1.Node{Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{ready,
				{Type: "ConfigDrift", Status: corev1.ConditionTrue}, {Type: "ConfigPreview", Status: corev1.ConditionTrue}}}},
			"", `{"status":{"conditions":[{"$patch":"delete","type":"ConfigPreview"},{"$patch":"delete","type":"ConfigDrift"}]}}`},
		{"nothing of dkc's", corev1.Node{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{"other": "x"}},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{ready}}}, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node, status := unmarkPatches(&tc.node)
			if string(node) != tc.wantNode || string(status) != tc.wantStat {
				t.Errorf("patches\n %s\n %s\nwant\n %s\n %s", node, status, tc.wantNode, tc.wantStat)
			}
			if marked(&tc.node) != (tc.wantNode != "" || tc.wantStat != "") {
				t.Errorf("marked = %v", marked(&tc.node))
			}
		})
	}
}

func TestWritePlan(t *testing.T) {
	tpl := baseTemplate(t)
	ds := &appsv1.DaemonSet{Spec: appsv1.DaemonSetSpec{Template: tpl}, Status: appsv1.DaemonSetStatus{DesiredNumberScheduled: 2}}
	cleanup := ds.DeepCopy()
	if _, err := toCleanupMode(&cleanup.Spec.Template); err != nil {
		t.Fatal(err)
	}
	server := &appsv1.Deployment{Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](2)}}
	stopped := &appsv1.Deployment{Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](0)}}
	for _, tc := range []struct {
		name    string
		st      uninstallState
		want    []string
		wantNot []string
	}{
		{"a fresh uninstall",
			uninstallState{namespace: "kube-system", crd: true, pools: []string{"blue", "green"}, daemonSet: ds, server: server, markedNodes: []string{"node-1", "node-2"}},
			[]string{"namespace kube-system", "1. delete the KubeletConfigPools (blue, green)", "2. switch daemonset/dkc-sidecar to its cleanup mode",
				"every node (2)", "3. scale deployment/dkc-server to 0", "from 2 Node(s): node-1, node-2", "4. then you delete"},
			nil},
		{"a re-run after an interruption in the nodes' cleanup",
			uninstallState{namespace: "dkc", crd: true, daemonSet: cleanup, server: stopped, markedNodes: []string{"node-1"}},
			[]string{"namespace dkc", "1. KubeletConfigPools: none to delete", "is in its cleanup mode already: wait", "3. remove dkc's annotations"},
			[]string{"scale deployment", "switch daemonset"}},
		{"no CRD, Nodes clean",
			uninstallState{namespace: "kube-system", daemonSet: cleanup},
			[]string{"no CRD, nothing to delete", "3. Nodes: none carries"},
			nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			writePlan(&b, &tc.st)
			for _, w := range tc.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("plan lacks %q:\n%s", w, b.String())
				}
			}
			for _, w := range tc.wantNot {
				if strings.Contains(b.String(), w) {
					t.Errorf("plan says %q:\n%s", w, b.String())
				}
			}
		})
	}
	if st := (uninstallState{namespace: "kube-system"}); !st.notInstalled() {
		t.Error("an empty cluster is not 'not installed'")
	}
	if st := (uninstallState{namespace: "kube-system", markedNodes: []string{"node-1"}}); st.notInstalled() {
		t.Error("a cluster whose Nodes carry dkc's marks is 'not installed'")
	}
}

func TestWriteDeleteStep(t *testing.T) {
	var b bytes.Buffer
	writeDeleteStep(&b, &uninstallState{configNamespaces: []string{"kube-system", "dkc-configs"}})
	for _, w := range []string{"kubectl delete -k", "kubectl -n kube-system delete configmap -l dkc.dev/pool,dkc.dev/revision",
		"kubectl -n dkc-configs delete configmap -l dkc.dev/pool,dkc.dev/revision"} {
		if !strings.Contains(b.String(), w) {
			t.Errorf("lacks %q:\n%s", w, b.String())
		}
	}
}

// TestRefusalIn: the reason of a cleanup pod's last refusal, from its JSON log lines.
func TestRefusalIn(t *testing.T) {
	for _, tc := range []struct{ log, want string }{
		{`{"level":"info","msg":"uninstall: kubelet drop-in"}`, ""},
		{`{"level":"error","msg":"` + refusedMessage + `","error":"uninstall refused: old"}` + "\n" +
			`{"level":"error","msg":"` + refusedMessage + `","error":"uninstall refused: the local kubelet config x does not pass"}` + "\n" +
			`{"level":"info","msg":"other"}`, "uninstall refused: the local kubelet config x does not pass"},
		{"E " + refusedMessage + " because", "E " + refusedMessage + " because"},
	} {
		if got := refusalIn(tc.log); got != tc.want {
			t.Errorf("refusalIn(%q) = %q, want %q", tc.log, got, tc.want)
		}
	}
}

// TestCleanNodesStopsAtARefusal: while one node's cleanup pod refuses (its log says so) and the DaemonSet's
// counts therefore never say done, the wait ends with the refusal, naming the node and the reason, long
// before its timeout — and it goes on waiting where the unready pod has not refused.
func TestCleanNodesStopsAtARefusal(t *testing.T) {
	const reason = "uninstall refused: the local kubelet config /var/lib/kubelet/config.yaml does not pass the kubelet's validation"
	for _, tc := range []struct {
		name        string
		log         string
		wantRefused bool
	}{
		{name: "refused", wantRefused: true,
			log: `{"level":"error","msg":"` + refusedMessage + `","retryIn":"30s","error":"` + reason + `"}`},
		{name: "still working", log: `{"level":"info","msg":"uninstall: local config validated"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tpl := baseTemplate(t)
			if _, err := toCleanupMode(&tpl); err != nil {
				t.Fatal(err)
			}
			ds := &appsv1.DaemonSet{
				ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: sidecarDaemonSet, Generation: 2},
				Spec:       appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: tpl.Labels}, Template: tpl},
				Status:     appsv1.DaemonSetStatus{ObservedGeneration: 2, DesiredNumberScheduled: 2, UpdatedNumberScheduled: 2, NumberReady: 1},
			}
			pod := func(node string, isReady bool) *corev1.Pod {
				status := corev1.ConditionFalse
				if isReady {
					status = corev1.ConditionTrue
				}
				return &corev1.Pod{
					ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "dkc-sidecar-" + node, Labels: tpl.Labels},
					Spec:       corev1.PodSpec{NodeName: node, Containers: tpl.Spec.Containers},
					Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}},
						ContainerStatuses: []corev1.ContainerStatus{{Name: sidecarContainer, State: corev1.ContainerState{
							Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(time.Now().Add(-time.Minute))}}}}},
				}
			}
			var out bytes.Buffer
			var read []string
			o := &Options{io: genericiooptions.IOStreams{Out: &out}, client: fake.NewClientset(ds, pod("node-1", true), pod("node-2", false)),
				podLogs: func(_ context.Context, p *corev1.Pod, _ *corev1.PodLogOptions) ([]byte, error) {
					read = append(read, p.Name)
					return []byte(tc.log + "\n"), nil
				}}
			start := time.Now()
			err := o.cleanNodes(context.Background(), "kube-system", 3*time.Second)
			if !tc.wantRefused {
				if err == nil || errors.Is(err, errNodeRefused) || !strings.Contains(err.Error(), "node-2: pod dkc-sidecar-node-2 has not finished the cleanup") {
					t.Errorf("cleanNodes = %v, want a timeout naming node-2 as not clean yet", err)
				}
				return
			}
			if !errors.Is(err, errNodeRefused) || !strings.Contains(err.Error(), "node-2") || !strings.Contains(err.Error(), reason) {
				t.Errorf("cleanNodes = %v, want the refusal naming node-2 and %q", err, reason)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("the refusal ended the wait after %v, want at its first look", d)
			}
			if !slices.Equal(read, []string{"dkc-sidecar-node-2"}) {
				t.Errorf("logs read %v, want only the unready pod's", read)
			}
		})
	}
}
