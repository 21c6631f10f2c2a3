// SPDX-License-Identifier: Apache-2.0

//go:build integration

package integration

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/poll"
	"github.com/dkc-dev/dkc/test/devcluster/devclustertest"
)

// The seed's paths on a simulated node: the real sidecar code (checkpoints, validation with the kubelet's
// code, restarts by signal, health and configz checks) against a stand-in kubelet, so every transition
// takes seconds. Exact status is checked at every step.

const simE2E = "sim-1"

func simConfig(t *testing.T, qps int, extra string) string {
	t.Helper()
	local, err := os.ReadFile(cluster.KubeletConfigPath(simE2E))
	if err != nil {
		t.Fatal(err)
	}
	return string(local) + "eventRecordQPS: " + strconv.Itoa(qps) + "\n" + extra
}

func resetSim(t *testing.T) {
	t.Helper()
	setSource(t, adminClient(t), simE2E, "")
	waitNodeStatus(t, simE2E, "local", "local", "local", "", time.Minute)
}

// waitLKG waits for the trial to promote active to last-known-good.
func waitLKG(t *testing.T, name string) {
	t.Helper()
	waitNodeStatus(t, simE2E, name, name, name, "", devclustertest.TrialDuration+time.Minute)
}

func keySource(cm, key string) string {
	return fmt.Sprintf(`{"configMap":{"namespace":"kube-system","name":%q,"kubeletConfigKey":%q}}`, cm, key)
}

func TestE2ETransitionsBetweenLocalValidUnparsableInvalid(t *testing.T) {
	client := adminClient(t)
	resetSim(t)
	t.Cleanup(func() { resetSim(t) })
	valid := createConfigMap(t, "e2e-valid", map[string]string{"kubelet": simConfig(t, 31, "")})
	createConfigMap(t, "e2e-unparsable", map[string]string{"kubelet": "{{{"})
	createConfigMap(t, "e2e-invalid", map[string]string{"kubelet": simConfig(t, -1, "")})
	v := "e2e-valid@" + valid.ResourceVersion
	u := "e2e-unparsable@" + mustRV(t, "e2e-unparsable")
	i := "e2e-invalid@" + mustRV(t, "e2e-invalid")

	steps := []struct {
		source, assigned, active, err string
	}{
		{"e2e-unparsable", u, "local", string(nodeconfig.LoadError)},  // none → unparsable
		{"e2e-invalid", i, "local", string(nodeconfig.ValidateError)}, // unparsable → invalid
		{"e2e-valid", v, v, ""}, // invalid → valid
		{"e2e-invalid", i, "local", string(nodeconfig.ValidateError)}, // valid → invalid (lkg still local: no trial yet)
		{"e2e-unparsable", u, "local", string(nodeconfig.LoadError)},  // invalid → unparsable
		{"e2e-valid", v, v, ""},                                       // unparsable → valid
		{"", "local", "local", ""},                                    // valid → none
		{"e2e-invalid", i, "local", string(nodeconfig.ValidateError)}, // none → invalid
		{"", "local", "local", ""},                                    // invalid → none
	}
	for _, s := range steps {
		src := ""
		if s.source != "" {
			src = cmSource(s.source)
		}
		setSource(t, client, simE2E, src)
		waitNodeStatus(t, simE2E, s.assigned, s.active, "local", s.err, time.Minute)
	}
}

func TestE2ERecoveryToLastKnownGood(t *testing.T) {
	client := adminClient(t)
	resetSim(t)
	t.Cleanup(func() { resetSim(t) })

	// By ConfigMap: a good one becomes last-known-good, a bad other ConfigMap falls back to it.
	good := createConfigMap(t, "e2e-lkg-good", map[string]string{"kubelet": simConfig(t, 41, ""), "bad": simConfig(t, -1, "")})
	g := "e2e-lkg-good@" + good.ResourceVersion
	setSource(t, client, simE2E, keySource("e2e-lkg-good", "kubelet"))
	waitLKG(t, g)
	createConfigMap(t, "e2e-lkg-other-bad", map[string]string{"kubelet": "{{{"})
	setSource(t, client, simE2E, cmSource("e2e-lkg-other-bad"))
	waitNodeStatus(t, simE2E, "e2e-lkg-other-bad@"+mustRV(t, "e2e-lkg-other-bad"), g, g, string(nodeconfig.LoadError), time.Minute)

	// By kubeletConfigKey: same ConfigMap, a key holding an invalid config.
	setSource(t, client, simE2E, keySource("e2e-lkg-good", "bad"))
	st := waitNodeStatus(t, simE2E, g, g, g, string(nodeconfig.ValidateError), time.Minute)
	if st.Assigned.ConfigMap.KubeletConfigKey != "bad" || st.Active.ConfigMap.KubeletConfigKey != "kubelet" {
		t.Errorf("assigned key %q, active key %q", st.Assigned.ConfigMap.KubeletConfigKey, st.Active.ConfigMap.KubeletConfigKey)
	}
	// A missing key is a load error.
	setSource(t, client, simE2E, keySource("e2e-lkg-good", "no-such-key"))
	waitNodeStatus(t, simE2E, g, g, g, string(nodeconfig.LoadError), time.Minute)

	// By an older ResourceVersion of the same ConfigMap, after in-place updates.
	setSource(t, client, simE2E, keySource("e2e-lkg-good", "kubelet"))
	waitNodeStatus(t, simE2E, g, g, g, "", time.Minute)
	good.Data["kubelet"] = "{{{ broken in place"
	broken, err := client.CoreV1().ConfigMaps("kube-system").Update(testContext(t), good, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitNodeStatus(t, simE2E, "e2e-lkg-good@"+broken.ResourceVersion, g, g, string(nodeconfig.LoadError), time.Minute)
	broken.Data["kubelet"] = simConfig(t, -5, "")
	invalid, err := client.CoreV1().ConfigMaps("kube-system").Update(testContext(t), broken, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitNodeStatus(t, simE2E, "e2e-lkg-good@"+invalid.ResourceVersion, g, g, string(nodeconfig.ValidateError), time.Minute)

	// Last-known-good replaced by a newer one: fix in place, let it pass its trial.
	invalid.Data["kubelet"] = simConfig(t, 42, "")
	fixed, err := client.CoreV1().ConfigMaps("kube-system").Update(testContext(t), invalid, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f := "e2e-lkg-good@" + fixed.ResourceVersion
	waitNodeStatus(t, simE2E, f, f, g, "", time.Minute)
	waitLKG(t, f)
}

func TestE2EDeleteAndRecreateConfigMap(t *testing.T) {
	client := adminClient(t)
	resetSim(t)
	t.Cleanup(func() { resetSim(t) })
	first := createConfigMap(t, "e2e-recreate", map[string]string{"kubelet": simConfig(t, 51, "")})
	a := "e2e-recreate@" + first.ResourceVersion
	setSource(t, client, simE2E, cmSource("e2e-recreate"))
	waitNodeStatus(t, simE2E, a, a, "*", "", time.Minute)
	if err := client.CoreV1().ConfigMaps("kube-system").Delete(testContext(t), "e2e-recreate", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The node keeps running its checkpoint and says it cannot download.
	waitNodeStatus(t, simE2E, a, a, "*", "failed to sync: failed to download config, see Kubelet log for details", time.Minute)
	second := createConfigMap(t, "e2e-recreate", map[string]string{"kubelet": simConfig(t, 52, "")})
	b := "e2e-recreate@" + second.ResourceVersion
	st := waitNodeStatus(t, simE2E, b, b, "*", "", time.Minute)
	if st.Active.ConfigMap.UID == first.UID {
		t.Error("re-created ConfigMap kept the old UID")
	}
}

func TestE2ERapidReassignmentsConverge(t *testing.T) {
	client := adminClient(t)
	resetSim(t)
	t.Cleanup(func() { resetSim(t) })
	const n = 30
	for i := 0; i < n; i++ {
		createConfigMap(t, fmt.Sprintf("e2e-rapid-%d", i), map[string]string{"kubelet": simConfig(t, 60+i, "")})
	}
	for i := 0; i < n; i++ {
		setSource(t, client, simE2E, cmSource(fmt.Sprintf("e2e-rapid-%d", i)))
	}
	last := fmt.Sprintf("e2e-rapid-%d@%s", n-1, mustRV(t, fmt.Sprintf("e2e-rapid-%d", n-1)))
	waitNodeStatus(t, simE2E, last, last, "*", "", 2*time.Minute)
	// Settled: no further change.
	time.Sleep(2 * time.Second) // proves a negative: the status stays put meanwhile
	waitNodeStatus(t, simE2E, last, last, "*", "", time.Second)
}

// TestE2EMalformedConfigMaps: what a ConfigMap can hold wrong, and the documented outcome of each.
func TestE2EMalformedConfigMaps(t *testing.T) {
	client := adminClient(t)
	resetSim(t)
	t.Cleanup(func() { resetSim(t) })
	header := "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfailCgroupV1: false\n"
	for _, tc := range []struct {
		name, kubelet string
		extra         map[string]string
		binary        map[string][]byte
		wantErr       string // "" = applied
	}{
		{name: "e2e-mal-yaml", kubelet: "eventRecordQPS: [", wantErr: string(nodeconfig.LoadError)},
		{name: "e2e-mal-kind", kubelet: "apiVersion: v1\nkind: Pod\n", wantErr: string(nodeconfig.LoadError)},
		{name: "e2e-mal-apiversion", kubelet: "apiVersion: kubelet.config.k8s.io/v9\nkind: KubeletConfiguration\n", wantErr: string(nodeconfig.LoadError)},
		{name: "e2e-mal-unknown-fields", kubelet: header + "eventRecordQPS: 12\nfieldOfAFutureKubelet: true\n"},
		{name: "e2e-mal-big", kubelet: header + "eventRecordQPS: 13\n", extra: map[string]string{"ballast": strings.Repeat("x", 900<<10)}},
		{name: "e2e-mal-binary", kubelet: header + "eventRecordQPS: 14\n", binary: map[string][]byte{"blob": {0xff, 0x00, 0xfe}}},
	} {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: tc.name, Namespace: "kube-system"},
			Data: map[string]string{"kubelet": tc.kubelet}, BinaryData: tc.binary}
		for k, v := range tc.extra {
			cm.Data[k] = v
		}
		created, err := client.CoreV1().ConfigMaps("kube-system").Create(testContext(t), cm, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		t.Cleanup(func() {
			_ = client.CoreV1().ConfigMaps("kube-system").Delete(context.Background(), tc.name, metav1.DeleteOptions{})
		})
		setSource(t, client, simE2E, cmSource(tc.name))
		n := tc.name + "@" + created.ResourceVersion
		if tc.wantErr == "" {
			waitNodeStatus(t, simE2E, n, n, "*", "", time.Minute)
		} else {
			poll.ForNil(t, time.Minute, 300*time.Millisecond, fmt.Sprintf("%s: error %q and not active", tc.name, tc.wantErr), func() error {
				st := nodeStatus(t, simE2E)
				if srcName(st.Assigned) == n && st.Error == tc.wantErr && srcName(st.Active) != n {
					return nil
				}
				return fmt.Errorf("assigned=%s active=%s error=%q", srcName(st.Assigned), srcName(st.Active), st.Error)
			})
		}
	}
}
