// SPDX-License-Identifier: Apache-2.0

// Command demo walks the seed document's workflow ("Reconfigure a Node's Kubelet in a Live Cluster") on the
// dev cluster's real node, then, as its last act, the declarative workflow over every node: a
// KubeletConfigPool rolled out, a bad revision halted at the first node, and undone, through the kubectl-dkc
// built beside it. It prints each step and exits non-zero at the first deviation. `make demo` starts a fresh
// cluster (a 20s last-known-good trial, so the fallback can be shown), runs this and stops it.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/kubectl/pkg/util/hash"

	"github.com/dkc-dev/dkc/internal/configz"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
)

type demo struct {
	client     kubernetes.Interface
	node       string
	kubeconfig string
	kubectlDKC string // the plugin binary
	start      time.Time
	step       int
}

func (d *demo) say(format string, args ...any) {
	fmt.Printf("   "+format+"\n", args...)
}

func (d *demo) title(format string, args ...any) {
	d.step++
	fmt.Printf("\n[%5.1fs] %d. %s\n", time.Since(d.start).Seconds(), d.step, fmt.Sprintf(format, args...))
}

func main() {
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "admin kubeconfig of the dev cluster")
	node := flag.String("node", "node-1", "the real node to reconfigure")
	plugin := flag.String("kubectl-dkc", besideMe("kubectl-dkc"), "the kubectl-dkc binary the last act runs")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err == nil {
		var client kubernetes.Interface
		client, err = kubernetes.NewForConfig(cfg)
		if err == nil {
			d := &demo{client: client, node: *node, kubeconfig: *kubeconfig, kubectlDKC: *plugin, start: time.Now()}
			if err = d.run(ctx); err == nil {
				err = d.pool(ctx)
			}
			if err == nil {
				err = d.drain(ctx)
			}
		}
	}
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "\nDEMO FAILED: %v\n", err)
		os.Exit(1)
	}
	fmt.Println("\nDemo complete: every step behaved as the seed document describes, and the pool and the drain as " +
		"docs/pools.md describes.")
}

// run is the seed document's workflow on d.node, act by act: each act starts where the one before left the
// node, and the last returns it to its local config.
func (d *demo) run(ctx context.Context) error {
	running, kubelet, err := d.readConfig(ctx)
	if err != nil {
		return err
	}
	before := running["eventRecordQPS"]
	goodCM, err := d.assignGood(ctx, kubelet, running)
	if err != nil {
		return err
	}
	if err := d.keepLastKnownGood(ctx, goodCM); err != nil {
		return err
	}
	if err := d.assignInvalid(ctx, kubelet, running, goodCM); err != nil {
		return err
	}
	if err := d.updateInPlace(ctx, kubelet, running, goodCM); err != nil {
		return err
	}
	return d.resetToLocal(ctx, before)
}

// readConfig reads the running kubelet's config, which every config of the demo is edited from, and the
// kubelet's version, whose minor dkc validates with.
func (d *demo) readConfig(ctx context.Context) (running map[string]any, kubelet string, err error) {
	d.title("Read the running kubelet's config through the apiserver "+
		"(kubectl get --raw /api/v1/nodes/%s/proxy/configz)", d.node)
	running, err = d.configz(ctx)
	if err != nil {
		return nil, "", err
	}
	d.say("eventRecordQPS = %v (from the node's local config)", running["eventRecordQPS"])
	node, err := d.client.CoreV1().Nodes().Get(ctx, d.node, metav1.GetOptions{})
	if err != nil {
		return nil, "", err
	}
	kubelet = node.Status.NodeInfo.KubeletVersion
	d.say("kubelet %s: dkc validates with that minor's code and defaults", kubelet)
	return running, kubelet, nil
}

// assignGood is the seed workflow's main line: edit the config, push it as a ConfigMap, point the Node at
// it, and see the kubelet run it. It returns the ConfigMap, which later acts go back to.
func (d *demo) assignGood(ctx context.Context, kubelet string, running map[string]any) (*corev1.ConfigMap, error) {
	d.title("Edit it: eventRecordQPS 5, as a complete KubeletConfiguration (kind, apiVersion, fields that run empty)")
	good, err := configz.Config(kubelet, running, map[string]any{"eventRecordQPS": 5})
	if err != nil {
		return nil, err
	}
	goodYAML, err := configz.YAML(good)
	if err != nil {
		return nil, err
	}
	d.say("%d lines, e.g. eventRecordQPS: 5, enforceNodeAllocatable: %v", strings.Count(string(goodYAML), "\n"),
		good["enforceNodeAllocatable"])

	d.title("Push it as a ConfigMap " +
		"(kubectl -n kube-system create configmap my-node-config --from-file=kubelet=... --append-hash)")
	goodCM, err := d.createConfigMap(ctx, "my-node-config", string(goodYAML))
	if err != nil {
		return nil, err
	}
	d.say("created kube-system/%s (UID %s, ResourceVersion %s)", goodCM.Name, goodCM.UID, goodCM.ResourceVersion)

	d.title("Point the Node at it (the annotation dkc.dev/config-source, where spec.configSource used to be)")
	if err := d.assign(ctx, goodCM.Name); err != nil {
		return nil, err
	}
	st, err := d.waitStatus(ctx, "the new config active", func(s corev1.NodeConfigStatus) bool {
		return isCM(s.Assigned, goodCM) && isCM(s.Active, goodCM) && s.Error == ""
	})
	if err != nil {
		return nil, err
	}
	d.showStatus(ctx, st)
	if err := d.expectQPS(ctx, 5); err != nil {
		return nil, err
	}
	if err := d.showEvent(ctx, goodCM); err != nil {
		return nil, err
	}
	return goodCM, nil
}

// keepLastKnownGood waits out the config's trial: it becomes last-known-good, which the next act needs.
func (d *demo) keepLastKnownGood(ctx context.Context, goodCM *corev1.ConfigMap) error {
	d.title("Let it run healthy through its trial: it becomes the last-known-good config (no restart)")
	if _, err := d.waitStatus(ctx, "last-known-good to be the new config", func(s corev1.NodeConfigStatus) bool {
		return isCM(s.LastKnownGood, goodCM)
	}); err != nil {
		return err
	}
	d.say("lastKnownGood = %s", goodCM.Name)
	return nil
}

// assignInvalid shows the fallback: an invalid config is refused, and the kubelet keeps last-known-good.
func (d *demo) assignInvalid(ctx context.Context, kubelet string, running map[string]any,
	goodCM *corev1.ConfigMap) error {
	d.title("Assign an invalid config (eventRecordQPS -1): the kubelet keeps last-known-good, status says why")
	bad, _ := configz.Config(kubelet, running, map[string]any{"eventRecordQPS": -1})
	badYAML, _ := configz.YAML(bad)
	badCM, err := d.createConfigMap(ctx, "my-node-config", string(badYAML))
	if err != nil {
		return err
	}
	if err := d.assign(ctx, badCM.Name); err != nil {
		return err
	}
	st, err := d.waitStatus(ctx, "the validation error with last-known-good active", func(s corev1.NodeConfigStatus) bool {
		return isCM(s.Assigned, badCM) && isCM(s.Active, goodCM) && s.Error == string(nodeconfig.ValidateError)
	})
	if err != nil {
		return err
	}
	d.showStatus(ctx, st)
	return d.expectQPS(ctx, 5)
}

// updateInPlace assigns the good ConfigMap again, then edits it in place: its new ResourceVersion is what
// the kubelet runs next.
func (d *demo) updateInPlace(ctx context.Context, kubelet string, running map[string]any,
	goodCM *corev1.ConfigMap) error {
	d.title("Fix it by assigning the good ConfigMap again, then update that ConfigMap in place (eventRecordQPS 6)")
	if err := d.assign(ctx, goodCM.Name); err != nil {
		return err
	}
	if _, err := d.waitStatus(ctx, "the good config again, error cleared", func(s corev1.NodeConfigStatus) bool {
		return isCM(s.Assigned, goodCM) && isCM(s.Active, goodCM) && s.Error == ""
	}); err != nil {
		return err
	}
	updated, _ := configz.Config(kubelet, running, map[string]any{"eventRecordQPS": 6})
	updatedYAML, _ := configz.YAML(updated)
	goodCM.Data = map[string]string{"kubelet": string(updatedYAML)}
	newCM, err := d.client.CoreV1().ConfigMaps("kube-system").Update(ctx, goodCM, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("update configmap %s: %w", goodCM.Name, err)
	}
	d.say("kube-system/%s now at ResourceVersion %s (was %s)", newCM.Name, newCM.ResourceVersion, goodCM.ResourceVersion)
	st, err := d.waitStatus(ctx, "the new ResourceVersion active", func(s corev1.NodeConfigStatus) bool {
		return isCM(s.Assigned, newCM) && isCM(s.Active, newCM) && s.Error == ""
	})
	if err != nil {
		return err
	}
	d.showStatus(ctx, st)
	return d.expectQPS(ctx, 6)
}

// resetToLocal removes the Node's source: the kubelet runs its local config again, with its value before
// the demo (before).
func (d *demo) resetToLocal(ctx context.Context, before any) error {
	d.title("Reset the node to its local config (remove the annotation)")
	if err := d.assign(ctx, ""); err != nil {
		return err
	}
	st, err := d.waitStatus(ctx, "an empty status", func(s corev1.NodeConfigStatus) bool {
		return s.Assigned == nil && s.Active == nil && s.LastKnownGood == nil && s.Error == ""
	})
	if err != nil {
		return err
	}
	d.showStatus(ctx, st)
	running, err := d.configz(ctx)
	if err != nil {
		return err
	}
	if fmt.Sprint(running["eventRecordQPS"]) != fmt.Sprint(before) {
		return fmt.Errorf("after reset eventRecordQPS = %v, want the local %v", running["eventRecordQPS"], before)
	}
	d.say("configz: eventRecordQPS = %v again (local)", running["eventRecordQPS"])
	return nil
}

func isCM(s *corev1.NodeConfigSource, cm *corev1.ConfigMap) bool {
	return s != nil && s.ConfigMap != nil && s.ConfigMap.UID == cm.UID && s.ConfigMap.ResourceVersion == cm.ResourceVersion
}

func (d *demo) configz(ctx context.Context) (map[string]any, error) {
	var body []byte
	var err error
	for i := 0; i < 60; i++ { // the kubelet may be restarting
		body, err = d.client.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes/" + d.node + "/proxy/configz").DoRaw(ctx)
		if err == nil {
			return configz.Decode(body)
		}
		time.Sleep(time.Second)
	}
	return nil, fmt.Errorf("configz of %s: %w", d.node, err)
}

func (d *demo) expectQPS(ctx context.Context, want int) error {
	running, err := d.configz(ctx)
	if err != nil {
		return err
	}
	if running["eventRecordQPS"] != float64(want) {
		return fmt.Errorf("configz eventRecordQPS = %v, want %d", running["eventRecordQPS"], want)
	}
	d.say("configz: eventRecordQPS = %d — the running kubelet uses it", want)
	return nil
}

func (d *demo) createConfigMap(ctx context.Context, prefix, kubelet string) (*corev1.ConfigMap, error) {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: prefix, Namespace: "kube-system"},
		Data: map[string]string{"kubelet": kubelet}}
	h, err := hash.ConfigMapHash(cm)
	if err != nil {
		return nil, err
	}
	cm.Name = prefix + "-" + h
	created, err := d.client.CoreV1().ConfigMaps("kube-system").Create(ctx, cm, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return d.client.CoreV1().ConfigMaps("kube-system").Get(ctx, cm.Name, metav1.GetOptions{})
	}
	return created, err
}

func (d *demo) assign(ctx context.Context, cm string) error {
	value := "null"
	if cm != "" {
		src, _ := json.Marshal(map[string]any{"configMap": map[string]string{"namespace": "kube-system", "name": cm,
			"kubeletConfigKey": "kubelet"}})
		quoted, _ := json.Marshal(string(src))
		value = string(quoted)
		d.say("kubectl annotate node %s --overwrite dkc.dev/config-source='%s'", d.node, src)
	} else {
		d.say("kubectl annotate node %s dkc.dev/config-source-", d.node)
	}
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%s}}}`, nodeconfig.SourceAnnotation, value)
	_, err := d.client.CoreV1().Nodes().Patch(ctx, d.node, types.StrategicMergePatchType, []byte(patch),
		metav1.PatchOptions{})
	return err
}

func (d *demo) waitStatus(ctx context.Context, what string,
	ok func(corev1.NodeConfigStatus) bool) (corev1.NodeConfigStatus, error) {
	d.say("waiting for %s ...", what)
	deadline := time.Now().Add(3 * time.Minute)
	var last string
	for time.Now().Before(deadline) {
		n, err := d.client.CoreV1().Nodes().Get(ctx, d.node, metav1.GetOptions{})
		if err == nil {
			last = n.Annotations[nodeconfig.StatusAnnotation]
			var st corev1.NodeConfigStatus
			if json.Unmarshal([]byte(last), &st) == nil && ok(st) {
				return st, nil
			}
		}
		select {
		case <-ctx.Done():
			return corev1.NodeConfigStatus{}, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	return corev1.NodeConfigStatus{}, errors.New("timed out waiting for " + what + "; last status: " + last)
}

func (d *demo) showStatus(ctx context.Context, st corev1.NodeConfigStatus) {
	raw, _ := json.Marshal(st)
	d.say("status (annotation dkc.dev/config-status): %s", raw)
	n, err := d.client.CoreV1().Nodes().Get(ctx, d.node, metav1.GetOptions{})
	if err != nil {
		return
	}
	for _, c := range n.Status.Conditions {
		if c.Type == nodeconfig.ConditionType {
			d.say("condition ConfigOK=%s: %s", c.Status, c.Message)
		}
	}
}

func (d *demo) showEvent(ctx context.Context, cm *corev1.ConfigMap) error {
	evs, err := d.client.CoreV1().Events("default").List(ctx,
		metav1.ListOptions{FieldSelector: "involvedObject.name=" + d.node + ",reason=" + nodeconfig.EventReason})
	if err != nil {
		return err
	}
	for _, e := range evs.Items {
		if strings.Contains(e.Message, string(cm.UID)) {
			d.say("event %s: %s", e.Reason, e.Message)
			return nil
		}
	}
	return fmt.Errorf("no KubeletConfigChanged event for %s", cm.Name)
}

// besideMe is the path of name in this binary's directory (make build puts the binaries together).
func besideMe(name string) string {
	self, err := os.Executable()
	if err != nil {
		return name
	}
	return filepath.Join(filepath.Dir(self), name)
}

// dkc runs kubectl-dkc with args, printing the command and its output; wantFail says it must exit non-zero.
func (d *demo) dkc(ctx context.Context, wantFail bool, args ...string) (string, error) {
	d.say("$ kubectl dkc %s", strings.Join(args, " "))
	out, err := exec.CommandContext(ctx, d.kubectlDKC,
		append([]string{"--kubeconfig", d.kubeconfig}, args...)...).CombinedOutput()
	for _, line := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		d.say("  %s", line)
	}
	var exit *exec.ExitError
	switch {
	case err != nil && !errors.As(err, &exit):
		return "", fmt.Errorf("run %s: %w", d.kubectlDKC, err)
	case wantFail && err == nil:
		return "", fmt.Errorf("kubectl dkc %s succeeded, want it to fail", strings.Join(args, " "))
	case !wantFail && err != nil:
		return "", fmt.Errorf("kubectl dkc %s: %w", strings.Join(args, " "), err)
	}
	return string(out), nil
}

// The pool of the last act, and the nodes it selects: every node.
const (
	demoPool     = "demo-pool"
	poolSelector = "kubernetes.io/os=linux"
)

// configFor is the running kubelet's config with overrides, as the pool's ConfigMap holds it.
type configFor func(overrides map[string]any) (string, error)

// pool is the last act: the declarative workflow over every node (docs/pools.md). A KubeletConfigPool rolls
// a config out one node at a time; an in-place edit to a config the kubelet's validation refuses stops
// before any node (dkc-server checks it with the kubelet's code); one that validates but keeps the kubelet
// from starting halts at the first node, the others untouched; undo rolls the pool back. The pool is then
// deleted and the nodes reset.
func (d *demo) pool(ctx context.Context) error {
	running, err := d.configz(ctx)
	if err != nil {
		return err
	}
	node, err := d.client.CoreV1().Nodes().Get(ctx, d.node, metav1.GetOptions{})
	if err != nil {
		return err
	}
	kubelet := node.Status.NodeInfo.KubeletVersion
	config := func(overrides map[string]any) (string, error) {
		c, err := configz.Config(kubelet, running, overrides)
		if err != nil {
			return "", err
		}
		y, err := configz.YAML(c)
		return string(y), err
	}
	cm, err := d.rollOutPool(ctx, config)
	if err != nil {
		return err
	}
	if err := d.refuseInvalid(ctx, cm.Name, config); err != nil {
		return err
	}
	if err := d.haltBroken(ctx, cm.Name, config); err != nil {
		return err
	}
	if err := d.undoPool(ctx); err != nil {
		return err
	}
	return d.deletePool(ctx)
}

// rollOutPool creates the pool's ConfigMap and rolls it out with kubectl-dkc; it returns the ConfigMap,
// which the next acts edit in place.
func (d *demo) rollOutPool(ctx context.Context, config configFor) (*corev1.ConfigMap, error) {
	d.title("Declare a KubeletConfigPool over every node (%s), rolled out one node at a time by dkc-server", poolSelector)
	good, err := config(map[string]any{"eventRecordQPS": 7})
	if err != nil {
		return nil, err
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "demo-pool-config", Namespace: "kube-system"},
		Data: map[string]string{"kubelet": good}}
	if cm, err = d.client.CoreV1().ConfigMaps("kube-system").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create configmap demo-pool-config: %w", err)
	}
	d.say("created kube-system/demo-pool-config (eventRecordQPS 7)")
	if _, err := d.dkc(ctx, false, "rollout", demoPool, "--configmap", "kube-system/demo-pool-config", "-l", poolSelector,
		"--max-unavailable", "1", "--timeout", "5m"); err != nil {
		return nil, err
	}
	if err := d.expectQPS(ctx, 7); err != nil {
		return nil, err
	}
	return cm, nil
}

// refuseInvalid edits the pool's ConfigMap to a config the kubelet's validation refuses: dkc-server's
// check stops the rollout before any node.
func (d *demo) refuseInvalid(ctx context.Context, cm string, config configFor) error {
	d.title("Edit the ConfigMap in place to a config the kubelet's validation refuses (eventRecordQPS -1): " +
		"no node is touched")
	bad, err := config(map[string]any{"eventRecordQPS": -1})
	if err != nil {
		return err
	}
	if err := d.editConfigMap(ctx, cm, bad); err != nil {
		return err
	}
	out, err := d.dkc(ctx, true, "rollout", demoPool, "--timeout", "2m")
	if err != nil {
		return err
	}
	if !strings.Contains(out, "ValidationFailed") || !strings.Contains(out, "before any node is touched") {
		return fmt.Errorf("the rollout did not stop on dkc-server's check with the kubelet's code")
	}
	return d.expectQPS(ctx, 7)
}

// haltBroken edits the pool's ConfigMap to a config that validates but no kubelet starts with: the first
// node rolls back and the pool halts on its failure budget.
func (d *demo) haltBroken(ctx context.Context, cm string, config configFor) error {
	d.title("Fix it forward in place, to a config that validates but no kubelet starts with: " +
		"the pool halts at the first node")
	broken, err := config(map[string]any{"eventRecordQPS": 8,
		"containerRuntimeEndpoint": "unix:///run/dkc-no-such-runtime.sock"})
	if err != nil {
		return err
	}
	d.say("containerRuntimeEndpoint: unix:///run/dkc-no-such-runtime.sock " +
		"(no such socket: the kubelet exits; dkc rolls the node back)")
	if err := d.editConfigMap(ctx, cm, broken); err != nil {
		return err
	}
	out, err := d.dkc(ctx, true, "rollout", demoPool, "--timeout", "5m")
	if err != nil {
		return err
	}
	if !strings.Contains(out, "FailureBudgetExhausted") {
		return fmt.Errorf("the rollout did not halt on the failure budget")
	}
	if _, err := d.dkc(ctx, false, "rollout", "status", demoPool, "--wait=false"); err != nil {
		return err
	}
	_, err = d.dkc(ctx, false, "status", "-l", poolSelector)
	return err
}

// undoPool rolls the pool back to its previous revision on every node.
func (d *demo) undoPool(ctx context.Context) error {
	d.title("Undo: back to the previous revision on every node")
	if _, err := d.dkc(ctx, false, "rollout", "undo", demoPool, "--timeout", "3m"); err != nil {
		return err
	}
	if _, err := d.dkc(ctx, false, "rollout", "history", demoPool); err != nil {
		return err
	}
	return d.expectQPS(ctx, 7)
}

// deletePool deletes the pool and resets the nodes to their local config, leaving the cluster as the
// demo found it.
func (d *demo) deletePool(ctx context.Context) error {
	d.title("Delete the pool (the nodes keep their config), then reset the nodes to their local config")
	d.say("$ kubectl delete kubeletconfigpool %s", demoPool)
	if err := d.client.CoreV1().RESTClient().Delete().AbsPath("/apis/dkc.dev/v1alpha1/kubeletconfigpools/" + demoPool).
		Do(ctx).Error(); err != nil {
		return fmt.Errorf("delete kubeletconfigpool %s: %w", demoPool, err)
	}
	if _, err := d.dkc(ctx, false, "reset", "-l", poolSelector); err != nil {
		return err
	}
	if _, err := d.waitStatus(ctx, "the local config again", func(s corev1.NodeConfigStatus) bool {
		return s.Assigned == nil && s.Active == nil && s.Error == ""
	}); err != nil {
		return err
	}
	// dkc-server deletes the pool's snapshots now that no node uses them; the source ConfigMap is ours.
	return d.client.CoreV1().ConfigMaps("kube-system").Delete(ctx, "demo-pool-config", metav1.DeleteOptions{})
}

// editConfigMap replaces the kubelet key of a ConfigMap in kube-system, as an operator's in-place edit.
func (d *demo) editConfigMap(ctx context.Context, name, kubelet string) error {
	cm, err := d.client.CoreV1().ConfigMaps("kube-system").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	cm.Data["kubelet"] = kubelet
	if _, err := d.client.CoreV1().ConfigMaps("kube-system").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update configmap %s: %w", name, err)
	}
	return nil
}
