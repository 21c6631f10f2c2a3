// Command demo walks the seed document's workflow ("Reconfigure a Node's Kubelet in a Live Cluster") on the
// dev cluster's real node, printing each step, and exits non-zero at the first deviation. `make demo` starts
// a fresh cluster (a 20s last-known-good trial, so the fallback can be shown), runs this and stops it.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
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
	client kubernetes.Interface
	node   string
	start  time.Time
	step   int
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
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err == nil {
		var client kubernetes.Interface
		client, err = kubernetes.NewForConfig(cfg)
		if err == nil {
			err = (&demo{client: client, node: *node, start: time.Now()}).run(ctx)
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "\nDEMO FAILED: %v\n", err)
		os.Exit(1)
	}
	fmt.Println("\nDemo complete: every step behaved as the seed document describes.")
}

func (d *demo) run(ctx context.Context) error {
	d.title("Read the running kubelet's config through the apiserver (kubectl get --raw /api/v1/nodes/%s/proxy/configz)", d.node)
	running, err := d.configz(ctx)
	if err != nil {
		return err
	}
	before := running["eventRecordQPS"]
	d.say("eventRecordQPS = %v (from the node's local config)", before)
	node, err := d.client.CoreV1().Nodes().Get(ctx, d.node, metav1.GetOptions{})
	if err != nil {
		return err
	}
	kubelet := node.Status.NodeInfo.KubeletVersion
	d.say("kubelet %s: dkc validates with that minor's code and defaults", kubelet)

	d.title("Edit it: eventRecordQPS 5, as a complete KubeletConfiguration (kind, apiVersion, fields that run empty)")
	good, err := configz.Config(kubelet, running, map[string]any{"eventRecordQPS": 5})
	if err != nil {
		return err
	}
	goodYAML, err := configz.YAML(good)
	if err != nil {
		return err
	}
	d.say("%d lines, e.g. eventRecordQPS: 5, enforceNodeAllocatable: %v", strings.Count(string(goodYAML), "\n"), good["enforceNodeAllocatable"])

	d.title("Push it as a ConfigMap (kubectl -n kube-system create configmap my-node-config --from-file=kubelet=... --append-hash)")
	goodCM, err := d.createConfigMap(ctx, "my-node-config", string(goodYAML))
	if err != nil {
		return err
	}
	d.say("created kube-system/%s (UID %s, ResourceVersion %s)", goodCM.Name, goodCM.UID, goodCM.ResourceVersion)

	d.title("Point the Node at it (the annotation dkc.dev/config-source, where spec.configSource used to be)")
	if err := d.assign(ctx, goodCM.Name); err != nil {
		return err
	}
	st, err := d.waitStatus(ctx, "the new config active", func(s corev1.NodeConfigStatus) bool {
		return isCM(s.Assigned, goodCM) && isCM(s.Active, goodCM) && s.Error == ""
	})
	if err != nil {
		return err
	}
	d.showStatus(ctx, st)
	if err := d.expectQPS(ctx, 5); err != nil {
		return err
	}
	if err := d.showEvent(ctx, goodCM); err != nil {
		return err
	}

	d.title("Let it run healthy through its trial: it becomes the last-known-good config (no restart)")
	if _, err = d.waitStatus(ctx, "last-known-good to be the new config", func(s corev1.NodeConfigStatus) bool {
		return isCM(s.LastKnownGood, goodCM)
	}); err != nil {
		return err
	}
	d.say("lastKnownGood = %s", goodCM.Name)

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
	st, err = d.waitStatus(ctx, "the validation error with last-known-good active", func(s corev1.NodeConfigStatus) bool {
		return isCM(s.Assigned, badCM) && isCM(s.Active, goodCM) && s.Error == string(nodeconfig.ValidateError)
	})
	if err != nil {
		return err
	}
	d.showStatus(ctx, st)
	if err := d.expectQPS(ctx, 5); err != nil {
		return err
	}

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
	st, err = d.waitStatus(ctx, "the new ResourceVersion active", func(s corev1.NodeConfigStatus) bool {
		return isCM(s.Assigned, newCM) && isCM(s.Active, newCM) && s.Error == ""
	})
	if err != nil {
		return err
	}
	d.showStatus(ctx, st)
	if err := d.expectQPS(ctx, 6); err != nil {
		return err
	}

	d.title("Reset the node to its local config (remove the annotation)")
	if err := d.assign(ctx, ""); err != nil {
		return err
	}
	st, err = d.waitStatus(ctx, "an empty status", func(s corev1.NodeConfigStatus) bool {
		return s.Assigned == nil && s.Active == nil && s.LastKnownGood == nil && s.Error == ""
	})
	if err != nil {
		return err
	}
	d.showStatus(ctx, st)
	running, err = d.configz(ctx)
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
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: prefix, Namespace: "kube-system"}, Data: map[string]string{"kubelet": kubelet}}
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
		src, _ := json.Marshal(map[string]any{"configMap": map[string]string{"namespace": "kube-system", "name": cm, "kubeletConfigKey": "kubelet"}})
		quoted, _ := json.Marshal(string(src))
		value = string(quoted)
		d.say("kubectl annotate node %s --overwrite dkc.dev/config-source='%s'", d.node, src)
	} else {
		d.say("kubectl annotate node %s dkc.dev/config-source-", d.node)
	}
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%s}}}`, nodeconfig.SourceAnnotation, value)
	_, err := d.client.CoreV1().Nodes().Patch(ctx, d.node, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

func (d *demo) waitStatus(ctx context.Context, what string, ok func(corev1.NodeConfigStatus) bool) (corev1.NodeConfigStatus, error) {
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
	evs, err := d.client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + d.node + ",reason=" + nodeconfig.EventReason})
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
