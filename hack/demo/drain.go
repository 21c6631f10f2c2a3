// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dkc-dev/dkc/internal/configz"
)

// demoNamespace holds the drain act's workload.
const demoNamespace = "dkc-demo"

// controlPlaneRole labels and taints a control-plane node, as kubeadm does.
const controlPlaneRole = "node-role.kubernetes.io/control-plane"

// drain is the act of a change the kubelet refuses without a drain (docs/pools.md, "Changes that need a
// drain"): the static CPU manager on the worker, which runs a workload's pod. Through the annotation the
// sidecar refuses it and leaves the kubelet alone; kubectl dkc assign --drain cordons the worker, evicts the
// pod (it moves to the other node), lets the sidecar remove cpu_manager_state with the kubelet stopped,
// sees the kubelet run the static policy and uncordons the worker; reset --drain goes back the same way.
func (d *demo) drain(ctx context.Context) error {
	worker, other, err := d.workerNode(ctx)
	if err != nil {
		return err
	}
	d.title("A change the kubelet refuses without a drain: cpuManagerPolicy static on %s, which runs a workload", worker)
	if err := d.workload(ctx, worker, other); err != nil {
		return err
	}
	saved := d.node
	d.node = worker
	defer func() { d.node = saved }()
	running, err := d.configz(ctx)
	if err != nil {
		return err
	}
	n, err := d.client.CoreV1().Nodes().Get(ctx, worker, metav1.GetOptions{})
	if err != nil {
		return err
	}
	static, err := configz.Config(n.Status.NodeInfo.KubeletVersion, running,
		map[string]any{"cpuManagerPolicy": "static", "reservedSystemCPUs": "0"})
	if err != nil {
		return err
	}
	y, err := configz.YAML(static)
	if err != nil {
		return err
	}
	cm, err := d.createConfigMap(ctx, "demo-static-cpus", string(y))
	if err != nil {
		return err
	}
	d.say("configz: cpuManagerPolicy = %v; the CPU manager's checkpoint says so too", running["cpuManagerPolicy"])

	d.title("kubectl dkc assign refuses it before touching the node; through the annotation, the sidecar does")
	if _, err := d.dkc(ctx, true, "assign", worker, "--configmap", "kube-system/"+cm.Name); err != nil {
		return err
	}
	if err := d.assign(ctx, cm.Name); err != nil {
		return err
	}
	st, err := d.waitStatus(ctx, "the sidecar's refusal", func(s corev1.NodeConfigStatus) bool {
		return isCM(s.Assigned, cm) && strings.Contains(s.Error, "drained first")
	})
	if err != nil {
		return err
	}
	d.showStatus(ctx, st)
	if err := d.assign(ctx, ""); err != nil {
		return err
	}
	if _, err := d.waitStatus(ctx, "the local config again", func(s corev1.NodeConfigStatus) bool {
		return s.Assigned == nil && s.Error == ""
	}); err != nil {
		return err
	}

	d.title("kubectl dkc assign --drain: cordon, evict (PodDisruptionBudgets hold), reset the state, restart, uncordon")
	if _, err := d.dkc(ctx, false, "assign", worker, "--configmap", "kube-system/"+cm.Name, "--drain"); err != nil {
		return err
	}
	running, err = d.configz(ctx)
	if err != nil {
		return err
	}
	if running["cpuManagerPolicy"] != "static" {
		return fmt.Errorf("configz cpuManagerPolicy = %v after assign --drain, want static", running["cpuManagerPolicy"])
	}
	d.say("configz: cpuManagerPolicy = static — the kubelet runs it on a fresh checkpoint")
	if err := d.webOn(ctx, other); err != nil {
		return err
	}

	d.title("And back: kubectl dkc reset --drain")
	if _, err := d.dkc(ctx, false, "reset", worker, "--drain"); err != nil {
		return err
	}
	running, err = d.configz(ctx)
	if err != nil {
		return err
	}
	d.say("configz: cpuManagerPolicy = %v", running["cpuManagerPolicy"])
	return d.client.CoreV1().Namespaces().Delete(ctx, demoNamespace, metav1.DeleteOptions{})
}

// workerNode is the node without the control-plane role, and the other one.
func (d *demo) workerNode(ctx context.Context) (worker, other string, err error) {
	nodes, err := d.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", "", err
	}
	for _, n := range nodes.Items {
		if _, cp := n.Labels[controlPlaneRole]; cp {
			other = n.Name
		} else {
			worker = n.Name
		}
	}
	if worker == "" || other == "" {
		return "", "", fmt.Errorf("want a control-plane node and a worker, have %d nodes", len(nodes.Items))
	}
	return worker, other, nil
}

// workload runs a Deployment's one pod on worker (it may move to other).
func (d *demo) workload(ctx context.Context, worker, other string) error {
	if _, err := d.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: demoNamespace}}, metav1.CreateOptions{}); err != nil &&
		!apierrors.IsAlreadyExists(err) {
		return err
	}
	labels := map[string]string{"app": "web"}
	one, grace := int32(1), int64(1)
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: demoNamespace},
		Spec: appsv1.DeploymentSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
				TerminationGracePeriodSeconds: &grace,
				Containers:                    []corev1.Container{{Name: "web", Image: "dkc.local/pause:dev"}},
				Tolerations: []corev1.Toleration{{Key: controlPlaneRole, Operator: corev1.TolerationOpExists,
					Effect: corev1.TaintEffectNoSchedule}},
				Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
					PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{Weight: 100,
						Preference: corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{{
							Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{worker}}}}}}}},
			}}},
	}
	d.say("kubectl create deployment web --image dkc.local/pause:dev (one replica, prefers %s, may run on %s)",
		worker, other)
	if _, err := d.client.AppsV1().Deployments(demoNamespace).Create(ctx, dep, metav1.CreateOptions{}); err != nil &&
		!apierrors.IsAlreadyExists(err) {
		return err
	}
	return d.webOn(ctx, worker)
}

// webOn waits until the workload's one pod runs, ready, on node.
func (d *demo) webOn(ctx context.Context, node string) error {
	deadline := time.Now().Add(3 * time.Minute)
	for {
		pods, err := d.client.CoreV1().Pods(demoNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err == nil && len(pods.Items) == 1 && pods.Items[0].Spec.NodeName == node && podReady(&pods.Items[0]) &&
			pods.Items[0].DeletionTimestamp == nil {
			d.say("pod %s runs on %s", pods.Items[0].Name, node)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the workload's pod does not run on %s (%w)", node, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
